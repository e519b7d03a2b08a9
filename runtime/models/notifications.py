"""Notifications about approvals (the transactional outbox) and each delivery attempt."""

from __future__ import annotations

from django.db import models

from runtime.models.approvals import Approval


class NotificationStatus(models.TextChoices):
    PENDING = "pending"
    DELIVERED = "delivered"
    FAILED = "failed"  # gave up after the last retry


class Notification(models.Model):
    """One message to one channel about an approval: the transactional outbox.

    Written in the transaction that requests (or decides, or expires) the approval, so there is
    no approval without its notification and none for a pause that rolled back; delivered by
    the workers at least once (``runtime.notifications.delivery``), each attempt recorded.
    """

    approval = models.ForeignKey(Approval, on_delete=models.PROTECT, related_name="notifications")
    event = models.CharField(max_length=40)
    channel = models.CharField(max_length=100)
    kind = models.CharField(max_length=16)  # webhook, slack, email
    target = models.CharField(max_length=500)  # the URL or the addresses
    body = models.JSONField()
    idempotency_key = models.CharField(max_length=100, unique=True)
    status = models.CharField(max_length=16, choices=NotificationStatus.choices,
                              default=NotificationStatus.PENDING)
    attempts = models.IntegerField(default=0)
    # When it may be tried next; a sender claiming it moves this past its own attempt, so a
    # sender that dies mid-delivery leaves it to be tried again (at least once, never lost).
    next_attempt_at = models.DateTimeField()
    last_error = models.TextField(blank=True)
    created_at = models.DateTimeField()
    delivered_at = models.DateTimeField(null=True, blank=True)
    # What the receiver answered that later messages need (a Slack message's channel and ts,
    # so the message can be updated with the outcome).
    reply = models.JSONField(default=dict, blank=True)

    class Meta:
        indexes = [models.Index(fields=["status", "next_attempt_at"], name="notification_due")]

    def __str__(self) -> str:
        return f"notification {self.pk} ({self.channel}, {self.status})"


class NotificationAttempt(models.Model):
    """One delivery attempt: when, whether it worked, the error, and when the next one is due."""

    notification = models.ForeignKey(Notification, on_delete=models.CASCADE,
                                     related_name="attempt_log")
    number = models.IntegerField()
    at = models.DateTimeField()
    ok = models.BooleanField()
    status_code = models.IntegerField(null=True, blank=True)
    error = models.TextField(blank=True)
    next_attempt_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"attempt {self.number} of notification {self.notification_id}"
