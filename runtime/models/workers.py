"""Worker processes and the protocol version the database speaks."""

from __future__ import annotations

from django.db import models


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
    # The agents this process has (it claims runs of these only): what the console checks to
    # say that no live worker can run an agent's queued runs.
    agents = models.JSONField(default=list, blank=True)

    class Meta:
        indexes = [
            # The Workers page and the live-worker counts read by the latest heartbeat.
            models.Index(fields=["heartbeat_at"], name="worker_heartbeat_at"),
        ]

    def __str__(self) -> str:
        return self.owner


class Protocol(models.Model):
    """The runtime protocol this database speaks (one row); workers of another refuse to claim.

    Raised by the migration that changes what workers write (see ``runtime.storage.protocol``)."""

    version = models.IntegerField()

    def __str__(self) -> str:
        return f"protocol {self.version}"
