"""This process's Prometheus counters and histograms: what only the process that did it knows
(how long its steps took, how many plans its group commits carried, which leases it lost or
took over). A worker serves them on ``runworker --metrics-port``; what every process shares
is read from the database at scrape time instead (``runtime.metrics``).

Low in the layers, importing prometheus_client alone, so storage, the loop and the worker can
observe into these objects where the fact happens: each observation is a lock and an add,
never a query. They live in prometheus_client's default registry, the one its HTTP server
serves.
"""

from __future__ import annotations

from prometheus_client import Counter, Histogram, disable_created_metrics

PREFIX = "agent_runtime_"

# No ``*_created`` series (the time each counter was made): they double what a scrape carries
# and no rule or panel reads them.
disable_created_metrics()

STEP_SECONDS = Histogram(
    f"{PREFIX}step_seconds",
    "Seconds from a step's start (the commit that began it) to its tool's outcome, by the "
    "run's clock: deciding, any approval wait and the tool call, for the steps this process "
    "ran a tool for.",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800,
             3600, 86400))

GROUP_COMMIT_PLANS = Histogram(
    f"{PREFIX}group_commit_plans",
    "Plans written by each of this process's SQLite group commits (one transaction, one "
    "sync); PostgreSQL commits each plan alone and observes nothing here.",
    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512))

LEASE_LOST_STOPS = Counter(
    f"{PREFIX}worker_lease_lost_stops",
    "Runs this worker stopped executing because their lease was lost (taken over, or "
    "expired while it could not renew): the worker logs each as 'stopped'.")

TAKEOVERS = Counter(
    f"{PREFIX}worker_takeovers",
    "Runs whose lease this worker took over from another owner (expired, or its owner "
    "proved dead).")
