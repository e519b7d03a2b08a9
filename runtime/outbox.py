"""Notifications about approvals: a transactional outbox, delivered at least once.

An approval nobody sees is a run that never ends. When an approval is requested (and, if a
channel asks for it, decided or expired), one ``Notification`` row per configured channel is
written in the same transaction as the approval's event: no approval without its notification,
no notification for a pause that rolled back. Workers deliver them (``OutboxSender``): claim one
by moving its next-attempt time past the attempt (a compare-and-set), send it, record the
attempt. A sender that dies between sending and recording leaves it to be sent again when the
claim runs out: delivery is at least once, and every message carries an idempotency key (the
same on every attempt) so a receiver can drop repeats. Failures are retried with exponential
backoff up to ``NOTIFY_MAX_ATTEMPTS``.

Channels (settings ``RUNTIME["NOTIFY"]``, a list): ``{"name": "ops", "kind": "webhook" |
"slack" | "email", "target": URL or comma-separated addresses, "agents": [...] (default all),
"events": ["approval.requested", "approval.decided", "approval.expired"] (default the
first)}``. ``RUNTIME_NOTIFY_WEBHOOK`` / ``RUNTIME_NOTIFY_SLACK`` / ``RUNTIME_NOTIFY_EMAIL`` in
the environment add one channel each.
"""

from __future__ import annotations

import logging
import random
import threading
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import httpx
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.mail import send_mail
from django.db import transaction

from . import crashpoints
from .crashpoints import CrashPoint
from .models import (
    Approval,
    ApprovalStatus,
    Notification,
    NotificationAttempt,
    NotificationStatus,
)

log = logging.getLogger("runtime.outbox")

EVENTS = ("approval.requested", "approval.decided", "approval.expired")
KINDS = ("webhook", "slack", "email")
DECIDED = (ApprovalStatus.APPROVED, ApprovalStatus.REJECTED, ApprovalStatus.RESOLVED)
CLAIM_SECONDS = 30.0  # a claimed message is sent again after this if its sender vanished
SEND_TIMEOUT = 10.0


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
    for n, raw in enumerate(settings.RUNTIME.get("NOTIFY") or []):
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
                           None if agents in (None, "*") else frozenset(agents), events))
    return out


def approval_link(approval_id: int) -> str:
    """Where a person decides (settings ``RUNTIME["APPROVAL_URL"]``, ``{id}`` filled in)."""
    pattern = settings.RUNTIME.get("APPROVAL_URL") or "http://127.0.0.1:8000/approvals/{id}/"
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


def outbox_enqueue_in_tx(approval_id: int, event: str, at: datetime) -> int:
    """One notification per channel that wants ``event`` for the approval's agent, inside the
    caller's transaction (the one writing the approval's event). Returns how many."""
    configured = channels()
    if not configured:
        return 0
    approval = Approval.objects.select_related("run").get(pk=approval_id)
    made = 0
    for channel in configured:
        if not channel.wants(approval.run.agent, event):
            continue
        key = f"approval-{approval_id}-{event}-{channel.name}"
        Notification.objects.create(
            approval_id=approval_id, event=event, channel=channel.name, kind=channel.kind,
            target=channel.target, body=_body(channel, event, approval, key),
            idempotency_key=key, next_attempt_at=at, created_at=at)
        made += 1
    return made


def event_of_move(status: str) -> str | None:
    """The notification event an approval's move to ``status`` is, if any."""
    if status in DECIDED:
        return "approval.decided"
    if status == ApprovalStatus.EXPIRED:
        return "approval.expired"
    return None


# -- delivery -------------------------------------------------------------------------------


def backoff_seconds(attempt: int) -> float:
    """After the ``attempt``-th failure: 5 s, 10 s, 20 s, … up to an hour, with jitter."""
    base = float(settings.RUNTIME.get("NOTIFY_BACKOFF_SECONDS", 5.0))
    return min(base * 2 ** (attempt - 1), 3600.0) * random.uniform(0.8, 1.0)


def outbox_claim(now: datetime, limit: int = 20) -> list[Notification]:
    """Take up to ``limit`` due notifications: each a compare-and-set on (attempts,
    next_attempt_at), so two senders never take the same attempt."""
    due = list(Notification.objects.filter(status=NotificationStatus.PENDING,
                                           next_attempt_at__lte=now)
               .order_by("next_attempt_at")[:limit])
    claimed = []
    for n in due:
        with transaction.atomic():
            moved = Notification.objects.filter(
                pk=n.pk, status=NotificationStatus.PENDING, attempts=n.attempts,
                next_attempt_at=n.next_attempt_at).update(
                attempts=n.attempts + 1, next_attempt_at=now + timedelta(seconds=CLAIM_SECONDS))
        if moved == 1:
            n.attempts += 1
            claimed.append(n)
    return claimed


def outbox_send(n: Notification) -> tuple[bool, int | None, str]:
    """Send one message: (delivered, HTTP status, error)."""
    if n.kind == "email":
        to = [a.strip() for a in n.target.split(",") if a.strip()]
        try:
            send_mail(n.body["subject"], n.body["text"], None, to, fail_silently=False)
        except Exception as exc:  # any mail failure is this attempt's error, retried later
            return False, None, f"{type(exc).__name__}: {exc}"[:1000]
        return True, None, ""
    try:
        reply = httpx.post(n.target, json=n.body, timeout=SEND_TIMEOUT, headers={
            "Idempotency-Key": n.idempotency_key, "User-Agent": "agent-runtime-notify"})
    except httpx.HTTPError as exc:
        return False, None, f"{type(exc).__name__}: {exc}"[:1000]
    if 200 <= reply.status_code < 300:
        return True, reply.status_code, ""
    return False, reply.status_code, f"HTTP {reply.status_code}: {reply.text[:300]}"


def outbox_record(n: Notification, ok: bool, code: int | None, error: str,
                  now: datetime) -> None:
    """Record the attempt and the notification's new state (only if it is still this
    attempt's: a slow sender whose claim ran out records its attempt, changes nothing else)."""
    limit = int(settings.RUNTIME.get("NOTIFY_MAX_ATTEMPTS", 30))
    nxt = None if ok or n.attempts >= limit else now + timedelta(
        seconds=backoff_seconds(n.attempts))
    with transaction.atomic():
        NotificationAttempt.objects.create(notification_id=n.pk, number=n.attempts, at=now,
                                           ok=ok, status_code=code, error=error,
                                           next_attempt_at=nxt)
        mine = Notification.objects.filter(pk=n.pk, status=NotificationStatus.PENDING,
                                           attempts=n.attempts)
        if ok:
            mine.update(status=NotificationStatus.DELIVERED, delivered_at=now, last_error="")
        elif nxt is None:
            mine.update(status=NotificationStatus.FAILED, last_error=error)
        else:
            mine.update(next_attempt_at=nxt, last_error=error)


def outbox_deliver_due(clock: Any, limit: int = 20) -> int:
    """Claim, send and record what is due; how many were delivered."""
    delivered = 0
    for n in outbox_claim(clock.now(), limit):
        ok, code, error = outbox_send(n)
        crashpoints.reached(CrashPoint.AFTER_NOTIFICATION_SENT, run_id=None, step_index=None)
        outbox_record(n, ok, code, error, clock.now())
        if ok:
            delivered += 1
        else:
            log.warning("notification %s to %s (%s), attempt %d: %s", n.pk, n.channel, n.kind,
                        n.attempts, error)
    return delivered


class OutboxSender(threading.Thread):
    """A worker's delivery thread: sending waits on the network, so it never holds up claims.
    Database faults and send errors are logged and ridden out."""

    def __init__(self, clock: Any, interval: float = 1.0) -> None:
        super().__init__(name="outbox", daemon=True)
        self.clock, self.interval = clock, interval
        self.stopping = threading.Event()

    def run(self) -> None:
        from django.db import connection

        try:
            while not self.stopping.is_set():
                try:
                    if outbox_deliver_due(self.clock) == 0:
                        self.stopping.wait(self.interval)
                except Exception:  # a database fault, or a bug: the next round tries again
                    log.exception("delivering notifications failed; retrying")
                    connection.close()
                    self.stopping.wait(self.interval)
        finally:
            connection.close()

    def stop(self) -> None:
        self.stopping.set()
