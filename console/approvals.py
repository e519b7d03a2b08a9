"""The approval queue and one approval's page, where a person decides.

Decisions go through ``runtime.approvals`` only; this module never writes a runtime table.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from django.conf import settings
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest
from django.shortcuts import get_object_or_404, redirect
from django.utils import timezone
from django.views.decorators.http import require_http_methods

from runtime import approvals
from runtime.errors import ApprovalConflict, FourEyesViolation, InvalidDecision
from runtime.models import Approval, ApprovalKind, ApprovalStatus, Step

from .forms import DECISION_FORMS, DecisionForm
from .render import page
from .runs import known_agents

QUEUE_LIMIT = 200
DECIDE_PERMISSION = "runtime.decide_approval"


@require_http_methods(["GET"])
def queue(request: HttpRequest) -> HttpResponse:
    """Pending approvals, oldest first; htmx polls the list partial."""
    kind = request.GET.get("kind", "")
    kind = kind if kind in ApprovalKind.values else ""
    agent = request.GET.get("agent", "").strip()
    items = list(approvals.pending(kind or None, agent or None)[: QUEUE_LIMIT + 1])
    context = {
        "items": items[:QUEUE_LIMIT],
        "more": len(items) > QUEUE_LIMIT,
        "limit": QUEUE_LIMIT,
        "kind": kind,
        "agent": agent,
        "kinds": ApprovalKind.choices,
        "agents": known_agents(),
        "now": timezone.now(),
    }
    return page(request, "console/queue.html", context, partial="queue-list")


@require_http_methods(["GET"])
def pending_count(request: HttpRequest) -> HttpResponse:
    """The nav's pending count, polled by htmx on every page."""
    return page(request, "base.html", {}, partial="nav-pending")


@require_http_methods(["GET", "POST"])
def approval_detail(request: HttpRequest, pk: int) -> HttpResponse:
    """The request, what is known about it, the run so far, and the three decisions."""
    approval = get_object_or_404(Approval.objects.select_related("run", "step"), pk=pk)
    if request.method == "POST":
        return _decide(request, approval)
    return _render(request, approval)


def _decide(request: HttpRequest, approval: Approval) -> HttpResponse:
    if not request.user.has_perm(DECIDE_PERMISSION):
        raise PermissionDenied("Deciding approvals needs the decide_approval permission.")
    form_class = DECISION_FORMS.get(request.POST.get("decision", ""))
    if form_class is None:
        return HttpResponseBadRequest("Unknown decision.")
    if form_class.decision == "resolve" and approval.kind not in approvals.RESOLVABLE:
        return HttpResponseBadRequest("Resolve applies to interrupted steps only; a policy "
                                      "approval is approved or rejected.")
    form = form_class(request.POST)
    if not form.is_valid():
        return _render(request, approval, form=form, status=422)
    by = request.user.get_username()
    note = form.cleaned_data.get("note", "")
    try:
        if form.decision == "approve":
            approvals.approve(approval.pk, by, note)
        elif form.decision == "resolve":
            approvals.resolve(approval.pk, by, form.cleaned_data["result"], note)
        else:
            approvals.reject(approval.pk, by, note)
    except ApprovalConflict as exc:
        approval.refresh_from_db()
        return _render(request, approval, conflict=exc, status=409)
    except FourEyesViolation as exc:
        return _render(request, approval, form=form, refusal=str(exc), status=403)
    except InvalidDecision as exc:
        form.add_error(None, exc.reason)
        return _render(request, approval, form=form, status=422)
    if request.htmx:
        approval.refresh_from_db()
        return _render(request, approval, just_decided=True)
    return redirect("console:approval", pk=approval.pk, permanent=False)


def _render(
    request: HttpRequest,
    approval: Approval,
    *,
    form: DecisionForm | None = None,
    conflict: ApprovalConflict | None = None,
    refusal: str = "",
    just_decided: bool = False,
    status: int = 200,
) -> HttpResponse:
    user = request.user
    can_decide = user.has_perm(DECIDE_PERMISSION)
    blocked = approvals.four_eyes_blocks(approval, user.get_username())
    forms: dict[str, DecisionForm] = {name: cls() for name, cls in DECISION_FORMS.items()}
    if form is not None:
        forms[form.decision] = form
    allowed = ["reject"] if blocked else ["approve", "reject"]
    if approval.kind in approvals.RESOLVABLE and not blocked:
        allowed.insert(1, "resolve")
    check = getattr(settings, "CONSOLE_CHECK_URL", "")
    context: dict[str, Any] = {
        "approval": approval,
        "run": approval.run,
        "step": approval.step,
        "check_url": check.format(key=quote(approval.step.idempotency_key), tool=quote(
            approval.tool)) if check else "",
        "timeline": Step.objects.filter(run_id=approval.run_id, index__lte=approval.step.index)
        .order_by("index"),
        "pending": approval.status == ApprovalStatus.PENDING,
        "interrupted": approval.kind == ApprovalKind.INTERRUPTED_SIDE_EFFECT or (
            approval.kind == ApprovalKind.RECONCILE and approval.effect == "side_effect"),
        "can_decide": can_decide,
        "four_eyes_blocked": blocked,
        "decisions": [forms[name] for name in allowed],
        "open_form": form.decision if form is not None else "",
        "conflict": conflict,
        "refusal": refusal,
        "just_decided": just_decided,
        "next_step": _what_happens_next(approval),
        "now": timezone.now(),
    }
    return page(request, "console/approval.html", context, partial="decision-panel",
                status=status)


def _what_happens_next(approval: Approval) -> str:
    tool, step = approval.tool, approval.step
    return {
        ApprovalStatus.APPROVED: (
            f"The run is queued. The next worker to claim it runs {tool} once more, on step "
            f"{step.index} with the same idempotency key. If that process dies too, a new "
            "approval is needed."),
        ApprovalStatus.CONSUMED: (
            f"The approved re-run of {tool} started"
            + (f" at {approval.consumed_at:%Y-%m-%d %H:%M:%S} UTC." if approval.consumed_at
               else ".")),
        ApprovalStatus.RESOLVED: (
            f"Step {step.index} was recorded as succeeded with the given result; {tool} is not "
            "called again. The run is queued and continues from the next step."),
        ApprovalStatus.REJECTED: (
            f"The run ended failed (rejected); {tool} will not be called again."),
        ApprovalStatus.CANCELLED: "Nothing will run: this approval was cancelled.",
    }.get(approval.status, "")
