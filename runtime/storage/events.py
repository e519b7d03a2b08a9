"""The audit log: event kinds, the per-run hash chain, appending and verification.

Each event's hash covers its content and the previous event's hash, so an edit made behind the
database triggers' back (or a deleted row) breaks the chain at a findable place.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from runtime.canonical import chain_hash, dumps, iso_time
from runtime.models import Event

logger = logging.getLogger("runtime.events")

class EventKind(StrEnum):
    """Every kind of audit event (design §4): the catalogue, written once. Replay
    (``runtime.audit.replay``) has a handler for each; an event of any other kind is refused
    when it is made, and reported when it is found."""

    RUN_CREATED = "run.created"
    RUN_STARTED = "run.started"
    RUN_RESUMED = "run.resumed"
    RUN_PAUSED = "run.paused"
    RUN_RELEASED = "run.released"
    RUN_SUCCEEDED = "run.succeeded"
    RUN_FAILED = "run.failed"
    RUN_CANCELLED = "run.cancelled"
    RUN_RESTORED = "run.restored"
    LEASE_TAKEN = "lease.taken"
    LEASE_TAKEN_OVER = "lease.taken_over"
    LEASE_RELEASED = "lease.released"
    STEP_STARTED = "step.started"
    STEP_DECIDED = "step.decided"
    STEP_TOOL_STARTED = "step.tool_started"
    STEP_TOOL_DISPATCHED = "step.tool_dispatched"
    STEP_TOOL_FINISHED = "step.tool_finished"
    STEP_TOOL_FAILED = "step.tool_failed"
    STEP_INTERRUPTED = "step.interrupted"
    STEP_OUTCOME_UNKNOWN = "step.outcome_unknown"  # the tool could not tell (its server went)
    LLM_REQUESTED = "llm.requested"
    LLM_RESPONDED = "llm.responded"
    LLM_FAILED = "llm.failed"
    APPROVAL_REQUESTED = "approval.requested"
    APPROVAL_EDITED = "approval.edited"  # a policy call's arguments changed before allowing
    APPROVAL_GRANTED = "approval.granted"
    APPROVAL_REJECTED = "approval.rejected"
    APPROVAL_RESOLVED = "approval.resolved"
    APPROVAL_CONSUMED = "approval.consumed"
    APPROVAL_CANCELLED = "approval.cancelled"
    APPROVAL_EXPIRED = "approval.expired"
    APPROVAL_WARNED = "approval.warned"  # its deadline is near: the people told were warned
    APPROVAL_ESCALATED = "approval.escalated"  # nearer still: a second channel or group told
    RECONCILE_DECIDED = "reconcile.decided"
    POLICY_DENIED = "policy.denied"
    SIDE_EFFECT_AUTO_CONFIRMED = "side_effect.auto_confirmed"


EVENT_KINDS = frozenset(EventKind)


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
         "actor": actor, "at": iso_time(at)}
    )
    return chain_hash(prev_hash, body)


@dataclass(slots=True)  # (mypy 1.19 may see, on a second pass, the slots it made itself)
class EventRow:  # type: ignore[misc]
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
    prefix = f'{{"actor":{_str(actor)},"at":"{iso_time(at)}","kind":'
    suffix = f',"run":{int(run_id)},"seq":'
    for spec in specs:
        seq += 1
        text = dumps(spec.payload)
        step = "null" if spec.step_index is None else str(int(spec.step_index))
        own = prefix if spec.actor is None else (
            f'{{"actor":{_str(spec.actor)},"at":"{iso_time(at)}","kind":')
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
