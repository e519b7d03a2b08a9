"""Backups taken of this database and restores from them: what a restored database knows of its
own past (the restore fence, ``runtime.backups.restore``)."""

from __future__ import annotations

from django.db import models


class Backup(models.Model):
    """A backup begun: committed before the copy's snapshot, so the copy holds its own row and a
    restore knows the moment its data is from (at or after ``taken_at``)."""

    taken_at = models.DateTimeField()
    by = models.CharField(max_length=150, blank=True)
    engine = models.CharField(max_length=20)
    path = models.CharField(max_length=1000, blank=True)

    def __str__(self) -> str:
        return f"backup {self.pk} at {self.taken_at}"


class Restoration(models.Model):
    """A restore of this database from a backup; each one begins a new generation, and every
    run unfinished at the backup's moment was held for a person (``Run.restored_at``)."""

    at = models.DateTimeField()
    by = models.CharField(max_length=150, blank=True)
    backup_taken_at = models.DateTimeField()
    runs_held = models.IntegerField(default=0)
    # The newest signed audit checkpoint this restore acknowledged as ahead of the data: workers
    # compare the checkpoints in RUNTIME_CHECKPOINT_DIR against the database only past it.
    checkpoint_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"restore {self.pk} (backup of {self.backup_taken_at})"
