"""Deciding several approvals at once from the queue: allow (run once more) or end the runs of
every approval ticked, each on the request it showed, or none of them.

The runtime decides (``runtime.approvals.batch.approvals_decide``): all in one commit, or
nothing and which approval was refused and why. This view only reads the form and re-renders
the queue's list with the outcome; a form sent without JavaScript that went through is
redirected to the queue (so a reload sends nothing again), with the outcome as a message.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.urls import reverse
from django.views.decorators.http import require_http_methods

from console.api.errors import conflict
from console.approvals import queue_context, queue_filters
from console.forms import NOTE_MAX
from console.permissions import DECIDE as DECIDE_PERMISSION
from console.permissions import viewing
from console.render import page
from runtime import selectors
from runtime.approvals.batch import BATCH_LIMIT, DIGEST_MAX, NOTHING_DECIDED, approvals_decide
from runtime.approvals.rules import Decision
from runtime.canonical import check_payload
from runtime.errors import (
    AgentRuntimeError,
    ApprovalConflict,
    BatchRefused,
    FourEyesViolation,
    InvalidDecision,
    InvalidPayload,
)
from runtime.models import Approval


@dataclass(frozen=True)
class Refusal:
    """One approval a batch could not decide, and why, for the list the queue shows."""

    pk: int
    approval: Approval | None
    code: str  # as the JSON API names it
    reason: str


# What a person is told when a batch went through, by decision.
DONE_WORDS = {Decision.APPROVE: "allowed or queued to run once more",
              Decision.REJECT: "ended (their runs failed, the tools not called again)"}


@viewing
@require_http_methods(["POST"])
def decide_batch(request: HttpRequest) -> HttpResponse:
    """Decide every ticked approval (``pick``: "id.digest" of each) as ``decision`` with one
    note: 200 with the queue and how many were decided, 409/403/422 with the queue, nothing
    decided, and the list of those refused and why."""
    if not request.user.has_perm(DECIDE_PERMISSION):
        raise PermissionDenied("Deciding approvals needs the decide_approval permission.")
    kind, agent, sort, filter_error = queue_filters(request.POST)
    if filter_error:
        kind = agent = sort = ""
    outcome: dict[str, Any] = {}
    status = 200
    try:
        decision, items, note = _form(request)
        decided = approvals_decide(items, decision, request.user.get_username(), note)
    except _Invalid as exc:
        outcome, status = {"batch_error": str(exc)}, 422
    except BatchRefused as exc:
        outcome = {"batch_error": refusal_words(exc), "refused": _refusals(exc)}
        status = batch_status(exc)
    else:
        if not getattr(request, "htmx", False):  # a plain form: post, redirect, get
            messages.success(request, f"{len(decided)} approval{'s' if len(decided) != 1 else ''}"
                             f" decided ({', '.join(f'#{a.pk}' for a in decided)}): "
                             f"{DONE_WORDS[decision]}.")
            query = urlencode({k: v for k, v in (("kind", kind), ("agent", agent),
                                                  ("sort", sort)) if v})
            return redirect(reverse("console:queue") + (f"?{query}" if query else ""))
        outcome = {"batch_done": decided, "batch_done_words": DONE_WORDS[decision]}
    if status != 200:  # nothing was decided: the note and the boxes not refused stay
        outcome["batch_note"] = request.POST.get("note", "")[:NOTE_MAX]
        refused = {r.pk for r in outcome.get("refused", ())}
        outcome["picked"] = {pk for pk in _picked_ids(request) if pk not in refused}
    context = {**queue_context(request, kind=kind, agent=agent, sort=sort), **outcome}
    response = page(request, "console/queue.html", context, partial="queue-list",
                    status=status)
    if status == 200:
        response["HX-Trigger"] = "pending-changed"  # the nav's count, at once
    return response


class _Invalid(ValueError):
    """The form itself is not a batch (no decision, no approval ticked, a bad value)."""


def _form(request: HttpRequest) -> tuple[Decision, list[tuple[int, str]], str]:
    try:
        decision = Decision(request.POST.get("decision", ""))
    except ValueError:
        raise _Invalid("Choose what to do with the selected approvals.") from None
    # Which decisions a batch takes is the runtime's rule: it refuses the others, and says why.
    picks = request.POST.getlist("pick")
    if not picks:
        raise _Invalid("Tick at least one approval first.")
    if len(picks) > BATCH_LIMIT:
        raise _Invalid(f"At most {BATCH_LIMIT} approvals can be decided at once; "
                       f"{len(picks)} were ticked.")
    items: list[tuple[int, str]] = []
    for pick in picks:
        pk, _, digest = pick.partition(".")
        if not _is_id(pk) or not digest or len(digest) > DIGEST_MAX:
            raise _Invalid("A ticked approval was not understood; reload the queue.")
        items.append((int(pk), digest))
    note = request.POST.get("note", "")
    if len(note) > NOTE_MAX:
        raise _Invalid(f"The note is longer than {NOTE_MAX} characters.")
    try:
        note = check_payload("the note", note)
    except InvalidPayload as exc:
        raise _Invalid(f"{_sentence(str(exc))}") from None
    if not request.POST.get("confirm"):
        raise _Invalid("Tick the box to confirm deciding every selected approval.")
    return decision, items, note


def _picked_ids(request: HttpRequest) -> set[int]:
    picks = request.POST.getlist("pick")[:BATCH_LIMIT]
    return {int(pk) for pk, _, _ in (p.partition(".") for p in picks) if _is_id(pk)}


def _is_id(text: str) -> bool:
    """An approval id as a box sends it: ASCII digits only ("²" passes ``isdigit`` and fails
    ``int``; an Arabic-Indic one would name approval 1), short enough for the database."""
    return text.isascii() and text.isdigit() and len(text) <= 18


def _refusals(exc: BatchRefused) -> list[Refusal]:
    return [Refusal(pk, selectors.approval_for_page(pk), item_code(why),
                    _sentence(item_message(why))) for pk, why in sorted(exc.refusals.items())]


def item_message(exc: AgentRuntimeError) -> str:
    """One refused item's reason in the console's words (the API's single decision says a
    conflict the same way: who decided, when, and what that means for its kind)."""
    if isinstance(exc, ApprovalConflict):
        return conflict(exc).message
    if isinstance(exc, FourEyesViolation):
        return (f"{exc.user} started run {exc.run_id}, so someone else must allow it "
                "(four-eyes); ending it is open to everyone")
    if isinstance(exc, InvalidDecision):
        return exc.reason
    return str(exc)


def refusal_words(exc: BatchRefused) -> str:
    """The batch's own reason, without what the page says first ("Nothing was decided.")."""
    return _sentence(exc.reason.removeprefix(NOTHING_DECIDED))


def batch_status(exc: BatchRefused) -> int:
    """The HTTP status of a refused batch: 422 when the batch or an item is not valid, 409
    when one was decided, expired or changed meanwhile, 403 when only four-eyes refused."""
    codes = {item_code(why) for why in exc.refusals.values()}
    if not codes or codes & {"invalid", "not_found"}:
        return 422
    return 403 if codes == {"forbidden"} else 409


def item_code(exc: AgentRuntimeError) -> str:
    """One refused item's code, as the JSON API names it (``console.api.errors``)."""
    if isinstance(exc, ApprovalConflict):
        if exc.reason_code in ("decided", "expired"):
            return "already_decided"
        return "stale" if exc.reason_code == "stale" else "retry"
    if isinstance(exc, FourEyesViolation):
        return "forbidden"
    if isinstance(exc, InvalidDecision) and exc.reason == "no such approval":
        return "not_found"
    return "invalid"


def _sentence(text: str) -> str:
    text = text.strip()
    return text[:1].upper() + text[1:] + ("" if text.endswith(".") else ".")

