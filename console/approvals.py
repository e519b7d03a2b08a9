"""The approval queue and one approval's page, where a person decides.

Decisions go through ``runtime.approvals`` only; this module never writes a runtime table.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from django.conf import settings
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseBadRequest
from django.shortcuts import redirect
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_http_methods

from console import wording
from console.forms import DECISION_FORMS, DecisionForm, EditForm
from console.permissions import DECIDE as DECIDE_PERMISSION
from console.permissions import viewing
from console.render import HtmxHttpRequest, no_change, page, unchanged
from console.runs import agent_note, known_agents
from console.wording import kind_word
from runtime import selectors
from runtime.approvals.decisions import approval_decide
from runtime.approvals.rules import Decision, approval_resolvable, four_eyes_blocks
from runtime.errors import ApprovalConflict, FourEyesViolation, InvalidDecision, InvalidEdit
from runtime.models import Approval, ApprovalKind, ApprovalStatus

QUEUE_LIMIT = 200
TIMELINE_STEPS = 20  # the steps up to the approval's own shown on its page; the run has all


@viewing
@require_http_methods(["GET"])
def queue(request: HttpRequest) -> HttpResponse:
    """Pending approvals, oldest first, or those with a deadline first (``?sort=expiring``).
    Its poll sends the version it shows (``?seen=``) and gets a 204 while nothing was added
    or decided."""
    kind, agent, sort, error = queue_filters(request.GET)
    if error:
        return page(request, "console/queue.html", {
            **_queue_filters(kind=kind, agent=agent, sort=sort), "items": [],
            "filter_error": error}, partial="queue-list", status=400)
    version = selectors.approval_queue_version(kind or None, agent or None)
    if unchanged(request, version):
        return no_change()
    return page(request, "console/queue.html",
                queue_context(request, kind=kind, agent=agent, sort=sort, version=version),
                partial="queue-list")


def queue_filters(params: Any) -> tuple[str, str, str, str]:
    """The queue's kind, agent and order from ``params`` (a query or a form), and what is
    wrong with them ("" when nothing): an unknown one is never a silent "everything"."""
    kind = str(params.get("kind", ""))
    agent = str(params.get("agent", "")).strip()[:200]
    sort = str(params.get("sort", ""))
    error = ""
    if kind not in ("", *ApprovalKind.values):
        error = (f"There is no kind {kind[:40]!r}: choose one of "
                 f"{', '.join(ApprovalKind.values)}.")
        kind = ""
    if sort not in selectors.QUEUE_SORTS:
        error = (f"There is no order {sort[:40]!r}: leave sort out for the oldest first, or "
                 f"choose sort=expiring for those with a deadline first, soonest first.")
        sort = ""
    return kind, agent, sort, error


@dataclass(frozen=True)
class QueueRow:
    """One row of the queue: the approval, whether this person may tick it for a batch,
    whether four-eyes bars them from allowing it, how close its deadline is, and its effect
    in words."""

    approval: Approval
    batchable: bool
    four_eyes: bool
    urgency: str
    effect: str


def queue_context(request: HttpRequest, *, kind: str, agent: str, sort: str,
                  version: str | None = None) -> dict[str, Any]:
    """What the queue's list shows (its rows with their batch boxes and action bar)."""
    if version is None:
        version = selectors.approval_queue_version(kind or None, agent or None)
    items, more = selectors.approval_queue(kind or None, agent or None, QUEUE_LIMIT, sort)
    now = timezone.now()
    by = request.user.get_username()
    may_decide = request.user.has_perm(DECIDE_PERMISSION)
    rows = [QueueRow(a, may_decide and selectors.approval_batchable(a, by, now),
                     selectors.approval_four_eyes_blocked(a, by),
                     selectors.approval_deadline_urgency(a, now), wording.effect_word(a))
            for a in items]
    batch = [r.approval for r in rows if r.batchable]
    return {
        **_queue_filters(kind=kind, agent=agent, sort=sort),
        "items": items,
        "rows": rows,
        "more": more,
        "limit": QUEUE_LIMIT,
        "version": version,
        "can_batch": bool(batch),
        "batch_words": wording.batch_buttons(batch),
        # One reverse() for the page, not three per row: a full queue is 200 rows.
        "approval_base": reverse("console:approval", args=[0]).removesuffix("0/"),
        "run_base": reverse("console:run", args=[0]).removesuffix("0/"),
        "now": now,
    }


SORT_WORDS = {"": "oldest first", "expiring": "expiring first"}


def _queue_filters(*, kind: str, agent: str, sort: str = "") -> dict[str, Any]:
    return {"kind": kind, "agent": agent, "kinds": [(k, kind_word(k)) for k in ApprovalKind],
            "agents": known_agents(), "agent_note": agent_note(agent), "sort": sort,
            "sorts": [(s, SORT_WORDS[s]) for s in selectors.QUEUE_SORTS]}


@viewing
@require_http_methods(["GET"])
def pending_count(request: HttpRequest) -> HttpResponse:
    """The nav's pending count, polled by htmx on every page."""
    return page(request, "base.html", {}, partial="nav-pending")


@viewing
@require_http_methods(["GET", "POST"])
def approval_detail(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    """The request, what is known about it, the run so far, and the decisions. An open page
    polls with the version it shows and is re-rendered whole when anything about it changed
    (someone else decided, the run moved on)."""
    approval = selectors.approval_for_page(pk)
    if approval is None:
        raise Http404("No such approval.")
    if request.method == "POST":
        return _decide(request, approval)
    if unchanged(request, selectors.approval_version(approval)):
        return no_change()
    return _render(request, approval)


def _decide(request: HtmxHttpRequest, approval: Approval) -> HttpResponse:
    if not request.user.has_perm(DECIDE_PERMISSION):
        raise PermissionDenied("Deciding approvals needs the decide_approval permission.")
    try:
        decision = Decision(request.POST.get("decision", ""))
    except ValueError:
        return HttpResponseBadRequest("Unknown decision.")
    if decision == Decision.RESOLVE and not approval_resolvable(approval):
        return HttpResponseBadRequest("Resolve applies to interrupted calls only; a policy "
                                      "approval is allowed or denied.")
    if decision == Decision.APPROVE and request.POST.get("edit"):
        return _decide_edited(request, approval)
    form = DECISION_FORMS[decision](request.POST,
                                    confirm_label=wording.choices(approval)[decision].confirm)
    if not form.is_valid():
        return _render(request, approval, form=form, status=422)
    try:
        approval_decide(approval.pk, decision, request.user.get_username(),
                        form.cleaned_data.get("note", ""), result=form.cleaned_data.get("result"))
    except ApprovalConflict as exc:
        return _render(request, _reload(approval), conflict=exc, status=409)
    except FourEyesViolation as exc:
        return _render(request, approval, form=form, refusal=str(exc), status=403)
    except InvalidDecision as exc:
        form.add_error(None, exc.reason)
        return _render(request, approval, form=form, status=422)
    if request.htmx:
        response = _render(request, _reload(approval), just_decided=True)
        response["HX-Trigger"] = "pending-changed"  # the nav's count, at once
        return response
    return redirect("console:approval", pk=approval.pk, permanent=False)


def _decide_edited(request: HtmxHttpRequest, approval: Approval) -> HttpResponse:
    """Edit, then allow: the arguments from the form built from the tool's schema. What the
    runtime refuses of them (its schema's verdict) is shown next to each field it names, with
    a 422; nothing changes."""
    schema = selectors.approval_edit_schema(approval)
    if schema is None:
        return _render(request, approval, status=422, refusal="Not edited: "
                       f"{selectors.approval_edit_note(approval)}. Nothing was changed.")
    form = EditForm(request.POST, schema=schema, proposed=approval.arguments)
    if not form.is_valid():
        return _render(request, approval, edit_form=form, status=422)
    try:
        approval_decide(approval.pk, Decision.APPROVE, request.user.get_username(),
                        form.cleaned_data.get("note", ""), arguments=form.arguments())
    except ApprovalConflict as exc:
        return _render(request, _reload(approval), conflict=exc, status=409)
    except FourEyesViolation as exc:
        return _render(request, approval, edit_form=form, refusal=str(exc), status=403)
    except InvalidEdit as exc:
        form.refused(exc.reason, exc.fields)
        return _render(request, approval, edit_form=form, status=422)
    except InvalidDecision as exc:
        form.add_error(None, exc.reason)
        return _render(request, approval, edit_form=form, status=422)
    if request.htmx:
        response = _render(request, _reload(approval), just_decided=True)
        response["HX-Trigger"] = "pending-changed"
        return response
    return redirect("console:approval", pk=approval.pk, permanent=False)


def _reload(approval: Approval) -> Approval:
    fresh = selectors.approval_for_page(approval.pk)
    if fresh is None:  # pragma: no cover - approvals are never deleted
        raise Http404("No such approval.")
    return fresh


def _render(
    request: HttpRequest,
    approval: Approval,
    *,
    form: DecisionForm | None = None,
    edit_form: EditForm | None = None,
    conflict: ApprovalConflict | None = None,
    refusal: str = "",
    just_decided: bool = False,
    status: int = 200,
) -> HttpResponse:
    user = request.user
    now = timezone.now()
    words = wording.choices(approval)
    allowed = selectors.approval_decisions(approval, user.get_username(), now)
    decisions = []
    for name in allowed:
        bound = form if form is not None and form.decision == name else None
        decisions.append({
            "name": name, "words": words[name],
            "form": bound or DECISION_FORMS[name](confirm_label=words[name].confirm)})
    if edit_form is None and selectors.approval_editable(approval, user.get_username(), now):
        schema = selectors.approval_edit_schema(approval)
        if schema is not None:
            edit_form = EditForm(schema=schema, proposed=approval.arguments)
    check = getattr(settings, "CONSOLE_CHECK_URL", "")
    only = getattr(settings, "CONSOLE_CHECK_AGENTS", None)  # agents that have that outside world
    if only is not None and approval.run.agent not in only:
        check = ""
    step, run = approval.step, approval.run
    timeline = selectors.steps_tail(run.pk, upto=step.index, limit=TIMELINE_STEPS)
    notifications = selectors.approval_notifications(approval)
    context: dict[str, Any] = {
        "approval": approval,
        "run": run,
        "step": step,
        "check_url": check.format(key=quote(step.idempotency_key), tool=quote(
            approval.tool)) if check else "",
        "timeline": timeline,
        "notifications": notifications,
        "reminded": sum(n.event == "approval.expiring" for n in notifications),
        "escalated": sum(n.event == "approval.escalated" for n in notifications),
        "pending": approval.status == ApprovalStatus.PENDING,
        "outcome_unknown": selectors.approval_outcome_unknown(approval),
        "after_restore": selectors.approval_after_restore(approval),
        "tampered": selectors.approval_tampered(approval),
        "policy": selectors.approval_is_policy(approval),
        "effect_source": selectors.approval_effect_source(approval),
        "kind_word": kind_word(approval.kind),
        "status_word": wording.status_word(approval),
        "conflict_word": (wording.status_word(approval, conflict.status)
                          if conflict is not None and conflict.status else ""),
        "can_decide": user.has_perm(DECIDE_PERMISSION),
        "four_eyes_blocked": four_eyes_blocks(approval, user.get_username()),
        "decisions": decisions,
        "open_form": ("edit" if edit_form is not None and edit_form.is_bound
                      else form.decision if form is not None else ""),
        "edit_form": edit_form if user.has_perm(DECIDE_PERMISSION) else None,
        "edit_note": selectors.approval_edit_note(approval) if (
            edit_form is None and selectors.approval_is_policy(approval)) else "",
        "edit": selectors.approval_edit(approval),
        "conflict": conflict,
        "refusal": refusal,
        "just_decided": just_decided,
        "next_step": wording.what_happens_next(approval),
        "version": selectors.approval_version(approval),
        "watch": (approval.status == ApprovalStatus.PENDING
                  or selectors.run_is_live(run)),
        "deadline_passed": selectors.approval_past_deadline(approval, now),
        "now": now,
    }
    return page(request, "console/approval.html", context, partial="approval-live",
                status=status)
