"""Checking a run's audit chain: gapless sequence numbers, every hash, the run's recorded head."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from runtime.audit.compare import replay_problems
from runtime.models import Event, Run
from runtime.storage.events import event_hash


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
    """Check a run's events (sequence 1..n without gaps, every hash, the run's chain head), then,
    unless ``replay`` is off, that its rows say what its events say (``runtime.audit.replay``): a
    row edited behind the runtime's back is as broken as an edited event. ``verifyaudit`` checks
    many runs at once with the same two checks (``runtime.audit.check``)."""

    if not isinstance(run, Run):
        run = Run.objects.using(using).get(pk=run)
    events = Event.objects.using(using).filter(run_id=run.pk).order_by("seq").values_list(
        *EVENT_COLUMNS)
    checked = chain_check(run.pk, run.event_seq, run.event_hash,
                          events.iterator(chunk_size=2000))
    if not replay or not checked.ok:
        return checked
    return replay_verdict(checked, replay_problems(run.pk, using))
