"""Runs: a keyset-paginated list and one run's page (live lease, steps, events, cancel)."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect
from django.utils import timezone
from django.views.decorators.http import require_http_methods

from runtime import api
from runtime.agents import registry
from runtime.errors import RunNotFound, RunNotResumable
from runtime.models import TERMINAL_RUN_STATUSES, Run, RunStatus

from .forms import CancelRunForm
from .render import page

PAGE_SIZE = 50
EVENTS_SHOWN = 1000
CANCEL_PERMISSION = "runtime.cancel_run"
CANCELLABLE = (RunStatus.QUEUED, RunStatus.WAITING)


def known_agents() -> list[str]:
    """Agent names from settings (not a DISTINCT over the runs table, which grows without end)."""
    return sorted(registry.all())


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value not in (None, "") else None
    except ValueError:
        return None


@require_http_methods(["GET"])
def run_list(request: HttpRequest) -> HttpResponse:
    """Newest first, ``?before=<id>`` / ``?after=<id>`` keyset pages: the cost of a page does
    not grow with how far back it is (no OFFSET)."""
    status = request.GET.get("status", "")
    agent = request.GET.get("agent", "").strip()
    q = request.GET.get("q", "").strip()
    search_error, code = "", 200
    qs: QuerySet[Run] = Run.objects.all()
    if status not in ("", *RunStatus.values):
        # Never a silent "everything": the operator asked for something that does not exist.
        search_error = (f"There is no status {status[:40]!r}: choose one of "
                        f"{', '.join(RunStatus.values)}.")
        status, qs, code = "", qs.none(), 400
    elif status:
        qs = qs.filter(status=status)
    if agent:
        qs = qs.filter(agent=agent)
    if q:
        run_id = _int(q.removeprefix("#"))
        if run_id is None:
            search_error = "Search by run id: a number."
            qs = qs.none()
        else:
            qs = qs.filter(pk=run_id)
    before, after = _int(request.GET.get("before")), _int(request.GET.get("after"))
    if after is not None:
        # A page of newer runs: the PAGE_SIZE just above ``after``, then shown newest first.
        rows = list(qs.filter(pk__gt=after).order_by("id")[: PAGE_SIZE + 1])
        has_newer = len(rows) > PAGE_SIZE
        rows = rows[:PAGE_SIZE][::-1]
        has_older = True
    else:
        if before is not None:
            qs = qs.filter(pk__lt=before)
        rows = list(qs.order_by("-id")[: PAGE_SIZE + 1])
        has_older = len(rows) > PAGE_SIZE
        rows = rows[:PAGE_SIZE]
        has_newer = before is not None
    filters = request.GET.copy()
    for key in ("before", "after"):
        filters.pop(key, None)
    context = {
        "runs": rows,
        "status": status,
        "agent": agent,
        "q": q,
        "search_error": search_error,
        "statuses": RunStatus.choices,
        "agents": known_agents(),
        "filters": filters.urlencode(),
        "older": rows[-1].pk if rows and has_older else None,
        "newer": rows[0].pk if rows and has_newer else None,
        "now": timezone.now(),
    }
    return page(request, "console/runs.html", context, partial="run-list", status=code)


@require_http_methods(["GET", "POST"])
def run_detail(request: HttpRequest, pk: int) -> HttpResponse:
    """Everything about one run; htmx polls the live part (status, lease, totals)."""
    run = get_object_or_404(Run, pk=pk)
    form = CancelRunForm()
    message, status = "", 200
    if request.method == "POST":
        if not request.user.has_perm(CANCEL_PERMISSION):
            raise PermissionDenied("Cancelling runs needs the cancel_run permission.")
        form = CancelRunForm(request.POST)
        if not form.is_valid():
            status = 422
        else:
            try:
                api.cancel(run.pk, by=request.user.get_username(),
                           reason=form.cleaned_data["reason"])
            except (RunNotResumable, RunNotFound) as exc:
                message, status = f"Not cancelled: {exc}.", 409
            else:
                if not request.htmx:
                    return redirect("console:run", pk=run.pk)
                form = CancelRunForm()
            run.refresh_from_db()
    return page(request, "console/run.html", _context(request, run, form, message),
                partial="run-live", status=status)


def _context(request: HttpRequest, run: Run, form: CancelRunForm, message: str) -> dict[str, Any]:
    now = timezone.now()
    events = list(run.events.order_by("seq")[: EVENTS_SHOWN + 1])
    return {
        "run": run,
        "live": run.status not in TERMINAL_RUN_STATUSES,
        "lease_live": bool(run.lease_owner and run.lease_expires_at
                           and run.lease_expires_at > now),
        "steps": run.steps.order_by("index"),
        "approvals": run.approvals.select_related("step").order_by("created_at", "pk"),
        "events": events[:EVENTS_SHOWN],
        "more_events": len(events) > EVENTS_SHOWN,
        "can_cancel": (request.user.has_perm(CANCEL_PERMISSION)
                       and run.status in CANCELLABLE),
        "cancel_form": form,
        "message": message,
        "now": now,
    }
