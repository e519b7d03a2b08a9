"""Approvals: a request put before a person, and what they decided."""

from __future__ import annotations

from django.db import models

from runtime.models.runs import Effect, Run, Step, StepStatus


class ApprovalKind(models.TextChoices):
    POLICY = "policy"
    INTERRUPTED_SIDE_EFFECT = "interrupted_side_effect"
    RECONCILE = "reconcile"
    RESTORED = "restored"  # the database was restored: this call may have happened after it


def held_step_status(kind: str, attempt: int) -> str:
    """The status of the step an approval of ``kind`` holds: a policy approval asks before the
    call ever started (waiting); a restored one waits too unless the step had started before
    (interrupted), as every other kind. The loop pauses and replay reads back by this rule."""
    if kind == ApprovalKind.POLICY or (kind == ApprovalKind.RESTORED and not attempt):
        return StepStatus.WAITING
    return StepStatus.INTERRUPTED


class ApprovalStatus(models.TextChoices):
    PENDING = "pending"
    APPROVED = "approved"
    REJECTED = "rejected"
    RESOLVED = "resolved"
    CONSUMED = "consumed"
    CANCELLED = "cancelled"
    EXPIRED = "expired"


class Approval(models.Model):
    run = models.ForeignKey(Run, on_delete=models.PROTECT, related_name="approvals")
    step = models.ForeignKey(Step, on_delete=models.PROTECT, related_name="approvals")
    kind = models.CharField(max_length=32, choices=ApprovalKind.choices)
    status = models.CharField(
        max_length=16, choices=ApprovalStatus.choices, default=ApprovalStatus.PENDING
    )
    tool = models.CharField(max_length=200)
    arguments = models.JSONField()
    effect = models.CharField(max_length=16, choices=Effect.choices)
    digest = models.CharField(max_length=64, help_text="SHA-256 of the request's canonical JSON.")
    title = models.CharField(max_length=300)
    detail = models.TextField(blank=True)
    created_at = models.DateTimeField()
    decided_by = models.CharField(max_length=150, blank=True)
    decided_at = models.DateTimeField(null=True, blank=True)
    note = models.TextField(blank=True)
    result = models.JSONField(null=True, blank=True, help_text="The recovered result of a resolve.")
    consumed_at = models.DateTimeField(null=True, blank=True)
    # Past this with no decision the approval ends ``expired`` and its run fails.
    expires_at = models.DateTimeField(null=True, blank=True)
    # A warning before the deadline and an escalation when nobody decided by then were
    # enqueued at these times (each once: a compare-and-set from null).
    warned_at = models.DateTimeField(null=True, blank=True)
    escalated_at = models.DateTimeField(null=True, blank=True)
    # A policy approval allowed with edited arguments: the request that ran (``arguments`` and
    # ``digest`` stay what the agent proposed) and who edited it.
    effective_arguments = models.JSONField(null=True, blank=True)
    effective_digest = models.CharField(max_length=64, blank=True)
    edited_by = models.CharField(max_length=150, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["step"],
                condition=models.Q(status__in=["pending", "approved"]),
                name="approval_one_open_per_step",
            ),
        ]
        indexes = [
            models.Index(fields=["status", "created_at"], name="approval_status_created"),
            # The expiry sweep: pending approvals by deadline (most have none).
            models.Index(fields=["status", "expires_at"], name="approval_status_expires",
                         condition=models.Q(expires_at__isnull=False)),
        ]
        permissions = [("decide_approval", "Can approve, reject or resolve approvals")]

    def __str__(self) -> str:
        return f"approval {self.pk} ({self.kind}, {self.status})"
