"""The transactional outbox: one notification per channel that wants it, written in the
transaction that creates, decides or expires the approval (storage's ``approval_written``
signal, connected when the app is ready), so there is no approval without its notification
and none for a change that rolled back."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from runtime.approvals.rules import DECIDED_STATUS
from runtime.models import Approval, ApprovalStatus, Notification, NotificationStatus
from runtime.notifications.channels import _body, channels, email_targets

DECIDED = frozenset(DECIDED_STATUS.values())  # what a person's decision moves it to


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
        # A group's members are read now; a long list is split over several messages.
        targets = email_targets(channel) if channel.group else [channel.target]
        for n, target in enumerate(targets or [""]):
            key = f"approval-{approval_id}-{event}-{channel.name}" + (f"-{n + 1}" if n else "")
            Notification.objects.create(
                approval_id=approval_id, event=event, channel=channel.name, kind=channel.kind,
                target=target, body=_body(channel, event, approval, key, at),
                idempotency_key=key, next_attempt_at=at, created_at=at,
                # Nobody in the group to mail: on the record (the admin lists it), not sent.
                **({} if target else {"status": NotificationStatus.FAILED, "last_error":
                   f"group {channel.group!r} has no active user with an email address"}))
            made += 1
    return made


def event_of_status(status: str) -> str | None:
    """The notification event an approval's creation ("pending") or move to ``status`` is,
    if any (a consumption or a cancellation tells nobody)."""
    if status == ApprovalStatus.PENDING:
        return "approval.requested"
    if status in DECIDED:
        return "approval.decided"
    if status == ApprovalStatus.EXPIRED:
        return "approval.expired"
    return None


def outbox_on_approval_written(sender: Any, *, approval_id: int, status: str, at: datetime,
                               **kwargs: Any) -> None:
    """``approval_written``'s receiver: the notifications the change calls for, in its
    transaction."""
    event = event_of_status(status)
    if event is not None:
        outbox_enqueue_in_tx(approval_id, event, at)


def outbox_on_deadline_near(sender: Any, *, approval_id: int, event: str, at: datetime,
                            **kwargs: Any) -> int:
    """``approvals.deadlines.approval_deadline_near``'s receiver: the warning
    (``approval.expiring``) or the escalation (``approval.escalated``), in the transaction that
    marks the approval warned or escalated. Returns how many notifications it wrote."""
    return outbox_enqueue_in_tx(approval_id, event, at)
