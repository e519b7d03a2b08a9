"""Runs: a keyset-paginated list and one run's page (live lease, steps, events, cancel); both say
when a run waits for a worker and no live worker has its agent."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_http_methods

from console.forms import CancelRunForm
from console.permissions import CANCEL as CANCEL_PERMISSION
from console.permissions import viewing
from console.render import no_change, page, unchanged
from runtime import selectors
from runtime.agents.agent import registry
from runtime.errors import RunNotFound, RunNotResumable
from runtime.loop import control as api
from runtime.models import Run, RunStatus

if TYPE_CHECKING:
    from runtime.selectors.runs import RunForPage

PAGE_SIZE = 50
STEPS_SHOWN = 50  # a run's page shows its latest steps and events; the rest a click away
EVENTS_SHOWN = 50
RUN_LIST_FIELDS = ("id", "agent", "status", "failure_code", "lease_owner", "llm_requests", "cost",
                   "created_at", "updated_at")


def known_agents() -> list[str]:
    """Agent names from settings (not a DISTINCT over the runs table, which grows without end)."""
    return sorted(registry.all())


def agent_note(agent: str) -> str:
    """A filter on an agent no longer configured still filters (its runs stay recorded), and
    says so rather than looking like a typo that matched nothing."""
    if not agent or agent in registry.all():
        return ""
    return (f"No agent named {agent[:60]!r} is configured now (configured: "
            f"{', '.join(known_agents()) or 'none'}); showing what was recorded under that name.")


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value else None
    except ValueError:
        return None


@viewing
@require_http_methods(["GET"])
def run_list(request: HttpRequest) -> HttpResponse:
    """Newest first, ``?before=<id>`` / ``?after=<id>`` keyset pages: the cost of a page does
    not grow with how far back it is (no OFFSET)."""
    status = request.GET.get("status", "")
    agent = request.GET.get("agent", "").strip()[:200]
    q = request.GET.get("q", "").strip()[:40]
    search_error, code = "", 200
    # Each with whether its lease holds: a run waiting for a worker whose agent no live worker
    # has gets a note beside its status.
    qs: QuerySet[RunForPage] = selectors.with_lease_state(Run.objects.only(*RUN_LIST_FIELDS))
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
    now = timezone.now()
    context = {
        "runs": rows,
        "no_worker": selectors.runs_without_worker(rows, now),
        "status": status,
        "agent": agent,
        "q": q,
        "search_error": search_error,
        "statuses": RunStatus.choices,
        "agents": known_agents(),
        "agent_note": agent_note(agent),
        "filters": filters.urlencode(),
        "run_base": reverse("console:run", args=[0]).removesuffix("0/"),
        "older": rows[-1].pk if rows and has_older else None,
        "newer": rows[0].pk if rows and has_newer else None,
        "now": now,
    }
    return page(request, "console/runs.html", context, partial="run-list", status=code)


@viewing
@require_http_methods(["GET", "POST"])
def run_detail(request: HttpRequest, pk: int) -> HttpResponse:
    """One run: its live state, its latest steps and events (``?steps_before=N`` pages back
    through the steps), its approvals, and cancel. An open page polls with the version it
    shows and is re-rendered only when the run changed."""
    run = selectors.run_for_page(pk)
    if run is None:
        raise Http404("No such run.")
    no_worker = _no_worker(run)
    steps_before = _int(request.GET.get("steps_before"))
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
                return redirect("console:run", pk=run.pk)
            run = selectors.run_for_page(pk) or run
            no_worker = _no_worker(run)
    elif unchanged(request, _version(run, no_worker)):
        return no_change()
    return page(request, "console/run.html",
                _context(request, run, no_worker, form, message, steps_before),
                partial="run-live", status=status)


def _no_worker(run: RunForPage) -> str:
    """The run's agent if the run waits for a worker and no live worker has that agent, else
    ""."""
    return selectors.runs_without_worker([run], timezone.now()).get(run.pk, "")


def _version(run: RunForPage, no_worker: str) -> str:
    """The run's own version, whether its lease holds and whether a live worker can run it:
    a lease can lapse (a worker died) and the last worker with its agent can stop without the
    run changing, and the page must say so."""
    return (f"{selectors.run_version(run)}.{int(selectors.run_lease_live(run))}"
            f".{int(bool(no_worker))}")


def _context(request: HttpRequest, run: RunForPage, no_worker: str, form: CancelRunForm,
             message: str, steps_before: int | None) -> dict[str, Any]:
    live = selectors.run_is_live(run)
    query = request.GET.copy()
    query.pop("seen", None)
    return {
        "run": run,
        "live": live,
        "lease_live": selectors.run_lease_live(run),
        "no_worker": no_worker,
        "steps": selectors.steps_tail(run.pk, before=steps_before, limit=STEPS_SHOWN),
        "steps_before": steps_before,
        "approvals": selectors.run_approvals(run.pk),
        "events": selectors.events_tail(run, limit=EVENTS_SHOWN),
        "can_cancel": (request.user.has_perm(CANCEL_PERMISSION)
                       and selectors.run_cancellable(run)),
        "cancel_form": form,
        "message": message,
        "version": _version(run, no_worker),
        "query": query.urlencode(),
        "now": timezone.now(),
    }
