"""Reads of runs for people: one run with its lease, its latest steps and events, its approvals,
and whether a live worker can run it."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.db.models import QuerySet

from runtime.clock import SYSTEM_CLOCK
from runtime.models import (
    CANCELLABLE_RUN_STATUSES,
    TERMINAL_RUN_STATUSES,
    Approval,
    Event,
    Run,
    RunStatus,
    Step,
)
from runtime.selectors.workers import agents_without_live_worker
from runtime.storage.engines import lease_expired

if TYPE_CHECKING:
    from typing import TypeAlias, TypedDict

    from django_stubs_ext import WithAnnotations

    class _LeaseGone(TypedDict):
        lease_gone: bool

    RunForPage: TypeAlias = WithAnnotations[Run, _LeaseGone]  # a run from ``run_for_page``


def events_after(run_id: int, after_seq: int, limit: int) -> tuple[list[Event], bool]:
    """A run's events after sequence number ``after_seq``, in order, at most ``limit`` of
    them, and whether there are more (keyset on the unique (run, seq) index)."""
    rows = list(Event.objects.filter(run_id=run_id, seq__gt=after_seq)
                .order_by("seq")[: limit + 1])
    return rows[:limit], len(rows) > limit


@dataclass(frozen=True)
class Tail:
    """The latest rows of a long list, and how to reach the ones before them."""

    rows: list[Any]
    total: int
    earlier: int | None  # the key to ask for the rows before these, None if these are the first


def steps_tail(run_id: int, *, upto: int | None = None, before: int | None = None,
               limit: int = 50) -> Tail:
    """The last ``limit`` steps of a run (up to step ``upto``, or before step ``before``), in
    order. Steps are numbered 1, 2, 3… without gaps, so the last index is the total."""
    qs = Step.objects.filter(run_id=run_id)
    if upto is not None:
        qs = qs.filter(index__lte=upto)
    if before is not None:
        qs = qs.filter(index__lt=before)
    rows = list(qs.order_by("-index")[:limit])[::-1]
    last = Step.objects.filter(run_id=run_id).order_by("-index").values_list(
        "index", flat=True).first()
    return Tail(rows, last or 0, rows[0].index if rows and rows[0].index > 1 else None)


def events_tail(run: Run, *, limit: int = 50) -> Tail:
    """The last ``limit`` events of a run, in order; the chain head gives the total."""
    rows = list(Event.objects.filter(run_id=run.pk).order_by("-seq")[:limit])[::-1]
    return Tail(rows, run.event_seq, rows[0].seq if rows and rows[0].seq > 1 else None)


def with_lease_state(runs: QuerySet[Run]) -> QuerySet[RunForPage]:
    """``runs``, each with whether its lease holds by the database's clock (the rule claims
    use)."""
    return runs.annotate(lease_gone=lease_expired(SYSTEM_CLOCK))


def run_for_page(pk: int) -> RunForPage | None:
    """One run, with whether its lease holds by the database's clock (the rule claims use)."""
    return with_lease_state(Run.objects.all()).filter(pk=pk).first()


def run_lease_live(run: RunForPage) -> bool:
    """Whether someone holds the run's lease right now (a run from ``run_for_page``)."""
    return bool(run.lease_owner) and not run.lease_gone


def run_awaits_worker(run: RunForPage) -> bool:
    """Whether the run waits for a worker to claim it: queued, or running with its lease gone
    (a worker takes it over). Where a claim looks (``runtime.leasing.claims``)."""
    return run.status == RunStatus.QUEUED or (run.status == RunStatus.RUNNING
                                              and bool(run.lease_gone))


def runs_without_worker(runs: Iterable[RunForPage], now: datetime) -> dict[int, str]:
    """Of ``runs`` (from ``with_lease_state``), those waiting for a worker whose agent no live
    worker has: run id -> agent. Nobody will claim them until a worker that has the agent
    starts (a rolling deploy not finished, or a worker started with ``--agents``). One query
    for all of them, none when no run waits."""
    waiting = {run.pk: run.agent for run in runs if run_awaits_worker(run)}
    unserved = agents_without_live_worker(waiting.values(), now)
    return {pk: agent for pk, agent in waiting.items() if agent in unserved}


def run_is_live(run: Run) -> bool:
    """Whether the run can still change (so a page showing it should keep looking)."""
    return run.status not in TERMINAL_RUN_STATUSES


def run_cancellable(run: Run) -> bool:
    """Whether a person may cancel the run now (``runtime.cancel`` refuses the others)."""
    return run.status in CANCELLABLE_RUN_STATUSES


def run_version(run: Run) -> str:
    """Changes whenever the run does: every change appends to its audit chain."""
    return str(run.event_seq)


def run_approvals(run_id: int, limit: int = 50) -> list[Approval]:
    """A run's latest ``limit`` approvals, oldest first, with the step index each is about."""
    qs = (Approval.objects.filter(run_id=run_id).select_related("step")
          .only("id", "kind", "status", "tool", "decided_by", "decided_at", "created_at",
                "consumed_at", "expires_at", "run_id", "step__index")
          .order_by("-created_at", "-pk"))
    return list(qs[:limit])[::-1]
