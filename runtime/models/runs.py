"""Runs and their steps: what an agent was asked, what each step decided, ran and returned."""

from __future__ import annotations

from django.db import models

from runtime.effects import Effect


class RunStatus(models.TextChoices):
    QUEUED = "queued"
    RUNNING = "running"
    WAITING = "waiting"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


TERMINAL_RUN_STATUSES = (RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED)
# What a person may cancel: a run nobody is executing (queued, or waiting for a decision).
CANCELLABLE_RUN_STATUSES = (RunStatus.QUEUED, RunStatus.WAITING)


class FailureCode(models.TextChoices):
    ERROR = "error"
    REJECTED = "rejected"
    RECONCILE_CONFLICT = "reconcile_conflict"
    POLICY_DENIED = "policy_denied"
    BUDGET_EXCEEDED = "budget_exceeded"
    APPROVAL_EXPIRED = "approval_expired"


class StepStatus(models.TextChoices):
    DECIDING = "deciding"
    EXECUTING = "executing"
    WAITING = "waiting"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    INTERRUPTED = "interrupted"
    REJECTED = "rejected"


IN_FLIGHT_STEP_STATUSES = (StepStatus.DECIDING, StepStatus.EXECUTING)


class Run(models.Model):
    agent = models.CharField(max_length=200)
    input = models.JSONField()
    status = models.CharField(max_length=16, choices=RunStatus.choices, default=RunStatus.QUEUED)
    failure_code = models.CharField(max_length=32, choices=FailureCode.choices, blank=True)
    failure_message = models.TextField(blank=True)
    output = models.JSONField(null=True, blank=True)
    # Tool calls the LLM asked for in one response but that have no step yet; consumed in order.
    planned = models.JSONField(default=list, blank=True)

    lease_owner = models.CharField(max_length=255, blank=True)
    lease_epoch = models.BigIntegerField(default=0, help_text="Fencing token, +1 on every claim.")
    lease_expires_at = models.DateTimeField(null=True, blank=True)

    # Head of the audit chain: the last event's sequence number and hash. Every event append is a
    # compare-and-set on event_seq, which keeps the per-run sequence gapless.
    event_seq = models.BigIntegerField(default=0)
    event_hash = models.CharField(max_length=64, blank=True)

    llm_requests = models.IntegerField(default=0)
    tokens_in = models.BigIntegerField(default=0)
    tokens_out = models.BigIntegerField(default=0)
    cost = models.DecimalField(max_digits=14, decimal_places=6, default=0)

    created_by = models.CharField(max_length=150, blank=True)
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()

    # Set when an occurrence of a schedule created the run: which one, and the standing
    # authorization (its time) that was on at that moment, if any.
    schedule = models.ForeignKey("Schedule", on_delete=models.PROTECT, null=True, blank=True,
                                 related_name="runs", db_index=False)
    occurrence_at = models.DateTimeField(null=True, blank=True)
    authorized_at = models.DateTimeField(null=True, blank=True)
    # Set when the database was restored from a backup taken at this time while the run was
    # unfinished: it may have done more after it, so each of its side effects waits for a person.
    restored_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            # One run per occurrence, whatever races the claim loses.
            models.UniqueConstraint(fields=["schedule", "occurrence_at"],
                                    name="run_one_per_occurrence"),
        ]
        indexes = [
            # The worker's claim query: oldest queued first.
            models.Index(fields=["status", "id"], name="run_status_id"),
            # The takeover sweep: running runs by lease expiry.
            models.Index(fields=["status", "lease_expires_at"], name="run_status_expiry"),
            models.Index(fields=["agent", "id"], name="run_agent_id"),
        ]
        permissions = [("cancel_run", "Can cancel a queued or waiting run")]

    def __str__(self) -> str:
        return f"run {self.pk} ({self.agent}, {self.status})"


class Step(models.Model):
    # No index of its own: the unique (run, index) constraint's index leads with run.
    run = models.ForeignKey(Run, on_delete=models.PROTECT, related_name="steps", db_index=False)
    index = models.IntegerField()
    status = models.CharField(max_length=16, choices=StepStatus.choices)
    # The decided request; empty tool means the LLM gave its final answer at this step.
    tool = models.CharField(max_length=200, blank=True)
    arguments = models.JSONField(null=True, blank=True)
    effect = models.CharField(max_length=16, choices=Effect.choices, blank=True)
    idempotency_key = models.CharField(max_length=80)
    result = models.JSONField(null=True, blank=True)
    error = models.TextField(blank=True)
    attempt = models.IntegerField(default=0)
    # Whether the tool that ran the current attempt promised to call ctx.dispatch() (captured at
    # its start: a later deploy changing the tool must not change what a crash proves).
    dispatches = models.BooleanField(default=False)
    # The attempt whose outbound call was announced by ctx.dispatch(), if any.
    dispatched_attempt = models.IntegerField(null=True, blank=True)
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["run", "index"], name="step_run_index_unique"),
        ]

    def __str__(self) -> str:
        return f"run {self.run_id} step {self.index} ({self.status})"
