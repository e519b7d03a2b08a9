"""``manage.py prune --finished-before DATE --archive DIR``: archive finished runs, then remove
them, in small batches while workers keep running (design §12b).

The order is what makes a crash harmless. First a signed audit checkpoint (kept in DIR), so the
archived runs can later be proved against heads nobody could rewrite. Then, per batch of runs
(100 by default, lowest ids first): read everything each run owns, check its chain and its
rows (a run that does not verify is left in place, as evidence, and reported), write the batch's
archive file whole and sync it; only then one transaction enters the ``Pruning`` and its
``PrunedRun`` rows (the events' DELETE permit) and deletes the runs' rows, each DELETE guarded
by the run's finished status. A crash before that commit leaves the runs in the database and a
file the next prune writes again under the same name (a pruning's number is its file's); after
it, the runs are gone and on record. A run counts as finished before DATE by ``updated_at``:
the time of the commit that wrote its last event, which for a finished run is its finish.
"""

from __future__ import annotations

import bisect
import fcntl
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from django.db import DatabaseError, IntegrityError, connections, transaction
from django.db.models import Exists, OuterRef

from runtime import crashpoints
from runtime.audit.checkpoint import audit_key, checkpoint_take, checkpoint_write
from runtime.crashpoints import CrashPoint
from runtime.errors import ArchiveRefused, AuditKeyError, PruneRefused
from runtime.host.files import open_private, private_dir
from runtime.models import (
    TERMINAL_RUN_STATUSES,
    Approval,
    AuditCheckpoint,
    Event,
    Notification,
    NotificationAttempt,
    NotificationStatus,
    Run,
    Step,
)
from runtime.retention.archive import (
    FORMAT,
    VERSION,
    archive_load,
    archive_name,
    archive_write,
    checkpoint_name,
    runs_read,
)
from runtime.retention.record import next_pruning_seq, pruning_append_in_tx, pruning_fields
from runtime.retention.totals import retire_in_tx, totals
from runtime.retention.verify import record_head, record_problems

DEFAULT_BATCH = 100
MAX_BATCH = 1000
_PRUNE_LOCK = 0x72756E7072756E65  # "runprune": one prune at a time on a PostgreSQL database


@dataclass
class PruneReport:
    """What a prune did: the checkpoint it took, the prunings it recorded, the runs it left."""

    checkpoint: int | None = None
    prunings: list[int] = field(default_factory=list)
    runs: int = 0
    events: int = 0
    broken: list[int] = field(default_factory=list)  # left in place: they do not verify
    notifying: int = 0  # left for now: a notification about them is still being delivered


def runs_prune(*, finished_before: datetime, directory: str | os.PathLike[str], by: str,
               now: datetime, batch: int = DEFAULT_BATCH, checkpoint: bool = True,
               using: str = "default",
               report: Callable[[str], None] = lambda line: None) -> PruneReport:
    """Archive every run that finished before ``finished_before`` into ``directory``, then
    remove it; see the module's docstring. ``PruneRefused`` (nothing changed by this call
    before it, beyond whole batches) for a bad argument, a missing key, a role that may not
    delete events, or another prune at the same moment."""

    if finished_before.tzinfo is None:
        raise PruneRefused("the date has no time zone")
    if finished_before > now:
        raise PruneRefused(f"{finished_before.isoformat()} is in the future: every finished "
                           "run would go; give a date up to now")
    if not 1 <= batch <= MAX_BATCH:
        raise PruneRefused(f"a batch is 1 to {MAX_BATCH} runs, not {batch}")
    if checkpoint:
        try:
            audit_key()
        except AuditKeyError as exc:
            raise PruneRefused(
                f"{exc.reason}: a prune takes a signed audit checkpoint first, so the archived "
                "runs can be proved against it. Set RUNTIME_AUDIT_KEY, or pass --no-checkpoint "
                "to prune without one") from None
    _may_delete_events(using)
    target = _directory(directory)
    with _exclusive(target, using):
        out = PruneReport()
        heads: list[int] | None = None
        if checkpoint:
            _checkpoint_free(target, _next_checkpoint_seq(using))
            doc = checkpoint_take(by=by, now=now, using=using)
            _checkpoint_free(target, doc["checkpoint"])  # another was taken meanwhile
            checkpoint_write(doc, target / checkpoint_name(doc["checkpoint"]))
            out.checkpoint = doc["checkpoint"]
            heads = [h[0] for h in doc["heads"]]  # in id order: the runs it names
            report(f"checkpoint #{out.checkpoint} of {doc['runs']} runs written to "
                   f"{target / checkpoint_name(out.checkpoint)}")
        for ids in _candidates(finished_before, batch, using):
            if heads is not None:
                ids = [i for i in ids if _named(heads, i)]
            records = []
            for record in runs_read(ids, using):
                problems = record_problems(record)
                if problems:
                    out.broken.append(record["run"]["id"])
                    report(f"run {record['run']['id']} left in place: it does not verify "
                           f"({problems[0]})")
                else:
                    records.append(record)
            if records:
                _batch_prune(records, target=target, finished_before=finished_before, by=by,
                             now=now, checkpoint_seq=out.checkpoint, using=using, out=out,
                             report=report)
        out.notifying = _notifying(finished_before, using).count()
    return out


def _may_delete_events(using: str) -> None:
    """Refuse up front where the database role may not delete events at all (PostgreSQL's audit
    role: ``manage.py auditrole``), rather than after the checkpoint and the first archive."""
    connection = connections[using]
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cur:
        cur.execute("SELECT current_user, has_table_privilege(current_user, %s, 'DELETE')",
                    [Event._meta.db_table])
        role, allowed = cur.fetchone()
    if not allowed:
        raise PruneRefused(
            f"the database role {role} may not delete events (the application role of "
            "`manage.py auditrole`): run prune with the tables' owner's DATABASE_URL, the one "
            "migrations run with")


def _directory(directory: str | os.PathLike[str]) -> Path:
    path = Path(directory)
    if path.exists() and not path.is_dir():
        raise PruneRefused(f"{path} is not a directory")
    try:
        private_dir(path)
    except OSError as exc:
        raise PruneRefused(f"cannot make the archive directory {path}: {exc.strerror}") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise PruneRefused(f"the archive directory {path} is not writable")
    return path


@contextmanager
def _exclusive(target: Path, using: str) -> Iterator[None]:
    """One prune at a time: per archive directory (a lock file in it), and on PostgreSQL per
    database (a session advisory lock). Two prunes on one SQLite file with two directories
    still cannot both record a batch: the second's ``seq`` is taken (``PruneRefused``)."""
    fd = open_private(target / ".prune.lock", os.O_RDWR)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise PruneRefused(f"another prune is writing to {target}") from None
        connection = connections[using]
        if connection.vendor != "postgresql":
            yield
            return
        with connection.cursor() as cur:
            cur.execute("SELECT pg_try_advisory_lock(%s)", [_PRUNE_LOCK])
            if not cur.fetchone()[0]:
                raise PruneRefused("another prune is running on this database")
        try:
            yield
        finally:
            with connection.cursor() as cur:
                cur.execute("SELECT pg_advisory_unlock(%s)", [_PRUNE_LOCK])
    finally:
        os.close(fd)


def _next_checkpoint_seq(using: str) -> int:
    last = AuditCheckpoint.objects.using(using).order_by("-seq").values_list(
        "seq", flat=True).first()
    return 1 if last is None else last + 1


def _checkpoint_free(target: Path, seq: int) -> None:
    """Refuse to overwrite a checkpoint file: one of this number in the directory was taken
    by another database, or by this one before it was restored from an older backup."""
    if (target / checkpoint_name(seq)).exists():
        raise PruneRefused(f"{target / checkpoint_name(seq)} exists: the directory holds "
                           "another database's archive, or this one's from before a restore; "
                           "give another directory")


def _notifying(finished_before: datetime, using: str) -> Any:
    """Finished runs with a notification still to deliver about one of their approvals."""
    pending = Notification.objects.using(using).filter(
        status=NotificationStatus.PENDING, approval__run_id=OuterRef("pk"))
    return Run.objects.using(using).filter(
        status__in=TERMINAL_RUN_STATUSES, updated_at__lt=finished_before).filter(Exists(pending))


def _candidates(finished_before: datetime, batch: int, using: str) -> Iterator[list[int]]:
    """Ids of finished runs, ``batch`` at a time, lowest first; runs a notification is still
    being delivered about wait for a later prune (the outbox needs their approval)."""
    pending = Notification.objects.using(using).filter(
        status=NotificationStatus.PENDING, approval__run_id=OuterRef("pk"))
    cursor = 0
    while True:
        ids = list(Run.objects.using(using).filter(
            status__in=TERMINAL_RUN_STATUSES, updated_at__lt=finished_before, pk__gt=cursor,
        ).filter(~Exists(pending)).order_by("pk").values_list("pk", flat=True)[:batch])
        if not ids:
            return
        yield ids
        cursor = ids[-1]


def _named(ids: list[int], run_id: int) -> bool:
    at = bisect.bisect_left(ids, run_id)
    return at < len(ids) and ids[at] == run_id


def _batch_prune(records: list[dict[str, Any]], *, target: Path, finished_before: datetime,
                 by: str, now: datetime, checkpoint_seq: int | None, using: str,
                 out: PruneReport, report: Callable[[str], None]) -> None:
    """Archive one batch, synced, then remove it in one transaction with its record."""
    seq = next_pruning_seq(using)
    name = archive_name(seq)
    heads = [record_head(r) for r in records]
    events = sum(h[1] for h in heads)
    header = {"format": FORMAT, "version": VERSION, "pruning": seq,
              "checkpoint": checkpoint_seq, "finished_before": finished_before.isoformat(),
              "runs": len(records)}
    _replaceable(target / name, using)
    try:
        sha256 = archive_write(target / name, header, records)
    except OSError as exc:
        raise PruneRefused(f"cannot write {target / name}: {exc.strerror or exc}") from None
    crashpoints.reached(CrashPoint.AFTER_ARCHIVE_WRITTEN, detail={"pruning": seq})
    fields = pruning_fields(seq=seq, at=now, by=by, finished_before=finished_before,
                            checkpoint_seq=checkpoint_seq, heads=heads, events=events,
                            archive=name, archive_sha256=sha256)
    try:
        with transaction.atomic(using=using):
            pruning_append_in_tx(fields, heads, using)
            runs_delete_in_tx(heads, events, using)
            crashpoints.reached(CrashPoint.IN_PRUNE_TRANSACTION, detail={"pruning": seq})
    except IntegrityError:
        raise PruneRefused(f"another prune recorded pruning #{seq} or one of its runs "
                           "meanwhile; run prune again") from None
    except DatabaseError as exc:
        if "permission denied" in str(exc):
            raise PruneRefused(f"the database refused the removal: {exc}") from None
        raise
    out.prunings.append(seq)
    out.runs += len(heads)
    out.events += events
    report(f"pruning #{seq}: runs {heads[0][0]}..{heads[-1][0]} ({len(heads)} runs, {events} "
           f"events) archived to {target / name} and removed")


def _replaceable(path: Path, using: str) -> None:
    """An archive of this name that is on no record was left by a prune that stopped before its
    batch committed: its runs are all still here, and the file may go. One holding a run that
    is not here (an archive of a later prune, on a database restored from an older backup)
    must not be overwritten."""
    if not path.exists():
        return
    try:
        _, _, records = archive_load(path)
    except ArchiveRefused as exc:
        raise PruneRefused(f"{path} is in the way and not an archive this prune can replace "
                           f"({exc.reason}): move it aside") from None
    ids = [r["run"].get("id") for r in records]
    if Run.objects.using(using).filter(pk__in=ids).count() != len(ids):
        raise PruneRefused(f"{path} is on no pruning's record but holds runs that are not in "
                           "this database (was it restored from an older backup?): move the "
                           "archive directory's files aside, keep them, and prune again")


def runs_delete_in_tx(heads: list[list], events: int, using: str = "default") -> None:
    """Delete the runs of ``heads`` ([id, head seq, head hash]) and all they own, inside the
    transaction that entered them as pruned; ``PruneRefused`` (the caller's transaction rolls
    back) when any run is not finished with that very head, or a row is not where it was."""

    ids = [h[0] for h in heads]
    marks = ", ".join(["%s"] * len(ids))
    done = [str(s) for s in TERMINAL_RUN_STATUSES]
    done_marks = ", ".join(["%s"] * len(done))
    connection = connections[using]
    run, step, approval = Run._meta.db_table, Step._meta.db_table, Approval._meta.db_table
    note, attempt = Notification._meta.db_table, NotificationAttempt._meta.db_table
    lock = " FOR UPDATE" if connection.vendor == "postgresql" else ""
    with connection.cursor() as cur:
        cur.execute(f"SELECT id, status, event_seq, event_hash FROM {run} WHERE id IN ({marks})"
                    f"{lock}", ids)
        found = {r[0]: r[1:] for r in cur.fetchall()}
        for run_id, seq, head in heads:
            status, now_seq, now_head = found.get(run_id, (None, None, None))
            if status not in done or (now_seq, now_head) != (seq, head):
                raise PruneRefused(f"run {run_id} changed since it was archived (it is "
                                   f"{status or 'gone'}); run prune again")
        in_approvals = f"SELECT id FROM {approval} WHERE run_id IN ({marks})"
        cur.execute(f"SELECT count(*) FROM {note} WHERE approval_id IN ({in_approvals}) "
                    "AND status = %s", [*ids, str(NotificationStatus.PENDING)])
        if cur.fetchone()[0]:
            raise PruneRefused("a notification about a run of this batch is being delivered "
                               "again; run prune again later")
        retire_in_tx(totals(  # what the metrics' totals counted of these rows stays counted
            Approval.objects.using(using).filter(run_id__in=ids),
            Event.objects.using(using).filter(run_id__in=ids),
            NotificationAttempt.objects.using(using).filter(notification__approval__run_id__in=ids),
        ), using)
        cur.execute(f"DELETE FROM {attempt} WHERE notification_id IN (SELECT id FROM {note} "
                    f"WHERE approval_id IN ({in_approvals}))", ids)
        cur.execute(f"DELETE FROM {note} WHERE approval_id IN ({in_approvals})", ids)
        cur.execute(f"DELETE FROM {approval} WHERE run_id IN ({marks})", ids)
        cur.execute(f"DELETE FROM {step} WHERE run_id IN ({marks})", ids)
        cur.execute(f"DELETE FROM {Event._meta.db_table} WHERE run_id IN ({marks})", ids)
        if cur.rowcount != events:
            raise PruneRefused(f"{cur.rowcount} events were found for {events} archived")
        cur.execute(f"DELETE FROM {run} WHERE id IN ({marks}) AND status IN ({done_marks})",
                    [*ids, *done])
        if cur.rowcount != len(ids):
            raise PruneRefused(f"{cur.rowcount} of {len(ids)} runs were still finished")
