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

from runtime.canonical import chain_hash, dumps
from runtime.models import Event

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
    commits insert theirs through the engine's committer (``runtime.storage.engines``)."""

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
