"""Where notifications about approvals go (settings RUNTIME["NOTIFY"]) and what each says."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.core.exceptions import ImproperlyConfigured

from runtime.conf import DEFAULTS, setting
from runtime.models import (
    Approval,
)

EVENTS = ("approval.requested", "approval.decided", "approval.expired")


KINDS = ("webhook", "slack", "email")


@dataclass(frozen=True)
class Channel:
    name: str
    kind: str
    target: str
    agents: frozenset[str] | None
    events: frozenset[str]

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
        if not target:
            raise ImproperlyConfigured(f"{where}: a target (URL or addresses) is needed")
        if kind != "email" and not target.startswith(("http://", "https://")):
            raise ImproperlyConfigured(f"{where}: {target!r} is not an http(s) URL")
        events = frozenset(raw.get("events") or ["approval.requested"])
        if events - set(EVENTS):
            raise ImproperlyConfigured(f"{where}: unknown events {sorted(events - set(EVENTS))}")
        agents = raw.get("agents")
        out.append(Channel(str(raw.get("name") or f"{kind}-{n + 1}"), kind, target,
                           None if agents is None or agents == "*" else frozenset(agents),
                           events))
    return out


def approval_link(approval_id: int) -> str:
    """Where a person decides (settings ``RUNTIME["APPROVAL_URL"]``, ``{id}`` filled in)."""
    pattern = setting("APPROVAL_URL") or DEFAULTS["APPROVAL_URL"]
    return pattern.replace("{id}", str(int(approval_id)))


def _body(channel: Channel, event: str, approval: Approval, key: str) -> dict[str, Any]:
    link = approval_link(approval.pk)
    what = {"approval.requested": "waits for a decision", "approval.expired": "expired",
            "approval.decided": f"was {approval.status}"
            + (f" by {approval.decided_by}" if approval.decided_by else "")}[event]
    line = (f"Approval {approval.pk} ({approval.kind.replace('_', ' ')}) {what}: "
            f"{approval.title} - run {approval.run_id} ({approval.run.agent}), tool "
            f"{approval.tool}")
    if channel.kind == "slack":
        return {"text": f"{line}\n<{link}|Open the approval>"}
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
            "run": {"id": approval.run_id, "agent": approval.run.agent}}
