"""The runtime's tables: runs, steps, the audit log, approvals and worker processes.

State is changed only by the store functions (``runtime.store`` and friends), each writing the
state change and its audit event in one transaction. Nothing here writes on save.
"""

from __future__ import annotations

from django.db import models


class RunStatus(models.TextChoices):
    QUEUED = "queued"
    RUNNING = "running"
    WAITING = "waiting"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


TERMINAL_RUN_STATUSES = (RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED)


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


class Effect(models.TextChoices):
    READ_ONLY = "read_only"
    SIDE_EFFECT = "side_effect"


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


class Event(models.Model):
    """One entry of the append-only audit log; the database refuses UPDATE and DELETE."""

    # No index of its own: the unique (run, seq) constraint's index leads with run; one index
    # fewer to write for every event.
    run = models.ForeignKey(Run, on_delete=models.PROTECT, related_name="events", db_index=False)
    step_index = models.IntegerField(null=True, blank=True)
    seq = models.BigIntegerField()
    kind = models.CharField(max_length=40)
    payload = models.JSONField(default=dict)
    actor = models.CharField(max_length=255)
    at = models.DateTimeField()
    hash = models.CharField(max_length=64)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["run", "seq"], name="event_run_seq_unique"),
        ]
        indexes = [
            models.Index(fields=["at"], name="event_at"),
            models.Index(fields=["kind", "at"], name="event_kind_at"),
            models.Index(fields=["actor", "at"], name="event_actor_at"),  # the admin's filter
        ]

    def __str__(self) -> str:
        return f"run {self.run_id} #{self.seq} {self.kind}"


class ApprovalKind(models.TextChoices):
    POLICY = "policy"
    INTERRUPTED_SIDE_EFFECT = "interrupted_side_effect"
    RECONCILE = "reconcile"


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


class Worker(models.Model):
    """One live ``runworker`` process; kept fresh by its heartbeat, removed on clean exit."""

    owner = models.CharField(max_length=255, unique=True)
    name = models.CharField(max_length=100, blank=True)
    host = models.CharField(max_length=255)
    pid = models.IntegerField()
    boot_id = models.CharField(max_length=64, blank=True)
    # The process's start time in clock ticks since boot (/proc/PID/stat): tells a reused pid
    # from the original process, for same-host instant takeover.
    proc_start = models.BigIntegerField(null=True, blank=True)
    lease_seconds = models.FloatField(default=30)
    started_at = models.DateTimeField()
    heartbeat_at = models.DateTimeField()
    concurrency = models.IntegerField(default=1)
    runs_held = models.IntegerField(default=0)

    def __str__(self) -> str:
        return self.owner


class Protocol(models.Model):
    """The runtime protocol this database speaks (one row); workers of another refuse to claim.

    Raised by the migration that changes what workers write (see ``runtime.protocol``)."""

    version = models.IntegerField()

    def __str__(self) -> str:
        return f"protocol {self.version}"


class RunCreation(models.Model):
    """The global audit chain: one entry per run ever created, each hashed after the one before.

    A run deleted with its events still leaves its entry (there is no foreign key to cascade or
    protect), and an entry deleted leaves a gap in ``seq``; ``first_hash`` ties the entry to the
    run's own chain, so its ``run.created`` event cannot be rewritten unnoticed. Append-only in
    the database, like the events.
    """

    seq = models.BigIntegerField(unique=True)
    run_id = models.BigIntegerField(unique=True)
    agent = models.CharField(max_length=200)
    created_by = models.CharField(max_length=150, blank=True)
    at = models.DateTimeField()
    first_hash = models.CharField(max_length=64, help_text="The hash of the run's event #1.")
    hash = models.CharField(max_length=64)

    def __str__(self) -> str:
        return f"creation #{self.seq}: run {self.run_id}"


class AuditCheckpoint(models.Model):
    """A checkpoint of every chain head, also written (signed) to a file kept off this database.

    The row records that the checkpoint was taken and chains the checkpoints together; the
    signed file, which holds each run's head, is what proves nothing before it changed.
    """

    seq = models.BigIntegerField(unique=True)
    at = models.DateTimeField()
    by = models.CharField(max_length=150, blank=True)
    creations_seq = models.BigIntegerField()
    creations_hash = models.CharField(max_length=64, blank=True)
    runs = models.BigIntegerField()
    heads_digest = models.CharField(max_length=64)
    prev_hash = models.CharField(max_length=64, blank=True)
    hash = models.CharField(max_length=64)

    def __str__(self) -> str:
        return f"checkpoint #{self.seq} ({self.runs} runs)"


class Schedule(models.Model):
    """Runs of an agent created on a cron expression or a fixed interval, in a time zone.

    Every change is an event of the schedule's own hash chain (``ScheduleEvent``), made only by
    ``runtime.schedules``; ``next_fire_at`` is the occurrence a worker claims next (a
    compare-and-set on it makes one occurrence one run)."""

    name = models.CharField(max_length=100, unique=True)
    agent = models.CharField(max_length=200)
    input = models.JSONField()
    cron = models.CharField(max_length=100, blank=True)
    interval_seconds = models.IntegerField(null=True, blank=True)
    timezone = models.CharField(max_length=64, default="UTC")
    enabled = models.BooleanField(default=True)
    next_fire_at = models.DateTimeField(null=True, blank=True)
    # Removed schedules stay (their runs and events refer to them), disabled and unlisted.
    removed_at = models.DateTimeField(null=True, blank=True)
    # The standing authorization: who turned it on and when (kept when turned off, for the page).
    authorize_side_effects = models.BooleanField(default=False)
    authorized_by = models.CharField(max_length=150, blank=True)
    authorized_at = models.DateTimeField(null=True, blank=True)
    created_by = models.CharField(max_length=150, blank=True)
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()
    event_seq = models.BigIntegerField(default=0)
    event_hash = models.CharField(max_length=64, blank=True)

    class Meta:
        indexes = [models.Index(fields=["enabled", "next_fire_at"], name="schedule_due")]
        permissions = [("manage_schedule", "Can create, edit and authorize schedules")]

    def __str__(self) -> str:
        return f"schedule {self.name}"


class ScheduleEvent(models.Model):
    """One change of a schedule, hash-chained per schedule; append-only like run events."""

    schedule = models.ForeignKey(Schedule, on_delete=models.PROTECT, related_name="events",
                                 db_index=False)
    seq = models.BigIntegerField()
    kind = models.CharField(max_length=40)
    payload = models.JSONField(default=dict)
    actor = models.CharField(max_length=255)
    at = models.DateTimeField()
    hash = models.CharField(max_length=64)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["schedule", "seq"],
                                               name="schedule_event_seq_unique")]

    def __str__(self) -> str:
        return f"schedule {self.schedule_id} #{self.seq} {self.kind}"


class NotificationStatus(models.TextChoices):
    PENDING = "pending"
    DELIVERED = "delivered"
    FAILED = "failed"  # gave up after the last retry


class Notification(models.Model):
    """One message to one channel about an approval: the transactional outbox.

    Written in the transaction that requests (or decides, or expires) the approval, so there is
    no approval without its notification and none for a pause that rolled back; delivered by
    the workers at least once (``runtime.outbox``), each attempt recorded.
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
