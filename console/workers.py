"""Worker processes: the live ones and those that died recently on one tab, older dead ones on
another, and what each holds.

Dead rows pile up (every killed or restarted process leaves one), so every query here is
bounded: both tabs filter and cap in SQL, and a table of 10,000 dead workers costs a page what
ten do.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, TypedDict

from django.conf import settings
from django.db.models import Count, F, Q, QuerySet, Value
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from django.views.decorators.http import require_http_methods

from console.permissions import viewing
from console.render import page
from runtime.models import Run, RunStatus, Worker
from runtime.selectors import worker_live

# The tabs, by their ``?show=`` value: live and recently dead (the default), dead longer ago.
SHOW_CHOICES = ("", "old")
SHOWN = 200  # rows at most on either tab, newest heartbeat first
RECENT_DEAD_DEFAULT_SECONDS = 3600.0


def recent_window() -> timedelta:
    """How long a dead worker stays on the first tab: long enough to see what just crashed,
    short enough that restarts do not bury the live ones."""
    return timedelta(seconds=float(getattr(settings, "CONSOLE_RECENT_DEAD_WORKERS_SECONDS",
                                           RECENT_DEAD_DEFAULT_SECONDS)))


class _Row(TypedDict):
    """A worker as the list shows it."""

    worker: Worker
    live: bool
    heartbeat_age: timedelta
    runs_held: int


def _runs_held(owners: list[str]) -> dict[str, int]:
    """Running runs per lease owner, for the workers shown only."""
    return dict(
        Run.objects.filter(status=RunStatus.RUNNING, lease_owner__in=owners)
        .values_list("lease_owner").annotate(n=Count("id")).order_by())


@viewing
@require_http_methods(["GET"])
def worker_list(request: HttpRequest) -> HttpResponse:
    """``/workers/``: live workers and those whose last heartbeat is within the recent window;
    ``?show=old``: the dead ones older than that, newest first, at most ``SHOWN``."""
    show = request.GET.get("show", "")
    now = timezone.now()
    window = recent_window()
    cutoff = now - window
    workers: QuerySet[Worker] = Worker.objects.alias(live=worker_live(now))
    # Live past the cutoff needs a lease longer than the window: saying so first lets the
    # database skip the lease arithmetic (per-row functions on SQLite) for nearly every row.
    live_past_cutoff = Q(lease_seconds__gt=window.total_seconds()) & Q(live=True)
    recent = workers.filter(Q(heartbeat_at__gte=cutoff) | live_past_cutoff)
    old = workers.filter(Q(heartbeat_at__lt=cutoff) & ~live_past_cutoff)
    error, status = "", 200
    if show not in SHOW_CHOICES:
        # Never a silent default: the operator asked for a list that does not exist.
        error = (f"There is no list {show[:40]!r} of workers: leave show out for the live and "
                 f"recently dead ones, or choose show=old for those dead longer ago.")
        show, shown, status = "", [], 400
    elif show == "old":
        # Dead by the tab's own filter: nothing more to judge, row by row.
        shown = list(old.annotate(is_live=Value(False)).order_by("-heartbeat_at", "-pk")
                     [: SHOWN + 1])
    else:
        # Live ones first, so the cap can only ever cut dead ones.
        shown = list(recent.annotate(is_live=F("live"))
                     .order_by("-is_live", "-heartbeat_at", "-pk")[: SHOWN + 1])
    capped = len(shown) > SHOWN
    shown = shown[:SHOWN]
    held = _runs_held([w.owner for w in shown]) if shown else {}
    rows: list[_Row] = [{"worker": w, "live": bool(w.is_live),
                         "heartbeat_age": now - w.heartbeat_at,
                         "runs_held": held.get(w.owner, 0)} for w in shown]
    # Live ones by host and age (a stable list to read); dead ones as they died, newest first.
    live_rows = sorted((r for r in rows if r["live"]),
                       key=lambda r: (r["worker"].host, r["worker"].started_at))
    rows = live_rows + [r for r in rows if not r["live"]]
    # The old tab's own rows are its count unless capped (one COUNT fewer per poll).
    old_count = len(rows) if show == "old" and not capped else old.count()
    context: dict[str, Any] = {
        "show": show,
        "error": error,
        "rows": rows,
        "live_count": len(live_rows),
        "dead_count": len(rows) - len(live_rows),
        "total": (old_count if show == "old" else recent.count()) if capped else len(rows),
        "capped": capped,
        "shown_max": SHOWN,
        "old_count": old_count,
        "window": window,
        "now": now,
    }
    return page(request, "console/workers.html", context, partial="worker-list", status=status)
