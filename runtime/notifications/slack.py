"""Approvals in a Slack app's channel (channel kind ``slack_app``): the request with a button for
each decision its kind allows, updated with the outcome once someone decides.

A request is posted with ``chat.postMessage``; the answer's ``channel`` and ``ts`` are kept in
the notification's ``reply``. The approval's ``approval.decided`` or ``approval.expired``
notification to the same channel then calls ``chat.update`` on that message, so everyone in
the channel sees who decided and when, and the buttons are gone. Both go through the outbox
(at least once). Slack answers most errors with HTTP 200 and ``{"ok": false}``: that is a
failed attempt, retried like any other, and never decides anything. The buttons only carry
the approval's id and digest; the console's ``/slack/interactions`` decides (``console.slack``).

The words are the console's (``console/wording.py``), restated here because the runtime may
not import the console; a test keeps the two equal.
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from typing import Any

import httpx

from runtime.approvals.rules import (
    Decision,
    approval_decisions,
    approval_request_intact,
    approval_resolvable,
    four_eyes_blocks,
)
from runtime.conf import setting
from runtime.effects import Effect
from runtime.models import Approval, ApprovalKind, ApprovalStatus, Notification, NotificationStatus

TIMEOUT = 10.0
SECTION_LIMIT = 3000  # Slack's limit on a section's text
HEADER_LIMIT = 150  # on a header's
FALLBACK_LIMIT = 3000  # the message's plain ``text`` (notifications, screen readers)
_CHANNEL = re.compile(r"^[CGD][A-Z0-9]{2,40}$")

# The buttons: the console's headings of each decision, by the approval's kind.
POLICY_BUTTONS = {Decision.APPROVE: "Allow this call", Decision.REJECT: "Deny"}
RERUN_BUTTONS = {Decision.APPROVE: "Run it once more",
                 Decision.RESOLVE: "It happened: record the result",
                 Decision.REJECT: "End the run"}
# What pressing confirms (the console's confirmation boxes).
POLICY_CONFIRM = {Decision.APPROVE: "Yes: allow this call, once, with these arguments.",
                  Decision.REJECT: "Yes: deny this call and end the run."}
RERUN_CONFIRM = {Decision.APPROVE: "Yes: run this exact request once more.",
                 Decision.RESOLVE: "Yes: it happened; record this result and continue.",
                 Decision.REJECT: "Yes: end the run; do not call the tool again."}
# The outcome, as in "allowed by olga at 14:02".
POLICY_DONE: dict[str, str] = {ApprovalStatus.APPROVED: "allowed",
                               ApprovalStatus.CONSUMED: "allowed",
                               ApprovalStatus.REJECTED: "denied"}
RERUN_DONE: dict[str, str] = {ApprovalStatus.APPROVED: "approved to run once more",
                              ApprovalStatus.CONSUMED: "approved to run once more",
                              ApprovalStatus.RESOLVED: "recorded as happened",
                              ApprovalStatus.REJECTED: "run ended"}
# A form's title and submit button (the console's buttons; Slack allows 24 characters).
POLICY_SUBMIT = {Decision.APPROVE: "Allow", Decision.REJECT: "Deny"}
RERUN_SUBMIT = {Decision.APPROVE: "Run it once more", Decision.RESOLVE: "Record the result",
                Decision.REJECT: "End the run"}
KIND_WORDS: dict[str, str] = {ApprovalKind.POLICY: "policy check",
              ApprovalKind.INTERRUPTED_SIDE_EFFECT: "interrupted call",
              ApprovalKind.RECONCILE: "reconcile conflict",
              ApprovalKind.RESTORED: "restored from a backup"}


def slack_channel_id(text: str) -> bool:
    """Whether ``text`` looks like a Slack conversation id (``C0123ABCD``, ``G…``, ``D…``)."""
    return bool(_CHANNEL.match(text))


def buttons(approval: Approval) -> dict[Decision, str]:
    return POLICY_BUTTONS if approval.kind == ApprovalKind.POLICY else RERUN_BUTTONS


def confirmations(approval: Approval) -> dict[Decision, str]:
    return POLICY_CONFIRM if approval.kind == ApprovalKind.POLICY else RERUN_CONFIRM


def submit_words(approval: Approval) -> dict[Decision, str]:
    return POLICY_SUBMIT if approval.kind == ApprovalKind.POLICY else RERUN_SUBMIT


def slack_time(at: datetime) -> str:
    """A moment as Slack shows it in each reader's time zone ("14:02"), UTC as the fallback."""
    return f"<!date^{int(at.timestamp())}^{{time}}|{at:%H:%M} UTC>"


def slack_outcome(approval: Approval) -> str:
    """How a decided (or expired) approval ended, in words: "allowed by olga at 14:02"."""
    if approval.status == ApprovalStatus.EXPIRED:
        end = approval.decided_at or approval.expires_at
        return "expired" + (f" at {slack_time(end)}" if end else "") + ": nobody decided " \
            "before its deadline"
    words = POLICY_DONE if approval.kind == ApprovalKind.POLICY else RERUN_DONE
    word = words.get(approval.status, str(approval.status))
    who = f" by {approval.decided_by}" if approval.decided_by else ""
    when = f" at {slack_time(approval.decided_at)}" if approval.decided_at else ""
    return f"{word}{who}{when}"


def escape(text: str) -> str:
    """Text shown as is in Slack's mrkdwn (``&``, ``<`` and ``>`` are its control characters)."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def arguments_text(arguments: Any, heading: str = "Arguments") -> str:
    """The arguments as the console shows them (indented JSON, keys sorted) in a code block,
    cut to a section's limit with a word saying so."""
    shown = escape(json.dumps(arguments, indent=2, sort_keys=True, ensure_ascii=False,
                              default=str)).replace("```", "`\u200b``")
    room = SECTION_LIMIT - 120
    if len(shown) > room:
        shown = shown[:room] + f"\n… ({len(shown) - room} characters more: the console shows " \
            "them all)"
    return f"*{heading}*\n```{shown}```"


def _section(text: str) -> dict[str, Any]:
    return {"type": "section", "text": {"type": "mrkdwn", "text": cut(text, SECTION_LIMIT)}}


def request_blocks(approval: Approval, link: str) -> list[dict[str, Any]]:
    """The request as the console's page shows it: what, which tool and effect, the arguments,
    the digest, and what is unknown about an interrupted call."""
    tool = escape(approval.tool)
    fields = [f"*Tool*\n`{tool}`", f"*Effect*\n{escape(str(approval.effect))}",
              f"*Kind*\n{KIND_WORDS.get(approval.kind, approval.kind)}",
              f"*Run*\n{approval.run_id} ({escape(approval.run.agent)})"]
    if approval.expires_at:
        fields.append(f"*Deadline*\n{slack_time(approval.expires_at)}")
    blocks: list[dict[str, Any]] = [
        {"type": "header", "text": {"type": "plain_text", "text": cut(
            f"Approval {approval.pk}: {approval.title}", HEADER_LIMIT)}},
        {"type": "section", "fields": [{"type": "mrkdwn", "text": cut(f, 2000)} for f in fields]},
    ]
    if approval.detail:
        blocks.append(_section(escape(approval.detail)))
    if not approval_request_intact(approval):
        blocks.append(_section(":warning: *This request does not match its digest.* The "
                               "arguments stored with it were changed after it was asked for: "
                               "it can only be " + ("denied." if approval.kind ==
                                                    ApprovalKind.POLICY else "ended.")))
    if approval_resolvable(approval) and approval.effect == Effect.SIDE_EFFECT:
        key = escape(approval.step.idempotency_key)
        why = ("The database was restored from a backup; this run may already have called "
               f"`{tool}` after the backup's moment." if approval.kind == ApprovalKind.RESTORED
               else f"The call to `{tool}` started and the process stopped before its outcome "
               "was recorded, so whether it took effect is unknown.")
        blocks.append(_section(f":warning: *Outcome unknown.* {why} Check the outside world "
                               f"for the idempotency key `{key}` before deciding."))
    blocks.append(_section(arguments_text(approval.arguments)))
    blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": cut(
        f"Digest `{approval.digest}` · <{link}|Open it in the console>", 3000)}]})
    return blocks


def button_value(approval: Approval) -> str:
    """What a button carries: the approval and the digest of the request the message shows."""
    return json.dumps({"approval": approval.pk, "digest": approval.digest},
                      separators=(",", ":"))


def action_block(approval: Approval) -> dict[str, Any]:
    """A button for each decision the approval's kind (and state) allows, in the console's
    order; who presses is checked when they do."""
    words, confirm = buttons(approval), confirmations(approval)
    elements = []
    for decision in approval_decisions(approval, "", approval.created_at):
        button: dict[str, Any] = {
            "type": "button", "action_id": str(decision), "value": button_value(approval),
            "text": {"type": "plain_text", "text": words[decision]}}
        if decision == Decision.APPROVE:  # decided at once: Slack asks first, as the console
            button["style"] = "primary"
            button["confirm"] = {
                "title": {"type": "plain_text", "text": words[decision]},
                "text": {"type": "plain_text", "text": confirm[decision]},
                "confirm": {"type": "plain_text", "text": words[decision]},
                "deny": {"type": "plain_text", "text": "Cancel"}}
        elif decision == Decision.REJECT:
            button["style"] = "danger"
        elements.append(button)
    return {"type": "actions", "block_id": f"approval-{approval.pk}", "elements": elements}


def slack_body(target: str, event: str, approval: Approval, link: str,
               said: str = "") -> dict[str, Any]:
    """The message an event makes, written with the approval's change (``update``: it replaces
    the request's message rather than posting a new one). Another event (a deadline's
    warning) is posted as ``said``, the line every channel gets."""
    line = f"Approval {approval.pk} ({KIND_WORDS.get(approval.kind, approval.kind)}): " \
        f"{approval.title} - run {approval.run_id} ({approval.run.agent}), tool {approval.tool}"
    if event not in ("approval.requested", "approval.decided", "approval.expired"):
        said = said or f"{line}: {event}"
        return {"channel": target, "text": cut(escape(said), FALLBACK_LIMIT), "blocks": [
            _section(f"{escape(said)} · <{link}|Open it in the console>")]}
    blocks = request_blocks(approval, link)
    if event == "approval.requested":
        if four_eyes_blocks(approval, approval.run.created_by):
            blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": cut(
                f"Four-eyes: {escape(approval.run.created_by)} started this run, so someone "
                "else must let its side effect through; they may still end it.", 3000)}]})
        # The plain ``text`` is mrkdwn too: escaped, a title can neither ping nor link.
        return {"channel": target, "text": cut(f"{escape(line)}: waits for a decision",
                                               FALLBACK_LIMIT),
                "blocks": [*blocks, action_block(approval)]}
    outcome = slack_outcome(approval)  # decided or expired
    if approval.edited_by:  # it runs with other arguments than those shown above
        outcome += f", with arguments edited by {approval.edited_by}"
        blocks.append(_section(arguments_text(approval.effective_arguments,
                                              "Arguments as allowed (edited)")))
    note = f"\n>{escape(approval.note)}" if approval.note else ""
    return {"channel": target, "update": True, "text": cut(f"{escape(line)}: {outcome}",
                                                                 FALLBACK_LIMIT),
            "blocks": [*blocks, _section(f"*{outcome[:1].upper()}{outcome[1:]}*{note}")]}


# -- Slack's Web API --------------------------------------------------------------------------


def slack_call(method: str, payload: dict[str, Any]) -> tuple[bool, int | None, str,
                                                                dict[str, Any]]:
    """Call one Web API method with the bot token: (ok, HTTP status, error, Slack's answer).
    HTTP 200 with ``"ok": false`` is an error like any other."""
    token = setting("SLACK_BOT_TOKEN")
    if not token:
        return False, None, "no Slack bot token (RUNTIME_SLACK_BOT_TOKEN) is set", {}
    url = f"{str(setting('SLACK_API_URL')).rstrip('/')}/{method}"
    try:
        reply = httpx.post(url, json=payload, timeout=TIMEOUT, headers={
            "Authorization": f"Bearer {token}", "User-Agent": "agent-runtime-notify"})
    except httpx.HTTPError as exc:
        return False, None, f"{type(exc).__name__}: {exc}"[:1000], {}
    if not 200 <= reply.status_code < 300:
        return False, reply.status_code, f"HTTP {reply.status_code}: {reply.text[:300]}", {}
    try:
        answer = reply.json()
    except ValueError:
        return False, reply.status_code, f"Slack's answer is not JSON: {reply.text[:300]}", {}
    if not isinstance(answer, dict) or answer.get("ok") is not True:
        error = answer.get("error") if isinstance(answer, dict) else None
        return False, reply.status_code, f"Slack refused {method}: {error or answer!r}"[:1000], {}
    return True, reply.status_code, "", answer


def slack_send(n: Notification) -> tuple[bool, int | None, str]:
    """Deliver a ``slack_app`` notification: post the request, or update its message with the
    outcome. On success ``n.reply`` holds the message's channel and ts (the sender keeps
    it)."""
    body = dict(n.body)
    method = "chat.postMessage"
    if body.pop("update", False):
        posted = (Notification.objects.filter(approval_id=n.approval_id, channel=n.channel,
                                              event="approval.requested")
                  .order_by("pk").values_list("status", "reply").first())
        if posted is not None and posted[0] == NotificationStatus.PENDING:
            return False, None, "the request's message is not posted yet; updating it later"
        if posted is not None and (posted[1] or {}).get("ts"):
            method = "chat.update"
            body.update(channel=posted[1]["channel"], ts=posted[1]["ts"])
        # Else it was never posted (given up): the outcome is posted as a message of its own.
    ok, code, error, answer = slack_call(method, body)
    if ok:
        n.reply = {"channel": answer.get("channel") or body["channel"],
                   "ts": answer.get("ts") or body.get("ts", "")}
    return ok, code, error


RESPONSE_HOST = "hooks.slack.com"  # where Slack's response URLs point


def slack_response_url_allowed(response_url: str) -> bool:
    """A response URL is Slack's (https on hooks.slack.com) or on the host of the configured
    Web API (a proxy, a test double): a signed payload cannot send the runtime elsewhere."""
    try:
        url = httpx.URL(response_url)
        api = httpx.URL(str(setting("SLACK_API_URL")))
    except (httpx.InvalidURL, TypeError, ValueError):
        return False
    if url.scheme == "https" and url.host == RESPONSE_HOST and url.port is None:
        return True
    return bool(url.host) and (url.scheme, url.host, url.port) == (
        api.scheme, api.host, api.port)


def slack_respond(response_url: str, text: str) -> bool:
    """Tell only the person who pressed a button (an ephemeral message through the
    interaction's ``response_url``); whether Slack took it. A URL that is not Slack's is not
    called."""
    if not slack_response_url_allowed(response_url):
        return False
    try:
        reply = httpx.post(response_url, timeout=TIMEOUT, json={
            "response_type": "ephemeral", "replace_original": False, "text": text})
    except httpx.HTTPError:
        return False
    return 200 <= reply.status_code < 300
