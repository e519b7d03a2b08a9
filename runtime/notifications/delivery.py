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
"slack" | "slack_app" | "email", "target": URL, comma-separated addresses or a Slack channel
id, "agents": [...] (default all), "events": ["approval.requested", "approval.decided",
"approval.expired"] (default the first; all three for ``slack_app``)}``.
``RUNTIME_NOTIFY_WEBHOOK`` / ``RUNTIME_NOTIFY_SLACK`` / ``RUNTIME_NOTIFY_EMAIL`` in the
environment add one channel each.
"""

from __future__ import annotations

import logging
import random
import threading
from datetime import datetime, timedelta
from typing import Any

import httpx
from django.core.mail import send_mail
from django.db import connection, transaction

from runtime import crashpoints
from runtime.conf import setting
from runtime.crashpoints import CrashPoint
from runtime.models import (
    Notification,
    NotificationAttempt,
    NotificationStatus,
)
from runtime.notifications.slack import slack_send

log = logging.getLogger("runtime.outbox")

CLAIM_SECONDS = 30.0  # a claimed message is sent again after this if its sender vanished
SEND_TIMEOUT = 10.0


# -- delivery -------------------------------------------------------------------------------


def backoff_seconds(attempt: int) -> float:
    """After the ``attempt``-th failure: 5 s, 10 s, 20 s, … up to an hour, with jitter."""
    base = float(setting("NOTIFY_BACKOFF_SECONDS"))
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
    if n.kind == "slack_app":
        return slack_send(n)
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
    limit = int(setting("NOTIFY_MAX_ATTEMPTS"))
    nxt = None if ok or n.attempts >= limit else now + timedelta(
        seconds=backoff_seconds(n.attempts))
    with transaction.atomic():
        NotificationAttempt.objects.create(notification_id=n.pk, number=n.attempts, at=now,
                                           ok=ok, status_code=code, error=error,
                                           next_attempt_at=nxt)
        mine = Notification.objects.filter(pk=n.pk, status=NotificationStatus.PENDING,
                                           attempts=n.attempts)
        if ok:
            mine.update(status=NotificationStatus.DELIVERED, delivered_at=now, last_error="",
                        reply=n.reply)
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
