"""The audit log: each run's events, the global chain of run creations, and checkpoints of every
head."""

from __future__ import annotations

from django.db import models

from runtime.models.runs import Run


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


class AuditExport(models.Model):
    """One export of the audit log taken away (``manage.py auditexport``, the admin's download):
    who took which rows, hash-chained after the export before and append-only, like the
    checkpoints. Recorded when the export ends, also when it stopped part-way (``complete`` is
    then false and ``rows`` counts what was written)."""

    seq = models.BigIntegerField(unique=True)
    at = models.DateTimeField()
    by = models.CharField(max_length=150, blank=True)
    what = models.CharField(max_length=16)  # "events" or "decisions"
    format = models.CharField(max_length=8)  # "csv" or "jsonl"
    filters = models.JSONField(default=dict)
    rows = models.BigIntegerField()
    complete = models.BooleanField()
    last_hash = models.CharField(max_length=64, blank=True,
                                 help_text="The chain hash on the export's last line.")
    sha256 = models.CharField(max_length=64, help_text="SHA-256 of the exported bytes.")
    prev_hash = models.CharField(max_length=64, blank=True)
    hash = models.CharField(max_length=64)

    class Meta:
        permissions = [("export_audit", "Can export the audit log")]

    def __str__(self) -> str:
        return f"export #{self.seq} ({self.rows} {self.what})"
