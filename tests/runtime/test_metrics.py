"""Metrics for Prometheus (runtime.metrics, runtime.meters): the console's ``/metrics`` read
from the database at scrape time after a scripted scenario on both engines, and a real worker
process's own counters and histograms on ``runworker --metrics-port``. Every scrape is parsed
by prometheus_client's own text parser; expected values come from the scenario's clock and
the steps it took, never from the tables the collector reads."""

from __future__ import annotations

import io
import json
import re
import socket
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
import yaml
from django.core.management import call_command
from django.test import Client
from prometheus_client import REGISTRY, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from runtime import Agent, Allow, FinalAnswer, RequireApproval, ScriptedLLM, ToolCall, resume, start
from runtime.agents.agent import registry
from runtime.approvals.decisions import approve, reject, resolve
from runtime.approvals.expiry import approvals_expire
from runtime.crashpoints import CrashPoint
from runtime.loop.control import cancel
from runtime.loop.driver import Driver
from runtime.metrics import database_metrics_text
from runtime.models import Approval, Run
from runtime.models import Worker as WorkerRow
from runtime.notifications.delivery import outbox_deliver_due
from tests import agents
from tests.kit import Ledger, crash_then_take_over, make_tools
from tests.waiting import wait_until

pytestmark = pytest.mark.engines

TOKEN = "s3cret-metrics-token-0123456789"
Samples = dict[tuple[str, frozenset], float]


def parse(text: str) -> Samples:
    """Every sample of a scrape, by name and labels, as Prometheus would read it."""
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples: Samples, name: str, **labels: str) -> float:
    key = (name, frozenset(labels.items()))
    assert key in samples, f"{name}{labels} missing from the scrape"
    return samples[key]


def _policy(request, run):
    """Charges of 100 or more need a person; 666 has a one-minute deadline."""
    amount = request.arguments.get("amount", 0)
    if request.tool == "charge" and amount >= 100:
        return RequireApproval(f"Charge {amount}?", expires_in=60 if amount == 666 else None)
    return Allow()


def _script(transcript):
    if transcript.entries:
        return FinalAnswer("done")
    return ToolCall("charge", {"amount": transcript.input["amount"]})


@pytest.fixture
def scenario_agent(tmp_path) -> Iterator[None]:
    agent = Agent("mx", ScriptedLLM(_script), make_tools(Ledger(tmp_path / "ledger")),
                  policy=_policy)
    with registry.override(agent):
        yield


def _paused(amount: int, clock) -> Approval:
    run = resume(start("mx", {"amount": amount}, clock=clock).pk, clock=clock, lease_seconds=5)
    assert run.status == "waiting"
    return Approval.objects.get(run_id=run.pk, status="pending")


def _approve_reject_expire(clock) -> None:
    """Approved after 30 s (its call then runs: consumed), rejected after 500 s, expired."""
    approved = _paused(300, clock)
    clock.advance(30)
    approve(approved.pk, "ana", now=clock.now())
    assert resume(approved.run_id, clock=clock).status == "succeeded"
    rejected = _paused(400, clock)
    clock.advance(500)
    reject(rejected.pk, "ana", "too much", now=clock.now())
    _paused(666, clock)
    clock.advance(61)
    assert len(approvals_expire(clock.now())) == 1


def _scrape(client: Client, token: str = TOKEN) -> Samples:
    response = client.get("/metrics", headers={"Authorization": f"Bearer {token}"})
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain; version=0.0.4")
    return parse(response.content.decode())


def test_the_console_scrape_reads_every_shared_number_from_the_database(
        database, settings, monkeypatch, clock, crash, scenario_agent):
    from console import metrics as view

    settings.RUNTIME = {**settings.RUNTIME, "METRICS_TOKEN": TOKEN, "NOTIFY": [
        {"name": "ops", "kind": "webhook", "target": "http://127.0.0.1:9/nothing-listens"}]}
    monkeypatch.setattr(view, "clock", clock)
    began = clock.now()

    # Two policy approvals left pending, 100 s apart.
    _paused(100, clock)
    clock.advance(100)
    _paused(200, clock)
    clock.advance(10)
    _approve_reject_expire(clock)
    # Two charges interrupted by a crash and taken over: one left pending, one resolved.
    interrupted = crash_then_take_over(start("mx", {"amount": 5}, clock=clock).pk, clock, crash,
                                       CrashPoint.AFTER_TOOL_EFFECT, 1)
    waiting_since = Approval.objects.get(run_id=interrupted.pk).created_at
    resolved_run = crash_then_take_over(start("mx", {"amount": 7}, clock=clock).pk, clock, crash,
                                        CrashPoint.AFTER_TOOL_EFFECT, 1)
    to_resolve = Approval.objects.get(run_id=resolved_run.pk)
    clock.advance(42)
    resolve(to_resolve.pk, "ana", {"charged": 7}, now=clock.now())
    assert resume(resolved_run.pk, clock=clock).status == "succeeded"
    # One run queued, one cancelled.
    start("mx", {"amount": 1}, clock=clock)
    cancel(start("mx", {"amount": 2}, clock=clock).pk, "ana", clock=clock)
    # A worker whose heartbeat is past its lease, and a live one.
    for owner, lease, after in (("gone@host:1", 5.0, 100), ("live@host:2", 30.0, 1)):
        WorkerRow.objects.create(owner=owner, host="host", pid=1, lease_seconds=lease,
                                 started_at=clock.now(), heartbeat_at=clock.now())
        clock.advance(after)
    # Every notification (one per approval requested) tried once against a closed port.
    assert outbox_deliver_due(clock) == 0
    clock.advance(15)
    now = clock.now()

    got = _scrape(Client())

    assert value(got, "agent_runtime_approvals_pending", kind="policy") == 2
    assert value(got, "agent_runtime_approvals_pending", kind="interrupted_side_effect") == 1
    assert value(got, "agent_runtime_approvals_pending", kind="reconcile") == 0
    assert value(got, "agent_runtime_approval_oldest_pending_age_seconds",
                 kind="policy") == (now - began).total_seconds()
    assert value(got, "agent_runtime_approval_oldest_pending_age_seconds",
                 kind="interrupted_side_effect") == (now - waiting_since).total_seconds()
    assert value(got, "agent_runtime_approval_oldest_pending_age_seconds", kind="reconcile") == 0

    for decision, seconds in (("approve", 30), ("reject", 500), ("resolve", 42)):
        assert value(got, "agent_runtime_approval_decisions_total", decision=decision) == 1
        assert value(got, "agent_runtime_approval_decision_seconds_count",
                     decision=decision) == 1
        assert value(got, "agent_runtime_approval_decision_seconds_sum",
                     decision=decision) == seconds
        assert value(got, "agent_runtime_approval_decision_seconds_bucket", decision=decision,
                     le="10.0") == 0
        assert value(got, "agent_runtime_approval_decision_seconds_bucket", decision=decision,
                     le="900.0") == 1
    assert value(got, "agent_runtime_approval_decision_seconds_bucket", decision="reject",
                 le="300.0") == 0
    assert value(got, "agent_runtime_approval_decision_seconds_bucket", decision="approve",
                 le="60.0") == 1
    assert value(got, "agent_runtime_approval_expiries_total", kind="policy") == 1
    assert value(got, "agent_runtime_approval_expiries_total", kind="reconcile") == 0

    expected_runs = {"queued": 1, "running": 0, "waiting": 3, "succeeded": 2, "failed": 2,
                     "cancelled": 1}
    for status, n in expected_runs.items():
        assert value(got, "agent_runtime_runs", status=status) == n
    assert sum(v for (name, _), v in got.items() if name == "agent_runtime_runs") == \
        Run.objects.count() == 9

    assert value(got, "agent_runtime_workers_live") == 1
    assert value(got, "agent_runtime_lease_takeovers_total") == 2

    assert value(got, "agent_runtime_notifications_undelivered") == 7
    assert value(got, "agent_runtime_notification_oldest_undelivered_age_seconds") == \
        (now - began).total_seconds()
    assert value(got, "agent_runtime_notification_attempts_failed_total") == 7
    assert value(got, "agent_runtime_notifications_given_up") == 0


def test_an_empty_database_scrapes_zeros_not_missing_series(database, settings):
    """Alerts need series that exist at 0: nothing pending still says so."""
    settings.RUNTIME = {**settings.RUNTIME, "METRICS_TOKEN": TOKEN}
    got = _scrape(Client())
    assert value(got, "agent_runtime_approvals_pending", kind="policy") == 0
    assert value(got, "agent_runtime_approval_oldest_pending_age_seconds", kind="policy") == 0
    assert value(got, "agent_runtime_approval_decision_seconds_bucket", decision="approve",
                 le="+Inf") == 0
    assert value(got, "agent_runtime_runs", status="queued") == 0
    assert value(got, "agent_runtime_workers_live") == 0
    assert value(got, "agent_runtime_notification_oldest_undelivered_age_seconds") == 0
    # The console's own process metrics stay out: every console process answers the same.
    assert not any(name.startswith(("process_", "python_")) for name, _ in got)


# -- a worker's own metrics --------------------------------------------------------------------


def _worker_metrics_url(worker) -> str:
    found = wait_until(lambda: re.search(r"metrics of this process on (http://\S+/metrics)",
                                         worker.output()),
                       what="the worker to log its metrics address")
    return found.group(1)


def _worker_scrape(url: str) -> Samples:
    return parse(httpx.get(url, timeout=5).text)


@pytest.mark.slow
def test_a_worker_serves_its_own_step_latency_group_commits_takeovers_and_lease_losses(
        database, tmp_path, spawn):
    with registry.override(*agents.AGENTS):
        # A run whose owner stopped heartbeating: its one-second lease lapses under the worker.
        orphan = start("steps5", {})
        Driver("ghost@elsewhere:1", lease_seconds=1).acquire(orphan.pk)
        slow = start("slow", {})
    worker = spawn("--concurrency", "2", "--poll-interval", "0.1", "--lease-seconds", "30",
                   "--metrics-port", "0")
    url = _worker_metrics_url(worker)
    assert url.startswith("http://127.0.0.1:")  # loopback unless told otherwise
    wait_until(lambda: (tmp_path / f"entered-slow_read-{slow.pk}-1").exists(),
               what="the slow tool to start")
    # Someone else takes the slow run's lease while its tool is in flight (a false proof of
    # death): the worker's commit after the tool is refused and it stops executing the run.
    with registry.override(*agents.AGENTS):
        Driver("heir@elsewhere:2", lease_seconds=300,
               owner_is_dead=lambda run: True).acquire(slow.pk)
    (tmp_path / "release-slow_read").touch()

    def settled() -> Samples | None:
        got = _worker_scrape(url)
        done = got.get(("agent_runtime_worker_lease_lost_stops_total", frozenset()), 0) == 1 \
            and Run.objects.get(pk=orphan.pk).status == "succeeded"
        return got if done else None

    got = wait_until(settled, what="the takeover to finish and the lost lease to stop")
    assert value(got, "agent_runtime_worker_takeovers_total") == 1
    assert value(got, "agent_runtime_worker_lease_lost_stops_total") == 1
    # Five noop steps of the orphan, and the slow read whose outcome was refused.
    assert value(got, "agent_runtime_step_seconds_count") == 6
    assert value(got, "agent_runtime_step_seconds_bucket", le="+Inf") == 6
    assert value(got, "agent_runtime_step_seconds_sum") > 0
    groups = value(got, "agent_runtime_group_commit_plans_count")
    if database.is_sqlite:
        assert groups > 0
        assert value(got, "agent_runtime_group_commit_plans_sum") >= groups
    else:
        assert groups == 0  # PostgreSQL commits each plan alone
    assert "process_cpu_seconds_total" in {name for name, _ in got}
    assert "owner=worker@" in worker.output() and " stopped: " in worker.output()


def test_a_worker_refuses_a_metrics_port_it_cannot_bind(database, tmp_path, spawn):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        worker = spawn("--metrics-port", str(port))
        assert worker.wait() == 1
    assert f"--metrics-port {port} on 127.0.0.1:" in worker.output()


def test_decision_latency_buckets_are_cumulative(database, clock, scenario_agent, settings):
    """Each bucket counts the decisions at or under its bound: a decision after 2 hours is in
    4 h and above, not in 1 h."""
    settings.RUNTIME = {**settings.RUNTIME, "METRICS_TOKEN": TOKEN}
    waiting = _paused(100, clock)
    clock.advance(timedelta(hours=2).total_seconds())
    approve(waiting.pk, "ana", now=clock.now())
    got = _scrape(Client())
    buckets = {labels["le"]: v for (name, key), v in got.items()
               if name == "agent_runtime_approval_decision_seconds_bucket"
               and (labels := dict(key))["decision"] == "approve"}
    assert buckets["3600.0"] == 0 and buckets["14400.0"] == 1 and buckets["+Inf"] == 1
    assert value(got, "agent_runtime_approvals_pending", kind="policy") == 0
    assert value(got, "agent_runtime_runs", status="queued") == 1


# -- the docs: every metric explained, the alert rules and the dashboard name real ones -------

DOCS = Path(__file__).resolve().parents[2] / "docs" / "operations"


def _exposed(database_text: str) -> tuple[set[str], set[str]]:
    """The families and the sample names a console and a worker expose."""
    families, samples = set(), set()
    for text in (database_text, generate_latest(REGISTRY).decode()):
        for family in text_string_to_metric_families(text):
            if family.name.startswith("agent_runtime_"):
                families.add(family.name)
                samples |= {s.name for s in family.samples}
    return families, samples


def test_the_monitoring_page_explains_every_metric_and_its_rules_and_dashboard_use_real_ones(
        database):
    families, samples = _exposed(database_metrics_text().decode())
    assert len(families) == 16
    page = (DOCS / "monitoring.md").read_text()
    unexplained = {f for f in families if f"`{f}`" not in page and f"`{f}_total`" not in page}
    assert unexplained == set()

    rules = yaml.safe_load((DOCS / "alerts.yml").read_text())["groups"][0]["rules"]
    dashboard = json.loads((DOCS / "grafana-dashboard.json").read_text())
    exprs = [r["expr"] for r in rules] + [t["expr"] for p in dashboard["panels"]
                                          for t in p.get("targets", [])]
    named = {name for expr in exprs for name in re.findall(r"agent_runtime_\w+", expr)}
    assert named - samples == set()
    # The alerts the issue asks for: no live worker, an old approval, the outbox failing.
    by_name = {r["alert"]: r for r in rules}
    assert "agent_runtime_workers_live" in by_name["AgentRuntimeNoLiveWorker"]["expr"]
    assert by_name["AgentRuntimeNoLiveWorker"]["for"] == "2m"
    assert "oldest_pending_age" in by_name["AgentRuntimeApprovalWaiting"]["expr"]
    assert "attempts_failed" in by_name["AgentRuntimeNotificationsFailing"]["expr"]
    for rule in rules:
        assert rule["labels"]["severity"] in ("page", "warn") and rule["annotations"]["summary"]


def test_totals_read_from_the_tables_do_not_fall_when_old_runs_are_pruned(
        database, settings, monkeypatch, clock, crash, scenario_agent, tmp_path):
    """Prometheus takes a counter that falls for a reset and counts the whole total again as
    an increase: a prune must leave every total where it was."""
    from console import metrics as view

    settings.RUNTIME = {**settings.RUNTIME, "METRICS_TOKEN": TOKEN, "AUDIT_KEY": "k" * 40}
    monkeypatch.setattr(view, "clock", clock)
    _approve_reject_expire(clock)
    taken = crash_then_take_over(start("mx", {"amount": 7}, clock=clock).pk, clock, crash,
                                 CrashPoint.AFTER_TOOL_EFFECT, 1)
    resolve(Approval.objects.get(run_id=taken.pk).pk, "ana", {"charged": 7}, now=clock.now())
    assert resume(taken.pk, clock=clock).status == "succeeded"
    names = ("agent_runtime_approval_decisions_total", "agent_runtime_approval_expiries_total",
             "agent_runtime_lease_takeovers_total", "agent_runtime_approval_decision_seconds_sum",
             "agent_runtime_approval_decision_seconds_bucket",
             "agent_runtime_approval_decision_seconds_count")
    before = {k: v for k, v in _scrape(Client()).items() if k[0] in names}
    assert before[("agent_runtime_lease_takeovers_total", frozenset())] >= 1
    call_command("prune", "--finished-before", (clock.now() + timedelta(days=1)).isoformat(),
                 "--archive", str(tmp_path / "archive"), stdout=io.StringIO())
    assert not Run.objects.filter(status__in=["succeeded", "failed"]).exists()  # pruned
    after = {k: v for k, v in _scrape(Client()).items() if k[0] in names}
    assert after == before
