"""Checking archived runs (``verifyaudit --archive DIR``), and the check a run passes before it
is archived at all.

For every pruning on record, its file: present, with the SHA-256 the record holds, the runs the
record names and no others. For every archived run: its event chain from the archived events up
to the archived head, its rows replayed from those events, its creation entry (still in the
database, in the global chain) holding its first event's hash, its head the one the pruning
entered; and, when the prune took a signed checkpoint first, the head the checkpoint names
(a prefix of the archived chain). Together: nothing the run recorded changed on the way to
the file, and the file is the one that was written.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from runtime.audit.chain import EVENT_COLUMNS, chain_check
from runtime.audit.checkpoint import checkpoint_load, heads_digest
from runtime.audit.compare import replay_compare
from runtime.errors import ArchiveRefused, CheckpointRefused
from runtime.models import (
    Approval,
    AuditCheckpoint,
    PrunedRun,
    Pruning,
    Run,
    RunCreation,
    Step,
)
from runtime.retention.archive import archive_load, checkpoint_name, row_from


def record_problems(record: dict[str, Any]) -> list[str]:
    """What is wrong with one archived run (empty when nothing): its chain, its rows replayed
    from its events, its creation entry's link to its first event. Read from the record alone."""
    try:
        run = row_from(Run, record["run"])
        steps = [row_from(Step, s) for s in record.get("steps", [])]
        approvals = [row_from(Approval, a) for a in record.get("approvals", [])]
        events = [tuple(e[name] for name in EVENT_COLUMNS) for e in record.get("events", [])]
        events = [(*e[:5], datetime.fromisoformat(e[5]), e[6]) for e in events]
    except (KeyError, TypeError, ValueError) as exc:
        return [f"run {record['run'].get('id')}: not an archived run ({exc})"]
    checked = chain_check(run.pk, run.event_seq, run.event_hash, events)
    if not checked.ok:
        return [str(checked)]
    problems = replay_compare(run, ((k, i, p, at) for _, k, i, p, _, at, _ in events), steps,
                              approvals)
    creation = record.get("creation")
    if not isinstance(creation, dict):
        problems.append(f"run {run.pk}: no creation entry of the global chain")
    elif creation.get("run_id") != run.pk or creation.get("first_hash") != events[0][6]:
        problems.append(f"run {run.pk}: its creation entry does not hold its first event")
    return problems


def record_head(record: dict[str, Any]) -> list:
    """[run id, head seq, head hash] of an archived run, as a pruning enters it."""
    run = record["run"]
    return [run["id"], run["event_seq"], run["event_hash"]]


@dataclass
class ArchiveReport:
    """What ``archives_verify`` looked at."""

    prunings: int = 0
    runs: int = 0
    problems: int = 0
    unrecorded: list[Path] = field(default_factory=list)


def archives_verify(directories: Iterable[Path], *, using: str = "default",
                    report: Callable[[str], None] = lambda line: None) -> ArchiveReport:
    """Check every pruning on record against its archive file in ``directories``; each problem
    goes to ``report`` as one line. Files no pruning names (left by a prune interrupted before
    its batch committed; the next prune replaces them) are listed in ``unrecorded``.
    ``AuditKeyError`` when a pruning took a checkpoint and ``RUNTIME_AUDIT_KEY`` is not set."""

    dirs = [Path(d) for d in directories]
    out = ArchiveReport()
    checkpoints: dict[int, dict[int, tuple[int, str]] | str] = {}

    def problem(line: str) -> None:
        out.problems += 1
        report(line)

    named = set()
    for pruning in Pruning.objects.using(using).order_by("seq").iterator(chunk_size=100):
        out.prunings += 1
        named.add(pruning.archive)
        path = next((d / pruning.archive for d in dirs if (d / pruning.archive).exists()), None)
        if path is None:
            problem(f"pruning #{pruning.seq}: its archive {pruning.archive} is in none of "
                    f"{', '.join(map(str, dirs))}")
            continue
        heads: dict[int, tuple[int, str]] | None = None
        if pruning.checkpoint_seq is not None:
            found = _checkpoint_heads(pruning.checkpoint_seq, dirs, using, checkpoints)
            if isinstance(found, str):
                problem(f"pruning #{pruning.seq}: {found}")
            else:
                heads = found
        for line in _pruning_problems(pruning, path, heads, using, out):
            problem(line)
    for directory in dirs:
        out.unrecorded += sorted(p for p in directory.glob("prune-*.jsonl")
                                 if p.name not in named)
    return out


def _pruning_problems(pruning: Pruning, path: Path,
                      heads: dict[int, tuple[int, str]] | None, using: str,
                      out: ArchiveReport) -> Iterable[str]:
    where = f"pruning #{pruning.seq} ({path})"
    try:
        digest, header, records = archive_load(path)
    except ArchiveRefused as exc:
        yield f"{where}: {exc.reason}"
        return
    if digest != pruning.archive_sha256:
        yield (f"{where}: the file's SHA-256 is not the one on record: it was altered or "
               "replaced")
        return
    if header.get("pruning") != pruning.seq:
        yield f"{where}: the file belongs to pruning #{header.get('pruning')}"
    archived = [record_head(r) for r in records]
    entered = [list(h) for h in PrunedRun.objects.using(using).filter(
        pruning_seq=pruning.seq).order_by("run_id").values_list("run_id", "event_seq",
                                                                "event_hash")]
    if archived != entered or heads_digest(archived) != pruning.heads_digest:
        yield (f"{where}: it holds {len(archived)} runs whose heads are not the "
               f"{pruning.runs} the pruning entered")
    if sum(len(r.get("events", [])) for r in records) != pruning.events:
        yield f"{where}: it does not hold the {pruning.events} events the pruning removed"
    creations = {c.run_id: c for c in RunCreation.objects.using(using).filter(
        run_id__in=[h[0] for h in archived])}
    for record, (run_id, _, _) in zip(records, archived, strict=True):
        out.runs += 1
        for line in record_problems(record):
            yield f"{where}: {line}"
        entry, kept = creations.get(run_id), record.get("creation") or {}
        if entry is None or entry.hash != kept.get("hash") or entry.seq != kept.get("seq"):
            yield (f"{where}: run {run_id}: its creation entry in the global chain is not the "
                   "archived one")
        if heads is not None:
            yield from _against_checkpoint(where, record, heads.get(run_id), pruning)


def _against_checkpoint(where: str, record: dict[str, Any], head: tuple[int, str] | None,
                        pruning: Pruning) -> Iterable[str]:
    run_id = record["run"]["id"]
    if head is None:
        yield (f"{where}: run {run_id} is not in checkpoint #{pruning.checkpoint_seq}, taken "
               "before it was pruned")
        return
    seq, hashed = head
    events = record.get("events", [])
    if seq and (seq > len(events) or events[seq - 1].get("hash") != hashed):
        yield (f"{where}: run {run_id}: its archived chain differs from checkpoint "
               f"#{pruning.checkpoint_seq} at event #{seq}")


def _checkpoint_heads(seq: int, dirs: list[Path], using: str,
                      cache: dict[int, dict[int, tuple[int, str]] | str],
                      ) -> dict[int, tuple[int, str]] | str:
    """The heads of the prune's signed checkpoint ``seq`` (kept beside the archives), or why
    they cannot be trusted."""
    if seq in cache:
        return cache[seq]
    name = checkpoint_name(seq)
    path = next((d / name for d in dirs if (d / name).exists()), None)
    found: dict[int, tuple[int, str]] | str
    if path is None:
        found = f"its signed checkpoint {name} is in none of the archive directories"
    else:
        try:
            doc = checkpoint_load(path)  # AuditKeyError propagates: the caller says so once
        except CheckpointRefused as exc:
            found = f"checkpoint #{seq}: {exc}"
        else:
            row = AuditCheckpoint.objects.using(using).filter(seq=seq).values_list(
                "hash", flat=True).first()
            if doc["checkpoint"] != seq or row != doc["hash"]:
                found = (f"checkpoint #{seq} ({path}) is not the one the database records")
            else:
                found = {r: (s, h) for r, s, h in doc["heads"]}
    cache[seq] = found
    return found
