"""Schedules and the chain of their changes."""

from __future__ import annotations

from django.db import models


class Schedule(models.Model):
    """Runs of an agent created on a cron expression or a fixed interval, in a time zone.

    Every change is an event of the schedule's own hash chain (``ScheduleEvent``), made only by
    ``runtime.schedules.changes``; ``next_fire_at`` is the occurrence a worker claims next (a
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
