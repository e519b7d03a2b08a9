"""The pages and their timings: which console and admin pages are asked for, how one is timed,
and ``measure``, the section's entry point (build the data set, count it, time every page)."""

from __future__ import annotations

import math
import os
import platform
import sqlite3
import statistics
import time
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.signals import got_request_exception
from django.db import connection, connections
from django.test import Client
from django.test.utils import CaptureQueriesContext, override_settings
from django.urls import reverse

from runtime.admin.pages import ReadOnlyAdmin
from runtime.benchkit.pages.builder import Builder
from runtime.benchkit.pages.stories import Sizes
from runtime.models import Approval, Event, Run, Step, Worker

TARGET_MS = 150.0
ADMIN_USER = "bench-admin"
FILTER_ACTOR = "alice"
FILTER_KIND = "approval.requested"  # a rare kind (about 1 event in 80)
DEEP_KIND = "step.started"  # a common one (about 1 in 9), for a deep page
DEEP_PAGE = 300


# -- the pages ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Page:
    group: str
    label: str
    path: str
    htmx: bool = False


def pages(built: dict[str, Any]) -> list[Page]:
    """Every page measured, with the ids found in the data set."""
    long_run, short = built["long_run"], built["short_run"]
    per_page = ReadOnlyAdmin.list_per_page
    # Page 300 (rows 14,951-15,000: past the 10,000 rows the admin counts), or the last.
    deep = max(1, min(DEEP_PAGE, math.ceil(built["event_kinds"].get(DEEP_KIND, 0) / per_page)))
    c = [
        Page("console", "queue", reverse("console:queue")),
        Page("console", "queue, htmx poll", reverse("console:queue"), htmx=True),
        Page("console", "queue, ?kind=policy", reverse("console:queue") + "?kind=policy"),
        Page("console", "queue, ?kind=interrupted_side_effect",
             reverse("console:queue") + "?kind=interrupted_side_effect"),
        Page("console", "pending count, htmx", reverse("console:pending-count"), htmx=True),
    ]
    for name, label in (("pending_interrupted", "approval: pending interrupted_side_effect"),
                        ("decided_policy", "approval: decided policy (short run)"),
                        ("decided_policy_long", "approval: decided policy, long run step "
                         f"{built.get('decided_policy_long_step', 0):,}")):
        path = reverse("console:approval", args=[built[name]])
        c += [Page("console", label, path), Page("console", label + ", htmx poll", path, True)]
    run = reverse("console:run", args=[long_run])
    runs = reverse("console:runs")
    c += [
        Page("console", "runs", runs),
        Page("console", "runs, ?status=failed", runs + "?status=failed"),
        Page("console", "runs, ?before=<middle id>", runs + f"?before={built['runs'] // 2}"),
        Page("console", f"run: {built['long_run_steps']:,} steps", run),
        Page("console", f"run: {built['long_run_steps']:,} steps, htmx poll", run, True),
        Page("console", f"run: {built['short_run_steps']} steps",
             reverse("console:run", args=[short])),
        Page("console", "workers", reverse("console:workers")),
    ]
    events = reverse("admin:runtime_event_changelist")
    a = [
        Page("admin", "events", events),
        Page("admin", f"events, ?kind={FILTER_KIND}", events + f"?kind={FILTER_KIND}"),
        Page("admin", f"events, ?actor={FILTER_ACTOR}", events + f"?actor={FILTER_ACTOR}"),
        Page("admin", "events of the long run", events + f"?run__id__exact={long_run}"),
        Page("admin", f"events, ?kind={DEEP_KIND}, page {deep}",
             events + f"?kind={DEEP_KIND}&p={deep}"),
        Page("admin", "event", reverse("admin:runtime_event_change",
                                       args=[built["event_detail"]])),
        Page("admin", "runs", reverse("admin:runtime_run_changelist")),
        Page("admin", "approvals, ?status=pending",
             reverse("admin:runtime_approval_changelist") + "?status=pending"),
        Page("admin", "steps", reverse("admin:runtime_step_changelist")),
    ]
    return c + a


def _percentile(values: list[float], pct: float) -> float:
    """Nearest rank: the smallest value with ``pct`` percent of the values at or below it."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(pct / 100 * len(ordered)) - 1)]


class _Errors:
    """Exceptions raised by a view (the test client answers 500 instead of raising)."""

    def __init__(self) -> None:
        self.last = ""
        got_request_exception.connect(self.note)

    def note(self, sender: Any = None, request: Any = None, **kwargs: Any) -> None:
        self.last = traceback.format_exc(limit=-3).strip().splitlines()[-1]

    def close(self) -> None:
        got_request_exception.disconnect(self.note)


def time_page(client: Client, page: Page, reps: int, errors: _Errors,
              before: Callable[[], None]) -> dict[str, Any]:
    """One request counted (queries, size, status), then ``reps`` timed, each on a fresh
    connection (opened inside the timing, as a request opens its own): wall-clock time, and
    this thread's CPU time beside it (what a busy neighbour does not inflate), and the time
    the counted request's queries took."""
    headers = {"HX-Request": "true", "HX-Current-URL": f"http://testserver{page.path}"} \
        if page.htmx else {}
    before()
    connections.close_all()
    errors.last = ""
    sql: list[float] = []

    def timed(execute: Callable, query: str, params: Any, many: bool, context: Any) -> Any:
        start = time.perf_counter()
        try:
            return execute(query, params, many, context)
        finally:
            sql.append(time.perf_counter() - start)

    with CaptureQueriesContext(connection) as queries, connection.execute_wrapper(timed):
        response = client.get(page.path, headers=headers)
    captured = queries.captured_queries  # now: the next request resets the log
    sql_ms = 1000 * sum(sql)
    status = response.status_code
    answer = str(status)
    if 300 <= status < 400:
        answer = f"{status} → {response.get('Location', '?')}"
    elif status >= 400 and errors.last:
        answer = f"{status} ({errors.last[:120]})"
    times, cpu = [], []
    for _ in range(reps):
        connections.close_all()
        start, start_cpu = time.perf_counter(), time.thread_time()
        r = client.get(page.path, headers=headers)
        times.append(1000 * (time.perf_counter() - start))
        cpu.append(1000 * (time.thread_time() - start_cpu))
        if r.status_code != status:
            answer += f"; then {r.status_code}"
    connections.close_all()
    p95 = _percentile(times, 95)
    return {"group": page.group, "page": page.label, "path": page.path, "htmx": page.htmx,
            "status": status, "answer": answer, "p50_ms": statistics.median(times),
            "p95_ms": p95, "min_ms": min(times), "max_ms": max(times), "reps": reps,
            "cpu_p50_ms": statistics.median(cpu),
            "queries": len(captured), "sql_ms": sql_ms, "bytes": len(response.content),
            "over_target": p95 > TARGET_MS}


def _static_settings() -> dict[str, Any]:
    """The manifest storage needs ``collectstatic``'s manifest; without one, plain URLs."""
    if (Path(settings.STATIC_ROOT) / "staticfiles.json").exists():
        return {}
    return {"STORAGES": {**settings.STORAGES, "staticfiles": {
        "BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"}}}


def measure_pages(built: dict[str, Any], reps: int, live_owners: list[str],
                  progress: Callable[[str], None]) -> list[dict[str, Any]]:
    user_model = get_user_model()
    user = user_model.objects.create_superuser(ADMIN_USER, f"{ADMIN_USER}@example.com", None)
    client = Client(raise_request_exception=False)
    client.force_login(user)
    errors = _Errors()

    def heartbeat() -> None:  # the live workers' heartbeat, as theirs would keep it fresh
        Worker.objects.filter(owner__in=live_owners).update(heartbeat_at=datetime.now(UTC))

    hosts = [*settings.ALLOWED_HOSTS, "testserver"]
    out = []
    try:
        with override_settings(ALLOWED_HOSTS=hosts, **_static_settings()), \
                warnings.catch_warnings():
            warnings.filterwarnings("ignore", "No directory at", UserWarning)  # whitenoise's
            for page in pages(built):
                progress(f"page {page.group}: {page.label}")
                out.append(time_page(client, page, reps, errors, heartbeat))
    finally:
        errors.close()
    return out


def counted(long_run: int) -> dict[str, int]:
    """The data set as the database holds it (not as the builder meant it)."""
    return {
        "runs": Run.objects.count(), "steps": Step.objects.count(),
        "events": Event.objects.count(), "approvals": Approval.objects.count(),
        "pending": Approval.objects.filter(status="pending").count(),
        "workers": Worker.objects.count(),
        "long_run_steps": Step.objects.filter(run_id=long_run).count(),
        "long_run_events": Event.objects.filter(run_id=long_run).count(),
    }


def measure(loader: Any, sizes: Sizes, quick: bool,
            progress: Callable[[str], None]) -> dict[str, Any]:
    """Build the data set with ``loader`` into the database Django's default connection is
    pointed at (fresh and migrated), then time the pages."""
    connections.close_all()
    load = os.getloadavg()[0]
    progress("console: building the data set")
    start = time.perf_counter()
    now = datetime.now(UTC).replace(microsecond=0)
    builder = Builder(loader, sizes, now)
    try:
        built = builder.build(lambda s: progress(f"console: built {s}"))
    finally:
        loader.close()
    build_seconds = time.perf_counter() - start
    built["event_detail"] = _event_detail(built)
    progress("console: counting what the database holds")
    db = counted(built["long_run"])
    progress("console: timing the pages")
    start = time.perf_counter()
    timed = measure_pages(built, sizes.reps, builder.owners.live, progress)
    over = [p for p in timed if p["over_target"]]
    bad = [p for p in timed if p["status"] != 200]
    figure = (f"{len(timed) - len(over)} of {len(timed)} pages; slowest p95 "
              f"{max(p['p95_ms'] for p in timed):.0f} ms ("
              f"{max(timed, key=lambda p: p['p95_ms'])['page']})")
    return {
        "section": "console", "quick": quick, "engine": loader.engine,
        "machine": {"sqlite": sqlite3.sqlite_version, "python": platform.python_version(),
                    "cpus": os.cpu_count() or 1, "database": str(getattr(loader, "path", "")),
                    "load_before": load, "load_after": os.getloadavg()[0]},
        "sizes": {"runs": sizes.runs, "pending": sizes.pending, "events": sizes.events,
                  "long_run_steps": sizes.long_steps, "reps": sizes.reps},
        "built": built, "counted": db, "build_seconds": build_seconds,
        "database_mib": loader.size_bytes() / 2**20, "pages_seconds": time.perf_counter() - start,
        "target_ms": TARGET_MS, "pages": timed,
        "targets": [
            {"target": f"every page p95 < {TARGET_MS:.0f} ms", "met": not over,
             "figure": figure},
            {"target": "every page answers 200", "met": not bad,
             "figure": "yes" if not bad else "; ".join(f"{p['page']}: {p['answer']}"
                                                       for p in bad)},
        ],
    }


def _event_detail(built: dict[str, Any]) -> int:
    """A lookup's ``step.tool_finished`` (an order, one of the larger payloads) of the short
    run, for the admin's event page."""
    return Event.objects.filter(run_id=built["short_run"], kind="step.tool_finished") \
        .order_by("seq").values_list("pk", flat=True)[0]

