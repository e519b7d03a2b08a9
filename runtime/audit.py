"""The audit log: event kinds, the per-run hash chain, appending and verification.

Each event's hash covers its content and the previous event's hash, so an edit made behind the
database triggers' back (or a deleted row) breaks the chain at a findable place.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from .canonical import chain_hash, dumps

logger = logging.getLogger("runtime.events")

EVENT_KINDS = frozenset(
    [
        "run.created", "run.started", "run.resumed", "run.paused", "run.released", "run.succeeded",
        "run.failed", "run.cancelled", "lease.taken", "lease.taken_over", "lease.released",
        "step.started", "step.decided", "step.tool_started", "step.tool_dispatched",
        "step.tool_finished", "step.tool_failed", "step.interrupted", "llm.requested",
        "llm.responded", "llm.failed", "approval.requested", "approval.granted",
        "approval.rejected",
        "approval.resolved", "approval.consumed", "approval.cancelled", "reconcile.decided",
        "policy.denied", "side_effect.auto_confirmed", "approval.expired",
    ]
)


@dataclass(frozen=True)
class EventSpec:
    """An event to append: what happened, to which step, with what details."""

    kind: str
    payload: dict[str, Any]
    step_index: int | None = None
    actor: str | None = None  # when not the commit's own (a schedule's standing authorization)

    def __post_init__(self) -> None:
        if self.kind not in EVENT_KINDS:
            raise ValueError(f"unknown event kind {self.kind!r}")


def _iso(at: datetime) -> str:
    if at.tzinfo is not UTC:  # a commit's time is UTC already: the same text without a copy
        at = at.astimezone(UTC)
    return at.isoformat(timespec="microseconds")


def event_hash(
    prev_hash: str,
    *,
    run_id: int,
    seq: int,
    kind: str,
    step_index: int | None,
    payload: Any,
    actor: str,
    at: datetime,
) -> str:
    body = dumps(
        {"run": run_id, "seq": seq, "kind": kind, "step": step_index, "payload": payload,
         "actor": actor, "at": _iso(at)}
    )
    return chain_hash(prev_hash, body)


@dataclass(slots=True)
class EventRow:
    """An event chained and ready to insert (cheaper to build than a model instance).

    ``payload_text`` is the payload's canonical JSON: hashed into the chain, and stored as is.
    """

    run_id: int
    step_index: int | None
    seq: int
    kind: str
    payload: Any
    payload_text: str
    actor: str
    at: datetime
    hash: str


_encode = json.JSONEncoder(ensure_ascii=False).encode  # a JSON string, exactly as dumps() has it
_quoted: dict[str, str] = {}  # kinds and actors recur in every commit: each encoded once


def _str(text: str) -> str:
    found = _quoted.get(text)
    if found is None:
        if len(_quoted) >= 4096:  # actors are open-ended (operators' names): bounded
            _quoted.clear()
        found = _quoted[text] = _encode(text)
    return found


def build_events(
    run_id: int, seq: int, head: str, specs: Iterable[EventSpec], actor: str, at: datetime
) -> tuple[list[EventRow], int, str]:
    """Event rows chained after (seq, head); returns (rows, new seq, new head). Not saved.

    Each hash is ``event_hash``'s, with the body written out in dumps()' own key order so the
    payload is serialised once (for the hash and for the row). verify() recomputes it the
    reference way, so any difference would show as a broken chain.
    """
    rows = []
    prefix = f'{{"actor":{_str(actor)},"at":"{_iso(at)}","kind":'
    suffix = f',"run":{int(run_id)},"seq":'
    for spec in specs:
        seq += 1
        text = dumps(spec.payload)
        step = "null" if spec.step_index is None else str(int(spec.step_index))
        own = prefix if spec.actor is None else (
            f'{{"actor":{_str(spec.actor)},"at":"{_iso(at)}","kind":')
        body = f'{own}{_str(spec.kind)},"payload":{text}{suffix}{seq},"step":{step}}}'
        head = chain_hash(head, body)
        rows.append(EventRow(run_id, spec.step_index, seq, spec.kind, spec.payload, text,
                             actor if spec.actor is None else spec.actor, at, head))
    return rows, seq, head


def insert_events(rows: Sequence[EventRow]) -> None:
    """Insert chained rows on this thread's connection (the caller's transaction). The loop's
    commits insert theirs through the engine's committer (``runtime.engines``)."""
    from .models import Event

    Event.objects.bulk_create([
        Event(run_id=r.run_id, step_index=r.step_index, seq=r.seq, kind=r.kind, payload=r.payload,
              actor=r.actor, at=r.at, hash=r.hash) for r in rows])


def log_events(rows: Iterable) -> None:
    """One log line per recorded event (called after the commit that holds them)."""
    if not logger.isEnabledFor(logging.INFO):
        return
    for e in rows:
        step = f" step={e.step_index}" if e.step_index is not None else ""
        text = e.payload_text if isinstance(e, EventRow) else dumps(e.payload)
        logger.info("run=%s #%s %s%s actor=%s %s", e.run_id, e.seq, e.kind, step, e.actor, text)


@dataclass(frozen=True)
class Verification:
    """Result of checking one run's chain: ``ok``, or the first broken link and why."""

    run_id: int
    ok: bool
    events: int
    broken_seq: int | None = None
    reason: str = ""

    def __str__(self) -> str:
        if self.ok:
            return f"run {self.run_id}: ok ({self.events} events)"
        if self.broken_seq is None:
            return f"run {self.run_id}: BROKEN: {self.reason}"
        return f"run {self.run_id}: BROKEN at event #{self.broken_seq}: {self.reason}"


# The columns the chain check reads, in this order (``EVENT_COLUMNS`` of a values_list).
EVENT_COLUMNS = ("seq", "kind", "step_index", "payload", "actor", "at", "hash")


def chain_check(run_id: int, head_seq: int, head_hash: str,
                events: Iterable[tuple]) -> Verification:
    """Check one run's events, ``EVENT_COLUMNS`` tuples in sequence order: numbered 1..n
    without gaps, every hash, and the run's recorded head (``head_seq``, ``head_hash``)."""
    head, expected, count = "", 1, 0
    for seq, kind, step_index, payload, actor, at, hashed in events:
        count += 1
        if seq != expected:
            return Verification(run_id, False, count, expected,
                                f"sequence gap: expected #{expected}, found #{seq}")
        want = event_hash(head, run_id=run_id, seq=seq, kind=kind, step_index=step_index,
                          payload=payload, actor=actor, at=at)
        if want != hashed:
            return Verification(run_id, False, count, seq,
                                f"hash mismatch on {kind} (content or order was altered)")
        head, expected = hashed, expected + 1
    if head_seq != count or head_hash != head:
        return Verification(run_id, False, count, count + 1 if head_seq > count else count,
                            f"chain head mismatch: run records #{head_seq}, "
                            f"log ends at #{count} (events missing or added)")
    return Verification(run_id, True, count)


def replay_verdict(checked: Verification, problems: list[str]) -> Verification:
    """``checked`` (an intact chain), or broken when the rows disagree with the events."""
    if not checked.ok or not problems:
        return checked
    more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
    return Verification(checked.run_id, False, checked.events, None,
                        "its rows disagree with its events: " + "; ".join(problems[:3]) + more)


def verify(run: Any, using: str = "default", *, replay: bool = True) -> Verification:
    """Check a run's events (sequence 1..n without gaps, every hash, the run's chain head),
    then, unless ``replay`` is off, that its rows say what its events say (``runtime.replay``):
    a row edited behind the runtime's back is as broken as an edited event. ``verifyaudit``
    checks many runs at once with the same two checks (``runtime.auditcheck``)."""
    from .models import Event, Run
    from .replay import replay_problems

    if not isinstance(run, Run):
        run = Run.objects.using(using).get(pk=run)
    events = Event.objects.using(using).filter(run_id=run.pk).order_by("seq").values_list(
        *EVENT_COLUMNS)
    checked = chain_check(run.pk, run.event_seq, run.event_hash,
                          events.iterator(chunk_size=2000))
    if not replay or not checked.ok:
        return checked
    return replay_verdict(checked, replay_problems(run.pk, using))
