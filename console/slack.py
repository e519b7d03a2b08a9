"""``/slack/interactions``: deciding from the Slack app's message (``runtime.notifications.slack``
posts it).

Slack posts here when someone presses a button or submits a form. Nothing is trusted before the
request's signature (the app's signing secret over the timestamp and body, ``slack-sdk``'s
verifier) and its timestamp (at most five minutes away: an old request replayed is refused)
are checked. The Slack user must be mapped to a console user (``RUNTIME["SLACK_USERS"]``),
who needs the same permission as on the console, and the decision goes through the same
runtime function with the same four-eyes rule; the button carries the digest of the request the
message showed, so a message about a request that has since changed decides nothing. The
person is answered privately (an ephemeral message through the interaction's
``response_url``); everyone sees the outcome when the outbox updates the message.
"""

from __future__ import annotations

import json
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.decorators import login_not_required
from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST
from slack_sdk.signature import Clock as SlackClock
from slack_sdk.signature import SignatureVerifier

from console.forms import NOTE_MAX, json_field
from console.permissions import DECIDE, VIEW
from runtime import selectors
from runtime.approvals.decisions import approval_decide, approval_load
from runtime.approvals.rules import Decision, decision_refusal
from runtime.clock import SYSTEM_CLOCK, Clock
from runtime.conf import setting
from runtime.errors import ApprovalConflict, FourEyesViolation, InvalidDecision
from runtime.models import Approval, ApprovalStatus
from runtime.notifications.slack import (
    buttons,
    confirmations,
    escape,
    slack_call,
    slack_outcome,
    slack_respond,
    submit_words,
)

MAX_BODY = 256 * 1024  # Slack's payloads carry the message they came from: a few KiB
MAX_AGE = 5 * 60  # seconds: Slack's own rule for a request's timestamp
RESULT_MAX = 3000  # what a Slack text input takes
NOTHING = "Nothing was changed."

# The time requests and decisions are judged by; tests move it by hand.
clock: Clock = SYSTEM_CLOCK



class _Clock(SlackClock):
    def now(self) -> float:
        return clock.now().timestamp()


class Refused(Exception):
    """What to tell the person instead of deciding."""


@csrf_exempt
@login_not_required
@never_cache
@require_POST
def interactions(request: HttpRequest) -> HttpResponse:
    """A button pressed or a form submitted in Slack. 404 where no signing secret is set;
    401 for a request Slack did not sign now; 200 for everything Slack sent (a refusal is
    told to the person, not to Slack)."""
    secret = setting("SLACK_SIGNING_SECRET")
    if not secret:
        raise Http404("Slack is not set up here")
    try:
        length = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        length = MAX_BODY + 1
    if length > MAX_BODY:
        return _text(f"Refused: the body is larger than {MAX_BODY} bytes.", 413)
    body = request.body
    stamp = request.headers.get("X-Slack-Request-Timestamp", "")
    try:
        age = abs(clock.now().timestamp() - int(stamp))
    except (ValueError, OverflowError):
        return _text("Refused: no valid X-Slack-Request-Timestamp.", 401)
    if age > MAX_AGE:
        return _text("Refused: the request's timestamp is more than five minutes away (a "
                     "replayed request?).", 401)
    verifier = SignatureVerifier(secret, clock=_Clock())
    try:
        text = body.decode("utf-8")  # what Slack signs is text; other bytes are not its
    except UnicodeDecodeError:
        text = None
    signature = request.headers.get("X-Slack-Signature", "")
    if text is None or not signature.isascii() or not verifier.is_valid(text, stamp, signature):
        return _text("Refused: the request is not signed with this app's signing secret.", 401)
    try:
        payload = json.loads(request.POST.get("payload", ""))
    except (ValueError, RecursionError):
        payload = None
    if not isinstance(payload, dict):
        return _text("Refused: the body has no interaction payload.", 400)
    if payload.get("type") == "block_actions":
        return _pressed(payload)
    if payload.get("type") == "view_submission":
        return _submitted(payload)
    return HttpResponse(status=200)  # nothing of ours


def _dict(value: Any) -> dict[str, Any]:
    """A part of Slack's payload that should be an object (anything else reads as empty)."""
    return value if isinstance(value, dict) else {}


def _text(message: str, status: int) -> HttpResponse:
    return HttpResponse(message + "\n", status=status, content_type="text/plain; charset=utf-8")


# -- who, what, and whether ---------------------------------------------------------------------


def _person(payload: dict[str, Any]) -> AbstractBaseUser:
    """The console user the Slack user is mapped to, if they may decide."""
    slack_id = str(_dict(payload.get("user")).get("id") or "")[:40]
    mapping = setting("SLACK_USERS") or {}
    username = mapping.get(slack_id) if isinstance(mapping, dict) else None
    if not isinstance(mapping, dict) or not isinstance(username, str | None):
        raise Refused("RUNTIME['SLACK_USERS'] is not a mapping of Slack user id to console "
                      f"user name, so nobody can decide from Slack: ask an admin. {NOTHING}")
    if not username:
        raise Refused(f"Your Slack account ({escape(slack_id) or 'unknown'}) is not mapped to a "
                      "console user, so it cannot decide here: ask an admin to add your Slack "
                      f"user id to RUNTIME['SLACK_USERS']. {NOTHING}")
    user = get_user_model().objects.filter(username=username, is_active=True).first()
    if user is None:
        raise Refused(f"Your Slack account is mapped to {escape(username)}, who is not an active "
                      f"console user: ask an admin. {NOTHING}")
    missing = [name for perm, name in ((VIEW, "view_run"), (DECIDE, "decide_approval"))
               if not user.has_perm(perm)]
    if missing:  # as on the console: seeing approvals and deciding them
        raise Refused(f"{escape(username)} may not decide approvals (the "
                      f"{' and '.join(missing)} permission is missing): ask an admin. "
                      f"{NOTHING}")
    return user


def _approval(value: Any) -> tuple[Approval, str]:
    """The approval a button or form names, and the digest of the request it showed."""
    try:
        shown = json.loads(value) if isinstance(value, str) else value
        approval_id, digest = int(shown["approval"]), str(shown["digest"])
    except (ValueError, TypeError, KeyError, OverflowError):
        raise Refused(f"This button does not name an approval. {NOTHING}") from None
    approval = (selectors.approval_for_page(approval_id) if 0 < approval_id < 2 ** 63
                else None)
    if approval is None:
        raise Refused(f"There is no approval {approval_id}. {NOTHING}")
    if approval.status != ApprovalStatus.PENDING:
        raise Refused(f"Already {slack_outcome(approval)}. {NOTHING}")
    if digest != approval.digest:
        raise Refused(f"This message shows a request that is not the one approval {approval.pk} "
                      f"now holds (its digest differs): it cannot decide it. {NOTHING}")
    return approval, digest


def _refusal(approval: Approval, decision: Decision, by: str) -> None:
    """The runtime's rules (four-eyes, the kind, the deadline) before a form is opened."""
    refusal = decision_refusal(approval, decision, by, clock.now())
    if refusal is not None:
        raise Refused(_said(refusal, approval))


def _said(exc: Exception, approval: Approval) -> str:
    if isinstance(exc, ApprovalConflict) and exc.reason_code in ("decided", "expired"):
        return f"Already {slack_outcome(approval_load(approval.pk))}. {NOTHING}"
    if isinstance(exc, FourEyesViolation):
        return (f"You started run {exc.run_id} and four-eyes is on: someone else must approve "
                f"or resolve its side effect (ending the run stays open to you). {NOTHING}")
    reason = getattr(exc, "reason", str(exc))
    return f"Not decided: {escape(reason)}. {NOTHING}"


def _decide(user: AbstractBaseUser, approval: Approval, decision: Decision, note: str = "",
            result: Any = None) -> str:
    """Decide through the runtime, as the console does; what to tell the person."""
    try:
        done = approval_decide(approval.pk, decision, user.get_username(), note, result=result,
                               now=clock.now())
    except (ApprovalConflict, FourEyesViolation, InvalidDecision) as exc:
        raise Refused(_said(exc, approval)) from None
    return (f"Done: {slack_outcome(done)}. The message in the channel will show it to "
            "everyone.")


# -- a button --------------------------------------------------------------------------------


def _pressed(payload: dict[str, Any]) -> HttpResponse:
    """Allow (or run once more) decides at once; the two that need words open a form."""
    response_url = str(payload.get("response_url") or "")
    actions = payload.get("actions")
    action = _dict(actions[0] if isinstance(actions, list) and actions else None)
    try:
        decision = Decision(str(action.get("action_id") or ""))
    except ValueError:
        return HttpResponse(status=200)  # not a decision button
    try:
        user = _person(payload)
        approval, digest = _approval(action.get("value"))
        if decision == Decision.APPROVE:
            said = _decide(user, approval, decision)
        else:
            _refusal(approval, decision, user.get_username())
            ok, _, error, _ = slack_call("views.open", {
                "trigger_id": str(payload.get("trigger_id") or ""),
                "view": _form(approval, digest, decision, response_url)})
            said = "" if ok else f"Slack did not open the form ({escape(error)}). {NOTHING}"
    except Refused as refusal:
        said = str(refusal)
    if said and response_url:
        slack_respond(response_url, said)
    return HttpResponse(status=200)


def _form(approval: Approval, digest: str, decision: Decision,
          response_url: str) -> dict[str, Any]:
    """The modal asking for the result found (resolve) or why the run must stop (reject)."""
    words = submit_words(approval)[decision]
    blocks: list[dict[str, Any]] = [{"type": "section", "text": {"type": "mrkdwn", "text": (
        f"*{escape(buttons(approval)[decision])}*: approval {approval.pk}, tool "
        f"`{escape(approval.tool)}`, run {approval.run_id}.\n"
        f"{confirmations(approval)[decision]}")[:3000]}}]
    if decision == Decision.RESOLVE:
        blocks.append({"type": "input", "block_id": "result", "label": {
            "type": "plain_text", "text": "The result you found, as JSON"}, "element": {
            "type": "plain_text_input", "action_id": "value", "multiline": True,
            "max_length": RESULT_MAX}, "hint": {
            "type": "plain_text", "text": 'e.g. {"charged": 500} or "done"'}})
    blocks.append({"type": "input", "block_id": "note", "optional": decision != Decision.REJECT,
                   "label": {"type": "plain_text", "text": "Why the run must stop"
                             if decision == Decision.REJECT else "Note"},
                   "element": {"type": "plain_text_input", "action_id": "value",
                               "multiline": True, "max_length": NOTE_MAX}})
    meta = {"approval": approval.pk, "digest": digest, "decision": str(decision),
            "response_url": response_url}
    return {"type": "modal", "callback_id": "decide", "private_metadata": json.dumps(meta),
            "title": {"type": "plain_text", "text": words},
            "submit": {"type": "plain_text", "text": words},
            "close": {"type": "plain_text", "text": "Cancel"}, "blocks": blocks}


# -- a form ----------------------------------------------------------------------------------


def _submitted(payload: dict[str, Any]) -> HttpResponse:
    """The form's input checked as the console checks it, then the same checks as a button."""
    view = _dict(payload.get("view"))
    try:
        meta = json.loads(view.get("private_metadata") or "")
        decision = Decision(meta["decision"])
    except (ValueError, TypeError, KeyError):
        return HttpResponse(status=200)  # not our form
    values = _dict(_dict(view.get("state")).get("values"))

    def typed(block: str) -> str:
        return str(_dict(_dict(values.get(block)).get("value")).get("value") or "")

    note, errors = typed("note").strip(), {}
    result: Any = None
    if len(note) > NOTE_MAX:
        errors["note"] = f"At most {NOTE_MAX} characters."
    elif decision == Decision.REJECT and not note:
        errors["note"] = "Required: why the run must stop."
    if decision == Decision.RESOLVE:
        try:
            result = json_field(typed("result")[:RESULT_MAX + 1], "the result")
        except ValidationError as exc:
            errors["result"] = " ".join(exc.messages)
    first = "result" if decision == Decision.RESOLVE else "note"
    if not errors:
        try:
            user = _person(payload)
            approval, _ = _approval(meta)
            said = _decide(user, approval, decision, note, result)
        except Refused as refusal:
            errors[first] = str(refusal)[:2000]
    if errors:
        return JsonResponse({"response_action": "errors", "errors": errors})
    if meta.get("response_url"):
        slack_respond(str(meta["response_url"]), said)
    return HttpResponse(status=200)
