"""Where notifications about approvals go (settings RUNTIME["NOTIFY"]) and what each says."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django.contrib.auth import get_user_model
from django.core.exceptions import ImproperlyConfigured

from runtime.conf import DEFAULTS, setting
from runtime.models import (
    Approval,
)
from runtime.notifications.slack import slack_body, slack_channel_id

EVENTS = ("approval.requested", "approval.decided", "approval.expired", "approval.expiring",
          "approval.escalated")
# A channel that lists no events is told of requests, and warned before their deadlines.
# ``approval.escalated`` goes only to channels that ask for it: the second channel.
DEFAULT_EVENTS = ("approval.requested", "approval.expiring")
DEADLINE_EVENTS = ("approval.expiring", "approval.escalated")
TARGET_CHARS = 500  # Notification.target's size: a group's addresses are split to fit


KINDS = ("webhook", "slack", "slack_app", "email")
# A Slack app's message is posted on request and updated with the outcome: it hears all three.
SLACK_APP_EVENTS = ("approval.requested", "approval.decided", "approval.expired")


@dataclass(frozen=True)
class Channel:
    name: str
    kind: str
    target: str
    agents: frozenset[str] | None
    events: frozenset[str]
    group: str = ""  # email: a Django auth group whose active users are mailed too

    def wants(self, agent: str, event: str) -> bool:
        return event in self.events and (self.agents is None or agent in self.agents)


def channels() -> list[Channel]:
    """The configured channels; a malformed one is refused naming what is wrong."""
    out = []
    for n, raw in enumerate(setting("NOTIFY") or []):
        where = f"RUNTIME['NOTIFY'][{n}]"
        if not isinstance(raw, dict):
            raise ImproperlyConfigured(f"{where} is not a mapping")
        kind, target = raw.get("kind"), str(raw.get("target") or "").strip()
        if kind not in KINDS:
            raise ImproperlyConfigured(f"{where}: kind must be one of {', '.join(KINDS)}")
        group = str(raw.get("group") or "").strip()
        if group and (kind != "email" or len(group) > 150):
            raise ImproperlyConfigured(f"{where}: a group (a name of up to 150 characters) "
                                       "is for email channels only")
        if not target and not group:
            raise ImproperlyConfigured(f"{where}: a target (URL or addresses) is needed")
        if kind == "slack_app" and not slack_channel_id(target):
            raise ImproperlyConfigured(f"{where}: {target!r} is not a Slack channel id (C...)")
        if kind not in ("email", "slack_app") and not target.startswith(("http://", "https://")):
            raise ImproperlyConfigured(f"{where}: {target!r} is not an http(s) URL")
        events = frozenset(raw.get("events") or (SLACK_APP_EVENTS if kind == "slack_app"
                                                 else DEFAULT_EVENTS))
        if events - set(EVENTS):
            raise ImproperlyConfigured(f"{where}: unknown events {sorted(events - set(EVENTS))}")
        agents = raw.get("agents")
        out.append(Channel(str(raw.get("name") or f"{kind}-{n + 1}"), kind, target,
                           None if agents is None or agents == "*" else frozenset(agents),
                           events, group))
    return out


def email_targets(channel: Channel) -> list[str]:
    """An email channel's recipients as targets of at most ``TARGET_CHARS`` each: its own
    addresses and, with a group, the addresses of the group's active users as they are now
    (read in the transaction writing the notification). Empty: nobody to mail."""
    addresses = [a.strip() for a in channel.target.split(",") if a.strip()]
    if channel.group:
        users = get_user_model().objects.filter(groups__name=channel.group, is_active=True)
        addresses += [e.strip() for e in users.exclude(email="").values_list("email", flat=True)
                      if 0 < len(e.strip()) <= TARGET_CHARS]
    out: list[str] = []
    for address in sorted(set(addresses), key=addresses.index):
        if out and len(out[-1]) + 1 + len(address) <= TARGET_CHARS:
            out[-1] += "," + address
        else:
            out.append(address)
    return out


def approval_link(approval_id: int) -> str:
    """Where a person decides (settings ``RUNTIME["APPROVAL_URL"]``, ``{id}`` filled in)."""
    pattern = setting("APPROVAL_URL") or DEFAULTS["APPROVAL_URL"]
    return pattern.replace("{id}", str(int(approval_id)))


def time_left(approval: Approval, at: datetime | None) -> str:
    """How long until the approval's deadline, in words, and when it is:
    "14 min (at 2026-12-07 21:15:00 UTC)", "1 h 5 min (...)", "40 s (...)"."""
    if approval.expires_at is None or at is None:
        return "an unknown time"
    left = max(0, int((approval.expires_at - at).total_seconds()))
    hours, minutes = left // 3600, left % 3600 // 60
    words = (f"{hours} h {minutes} min" if hours else f"{minutes} min" if minutes >= 2
             else f"{left} s")
    return f"{words} (at {approval.expires_at.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC)"


def _body(channel: Channel, event: str, approval: Approval, key: str,
          at: datetime | None = None) -> dict[str, Any]:
    link = approval_link(approval.pk)
    what = {"approval.requested": "waits for a decision", "approval.expired": "expired",
            "approval.expiring": f"expires in {time_left(approval, at)} and nobody has "
                                 "decided yet",
            "approval.escalated": "is escalated: nobody has decided and it expires in "
                                  f"{time_left(approval, at)}",
            "approval.decided": f"was {approval.status}"
            + (f" by {approval.decided_by}" if approval.decided_by else "")}[event]
    line = (f"Approval {approval.pk} ({approval.kind.replace('_', ' ')}) {what}: "
            f"{approval.title} - run {approval.run_id} ({approval.run.agent}), tool "
            f"{approval.tool}")
    if channel.kind == "slack":
        return {"text": f"{line}\n<{link}|Open the approval>"}
    if channel.kind == "slack_app":
        return slack_body(channel.target, event, approval, link, line)
    if channel.kind == "email":
        return {"subject": f"[agent runtime] {line}"[:200],
                "text": f"{line}\n\nArguments digest: {approval.digest}\n\n{link}\n"}
    return {"event": event, "idempotency_key": key, "link": link,
            "approval": {"id": approval.pk, "kind": approval.kind, "status": approval.status,
                         "title": approval.title, "tool": approval.tool,
                         "effect": approval.effect, "arguments_digest": approval.digest,
                         "decided_by": approval.decided_by or None,
                         "expires_at": approval.expires_at.isoformat()
                         if approval.expires_at else None},
            "run": {"id": approval.run_id, "agent": approval.run.agent},
            **({"expires_in_seconds": max(0, int((approval.expires_at - at).total_seconds()))}
               if event in DEADLINE_EVENTS and approval.expires_at and at else {})}
