"""Retention: finished runs archived to files and removed from the database, every batch on
the record (``manage.py prune``, ``runtime.retention``)."""

from __future__ import annotations

from django.db import models


class Pruning(models.Model):
    """One batch of finished runs archived to a file and removed, hash-chained after the batch
    before (like the checkpoints) and append-only in the database.

    ``archive_sha256`` ties the file to the record; ``heads_digest`` covers the batch's
    ``PrunedRun`` rows; ``checkpoint_seq`` is the signed checkpoint taken before the prune
    began (None when the operator pruned without one)."""

    seq = models.BigIntegerField(unique=True)
    at = models.DateTimeField()
    by = models.CharField(max_length=150, blank=True)
    finished_before = models.DateTimeField()
    checkpoint_seq = models.BigIntegerField(null=True, blank=True)
    first_run_id = models.BigIntegerField()
    last_run_id = models.BigIntegerField()
    runs = models.IntegerField()
    events = models.BigIntegerField()
    heads_digest = models.CharField(max_length=64)
    archive = models.CharField(max_length=255, help_text="The archive file's name.")
    archive_sha256 = models.CharField(max_length=64)
    prev_hash = models.CharField(max_length=64, blank=True)
    hash = models.CharField(max_length=64)

    def __str__(self) -> str:
        return f"pruning #{self.seq} ({self.runs} runs, {self.archive})"


class PrunedRun(models.Model):
    """A run archived and removed, with its chain's head as it was removed.

    Also the permit: the append-only trigger on events lets a run's events be deleted only
    while the run is entered here, which the prune does in the transaction that deletes them;
    the entry stays (append-only), so no event ever disappears without this record. The global
    chain keeps the run's creation entry, and ``verifyaudit`` takes a run entered here as
    pruned rather than deleted."""

    run_id = models.BigIntegerField(unique=True)
    pruning_seq = models.BigIntegerField(db_index=True)
    event_seq = models.BigIntegerField()
    event_hash = models.CharField(max_length=64)

    def __str__(self) -> str:
        return f"run {self.run_id} pruned (#{self.pruning_seq})"


class RetiredTotal(models.Model):
    """What rows removed by retention had counted toward a total the metrics read from the
    tables (takeovers, decisions and their latency, expiries, failed deliveries), added in the
    transaction that removes them: a total read at scrape time then never falls, which
    Prometheus would take for a counter reset (``runtime.retention.totals``)."""

    name = models.CharField(max_length=100, unique=True)
    value = models.FloatField(default=0)

    def __str__(self) -> str:
        return f"{self.name} = {self.value:g}"
