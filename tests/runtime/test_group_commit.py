"""runtime.storage.sqlite.group: the commits of a process's runs in flight share one SQLite
transaction; each plan keeps its own fence, one plan's failure rolls back alone, and a fault or a
crash loses the whole group and nothing else."""

from __future__ import annotations

import fcntl
import os
import threading
from contextlib import contextmanager
from typing import Any

import pytest
from django.conf import settings
from django.db import IntegrityError, OperationalError

from runtime.clock import SYSTEM_CLOCK
from runtime.crashpoints import CrashPoint
from runtime.errors import LeaseLost, SimulatedCrash
from runtime.leasing.claims import run_acquire, run_claim_many
from runtime.leasing.lease import Lease, lease_commit, lease_commit_many, lease_plan, lease_settle
from runtime.models import Event, Run, Step, StepStatus
from runtime.storage.base import Committed
from runtime.storage.plan import ApprovalMove, Plan
from runtime.storage.runs import run_create
from runtime.storage.sqlite import committer as sqlite_engine
from runtime.storage.sqlite.group import GroupCommitter, Ticket, group_committer, write_group
from runtime.testkit import APPROVE, Crash, ProcessKit
from tests.kit import Background
from tests.procs import ROOT
from tests.waiting import wait_until

pytestmark = pytest.mark.engines("sqlite")  # group commit is how SQLite's single writer scales


def leases(n: int) -> list[Lease]:
    out = []
    for i in range(n):
        run = run_create("grouped", {"i": i}, created_by="test", now=SYSTEM_CLOCK.now())
        out.append(run_acquire(run.pk, "owner-a", lease_seconds=60).lease)
    return out


def noted(lease: Lease, note: str) -> Plan:
    plan = lease_plan(lease, SYSTEM_CLOCK.now())
    plan.event("llm.failed", {"note": note})
    return plan


def committer() -> GroupCommitter:
    return group_committer(os.path.abspath(settings.DATABASES["default"]["NAME"]))



class Holder:
    """A group of one that holds the write lock until released, so every commit made meanwhile
    queues behind it and is written as the next group."""

    def __init__(self, lease: Lease) -> None:
        self.inside, self.release = threading.Event(), threading.Event()
        plan = noted(lease, "holder")

        def apply(tx) -> None:
            self.inside.set()
            assert self.release.wait(10)

        self.job = Background(lambda: committer().commit(Ticket(plan, apply),
                                                        sqlite_engine._group_transaction))
        assert self.inside.wait(10)

    def queue_then_release(self, n: int) -> None:
        wait_until(lambda: len(committer()._queue) == n, f"{n} plans queued", interval=0.001)
        self.release.set()
        self.job.thread.join(10)


def commit_in_background(lease: Lease, plan: Plan) -> Background:
    return Background(lambda: lease_commit(lease, plan, SYSTEM_CLOCK))


def test_a_plan_alone_commits_on_its_own_thread_as_a_group_of_one(sqlite_path):
    (lease,) = leases(1)
    before = committer().stats.groups
    lease_commit(lease, noted(lease, "alone"), SYSTEM_CLOCK)
    assert committer().stats.groups == before + 1
    assert Event.objects.filter(run_id=lease.run_id, kind="llm.failed").count() == 1


def test_plans_arriving_while_a_group_is_written_are_written_together_next(sqlite_path):
    first, *others = leases(5)
    holder = Holder(first)
    before = committer().stats.groups
    jobs = [commit_in_background(lease, noted(lease, "grouped")) for lease in others]
    holder.queue_then_release(len(others))
    for job in jobs:
        job.thread.join(10)
        assert job.error is None
    stats = committer().stats
    assert stats.groups == before + 2  # the holder's, then one for all four
    assert stats.largest >= 4
    for lease in others:
        run = Run.objects.get(pk=lease.run_id)
        assert (run.event_seq, run.event_hash) == lease.position  # each its own chain head
        assert Event.objects.filter(run_id=lease.run_id, kind="llm.failed").count() == 1


def test_plans_queued_while_the_leader_waits_for_another_process_ride_in_its_group(sqlite_path):
    """The group is taken once the write lock is held: what queued while another process held
    it is written with the leader's plan, not left to wait for the lock a second time."""
    first, *others = leases(4)
    other_process = os.open(f"{settings.DATABASES['default']['NAME']}.writer", os.O_RDWR)
    try:
        fcntl.flock(other_process, fcntl.LOCK_EX)  # another open file: as another process's
        before = committer().stats.groups
        leader = commit_in_background(first, noted(first, "leader"))
        wait_until(lambda: committer()._leading, "a leader waiting for the write lock",
                   interval=0.001)
        jobs = [commit_in_background(lease, noted(lease, "queued")) for lease in others]
        wait_until(lambda: len(committer()._queue) == len(others), "the others queued",
                   interval=0.001)
    finally:
        os.close(other_process)  # releases the flock: the leader takes the lock
    for job in [leader, *jobs]:
        assert job.join().error is None
    stats = committer().stats
    assert stats.groups == before + 1 and stats.largest >= 4  # one group carried all four
    for lease in [first, *others]:
        assert Run.objects.get(pk=lease.run_id).event_seq == lease.position[0]


def test_a_workers_claims_ride_in_the_group_with_its_runs_commits(sqlite_path):
    """A batch claim joins the group being formed instead of taking the write lock (and a
    sync) of its own: the claims and a run's commit queued meanwhile are one group."""
    first, other = leases(2)
    queued = [run_create("grouped", {"i": i}, created_by="test", now=SYSTEM_CLOCK.now()).pk
              for i in range(3)]
    holder = Holder(first)
    before = committer().stats.groups
    step = commit_in_background(other, noted(other, "a run's commit"))
    claim = Background(lambda: run_claim_many("owner-b", 3, lease_seconds=60))
    holder.queue_then_release(1 + 3)
    for job in (step, claim):
        job.thread.join(10)
        assert job.error is None
    assert committer().stats.groups == before + 2  # the holder's, then all four plans
    assert sorted(a.run.pk for a in claim.result) == queued
    for pk in queued:
        run = Run.objects.get(pk=pk)
        assert (run.status, run.lease_owner) == ("running", "owner-b")


def group_one_failing_among_kept(first: Lease, start_failing: Any,
                                 kept: list[Lease]) -> Background:
    """Hold a group with ``first``; queue the plan ``start_failing()`` commits in the
    background and a plan of each of ``kept`` behind it; release. Every kept plan commits
    (checked here); the failing one's job is returned with its outcome."""
    holder = Holder(first)
    failing = start_failing()
    jobs = [commit_in_background(lease, noted(lease, "kept")) for lease in kept]
    holder.queue_then_release(1 + len(kept))
    failing.thread.join(10)
    for job in jobs:
        job.thread.join(10)
        assert job.error is None
    assert Event.objects.filter(payload__note="kept").count() == len(kept)
    return failing


def test_a_refused_plan_rolls_back_alone_and_the_others_commit(sqlite_path):
    first, lost, *kept = leases(4)
    # Someone else moved ``lost`` on: its plan's fence (chain head) no longer holds.
    lease_commit(Lease(lost.run_id, lost.owner, lost.epoch, lost.expires_at, lost.position,
                       seconds=60), noted(lost, "elsewhere"), SYSTEM_CLOCK)
    stale = lease_plan(Lease(lost.run_id, lost.owner, lost.epoch, lost.expires_at,
                             (lost.position[0] - 1, "0" * 64), seconds=60), SYSTEM_CLOCK.now())
    stale.event("llm.failed", {"note": "stale"})
    behind = Lease(lost.run_id, lost.owner, lost.epoch, lost.expires_at,
                   (stale.fence.seq, stale.head), seconds=60)
    refused = group_one_failing_among_kept(
        first, lambda: commit_in_background(behind, stale), kept)
    assert isinstance(refused.error, LeaseLost)
    assert not Event.objects.filter(payload__note="stale").exists()


def test_a_plan_failing_half_way_is_undone_to_its_savepoint_and_the_others_commit(sqlite_path):
    first, broken, *kept = leases(4)
    Step.objects.create(run_id=broken.run_id, index=0, status=StepStatus.SUCCEEDED,
                        started_at=SYSTEM_CLOCK.now())
    before = Run.objects.get(pk=broken.run_id)
    bad = noted(broken, "half")  # its run row is updated, then its step insert collides
    bad.step_insert(Step(run_id=broken.run_id, index=0, status=StepStatus.DECIDING,
                         started_at=SYSTEM_CLOCK.now()))
    failing = group_one_failing_among_kept(
        first, lambda: commit_in_background(broken, bad), kept)
    assert isinstance(failing.error, IntegrityError)
    after = Run.objects.get(pk=broken.run_id)
    assert (after.event_seq, after.event_hash) == (before.event_seq, before.event_hash)
    assert not Event.objects.filter(payload__note="half").exists()


def test_an_event_colliding_in_the_groups_one_insert_fails_its_plan_alone(sqlite_path):
    """The group's events go in one INSERT; a row put behind the runtime's back where one
    plan's event belongs makes that INSERT fail: the pass is undone and redone a plan at a
    time, and only that plan fails."""
    first, clashing, *kept = leases(4)
    Event.objects.create(run_id=clashing.run_id, seq=clashing.position[0] + 1,
                         kind="llm.failed", payload={}, actor="intruder",
                         at=SYSTEM_CLOCK.now(), hash="0" * 64)
    before = Run.objects.get(pk=clashing.run_id)
    failing = group_one_failing_among_kept(
        first, lambda: commit_in_background(clashing, noted(clashing, "clash")), kept)
    assert isinstance(failing.error, IntegrityError)
    after = Run.objects.get(pk=clashing.run_id)
    assert (after.event_seq, after.event_hash) == (before.event_seq, before.event_hash)
    assert not Event.objects.filter(payload__note="clash").exists()


def test_a_crash_in_the_middle_of_a_group_loses_every_plan_of_it_and_nothing_else(
        sqlite_path, crash):
    first, *grouped = leases(4)
    before = {lease.run_id: lease.position for lease in grouped}
    holder = Holder(first)
    crash(CrashPoint.IN_GROUP_COMMIT)
    jobs = [commit_in_background(lease, noted(lease, "lost")) for lease in grouped]
    holder.queue_then_release(len(grouped))
    for job in jobs:
        job.thread.join(10)
        assert isinstance(job.error, SimulatedCrash)  # every plan of the group hears of it
    assert not Event.objects.filter(payload__note="lost").exists()
    for run_id, position in before.items():
        run = Run.objects.get(pk=run_id)
        assert (run.event_seq, run.event_hash) == position
    lease_commit(first, noted(first, "after"), SYSTEM_CLOCK)  # the next group commits
    assert Event.objects.filter(payload__note="after").count() == 1


def _ticket(value: Any) -> Ticket:
    plan = Plan(run_id=1, at=SYSTEM_CLOCK.now(), actor="a", fence=None, head="")  # type: ignore[arg-type]
    return Ticket(plan, lambda tx: tx.defer(value) if tx.deferring else value)


class FakeTx:
    """Records what a group does with its transaction."""

    def __init__(self) -> None:
        self.said: list[str] = []
        self.deferring = False
        self.deferred: list[Any] = []

    def execute(self, sql: str) -> None:
        self.said.append(sql)

    def defer(self, value: Any) -> Any:
        self.deferred.append(value)
        return value

    def flush(self) -> None:
        self.said.append(f"flush {self.deferred}")
        self.deferred = []

    def discard(self) -> None:
        self.said.append(f"discard {self.deferred}")
        self.deferred = []


def test_a_fault_at_commit_loses_the_group_and_every_plan_hears_of_it():
    tx = FakeTx()

    @contextmanager
    def failing_commit():
        yield tx
        raise OperationalError("disk I/O error")

    batch = [_ticket(n) for n in range(3)]
    write_group(lambda: batch, failing_commit)
    # no savepoint per plan when none fails; the three plans' events in one write
    assert tx.said == ["SAVEPOINT grp", "flush [0, 1, 2]", "RELEASE grp"]
    assert all(isinstance(t.error, OperationalError) and t.value is None for t in batch)


def test_a_plan_failing_half_way_sends_the_group_through_a_savepoint_per_plan():
    tx = FakeTx()

    @contextmanager
    def transaction():
        yield tx

    def broken(tx):
        raise ValueError("half done")

    batch = [_ticket(1), Ticket(_ticket(0).plan, broken), _ticket(3)]
    write_group(lambda: batch, transaction)
    assert tx.said == ["SAVEPOINT grp", "discard [1]", "ROLLBACK TO grp",
                       "SAVEPOINT plan", "RELEASE plan",
                       "SAVEPOINT plan", "ROLLBACK TO plan", "RELEASE plan",
                       "SAVEPOINT plan", "RELEASE plan", "RELEASE grp"]
    assert [t.value for t in batch] == [1, None, 3]  # written by each plan itself this time
    assert isinstance(batch[1].error, ValueError)


def test_a_group_of_one_takes_no_savepoint():
    tx = FakeTx()

    @contextmanager
    def transaction():
        yield tx

    (t,) = batch = [_ticket("x")]
    write_group(lambda: batch, transaction)
    assert tx.said == [] and t.outcome() == "x"


def test_a_worker_killed_in_the_middle_of_a_group_commit_loses_that_group_only(database, tmp_path):
    """A real worker process with 16 runs in flight dies inside a group commit of several
    plans: none of that group's plans is in the database, every run's chain is whole, and after
    a restart (an operator approving what is in doubt) every run ends with no side effect run
    twice without an approval, counted by the outside world's ledger."""
    kit = ProcessKit(database, tmp_path, agents="runtime.testkit.agents.AGENTS",
                     manage=ROOT / "manage.py", lease_seconds=2,
                     env={"RUNTIME_TEST_DIR": str(tmp_path)})
    runs = [kit.start("charge") for _ in range(16)]
    kit.crash_worker(Crash(CrashPoint.IN_GROUP_COMMIT), extra=["--concurrency", "16"])
    ((point, detail),) = kit.reached.details
    assert point == str(CrashPoint.IN_GROUP_COMMIT) and len(detail["plans"]) >= 2
    for p in detail["plans"]:
        run = Run.objects.get(pk=p["run_id"])
        assert run.event_seq == p["fence_seq"]  # nothing of the group's plan landed
        assert not Event.objects.filter(run_id=run.pk, seq__gt=p["fence_seq"]).exists()
    kit.check(runs)  # raises on a broken invariant: every chain whole, nothing run twice
    for _ in range(10):
        kit.drain(concurrency=8)
        kit.operate(lambda approval: APPROVE)
        if not Run.objects.filter(pk__in=runs).exclude(status="succeeded").exists():
            break
    assert set(Run.objects.filter(pk__in=runs).values_list("status", flat=True)) == {"succeeded"}
    report = kit.check(runs)
    assert report.runs == len(runs) and report.violations == []
    executions = kit.ledger.executions()
    assert all(executions[(run_id, 2)] >= 1 for run_id in runs)


def test_lease_commit_many_writes_one_group_and_refuses_a_stale_plan_alone(sqlite_path):
    """The event-loop worker's commit of one turn of its loop: every plan in one group, each
    fenced on its own; the one whose run moved on hears ``LeaseLost``, the others commit."""
    first, lost, last = leases(3)
    lease_commit(Lease(lost.run_id, lost.owner, lost.epoch, lost.expires_at, lost.position,
                       seconds=60), noted(lost, "elsewhere"), SYSTEM_CLOCK)
    groups = committer().stats.groups
    results = lease_commit_many([(lease, noted(lease, "many")) for lease in (first, lost, last)],
                                SYSTEM_CLOCK)
    assert committer().stats.groups == groups + 1
    assert isinstance(results[1], LeaseLost)
    for lease, result in ((first, results[0]), (last, results[2])):
        assert isinstance(result, Committed)
        assert lease.position == (result.seq, result.head)
    assert Event.objects.filter(payload__note="many").count() == 2


def test_a_fault_in_a_commit_of_many_is_ridden_out_from_each_chain_head(sqlite_path,
                                                                        monkeypatch):
    """A fault of the whole group: with ``ride_faults=False`` each plan gets the fault back
    (nothing blind is sent again); ``lease_settle`` then learns from the chain head that it did
    not land and commits it once."""
    from django.db import OperationalError

    a, b = leases(2)
    engine_class = type(sqlite_engine.SqliteEngine())
    real = engine_class.commit_many
    monkeypatch.setattr(engine_class, "commit_many", lambda self, plans, clock: [
        OperationalError("disk I/O error")] * len(plans))
    items = [(lease, noted(lease, "faulted")) for lease in (a, b)]
    results = lease_commit_many(items, SYSTEM_CLOCK, ride_faults=False)
    assert all(isinstance(r, OperationalError) for r in results)
    monkeypatch.setattr(engine_class, "commit_many", real)
    for (lease, plan), fault in zip(items, results, strict=True):
        committed = lease_settle(lease, plan, SYSTEM_CLOCK, fault)
        assert lease.position == (committed.seq, committed.head)
    assert Event.objects.filter(payload__note="faulted").count() == 2


def test_a_plan_through_the_orm_in_a_commit_of_many_fails_alone(sqlite_path, crash):
    """A plan that writes through the ORM (an approval's move) is a transaction of its own: a
    crash inside it reaches that plan only, and the group of the others is committed, each told
    so; a lease whose commit gave it up and failed is no longer ``ending``."""
    first, second, third = leases(3)
    orm = noted(third, "orm")
    orm.approval_moves.append(ApprovalMove(pk=999_999, from_status="pending", fields={},
                                           required=False))
    orm.run.update(status="waiting", lease_owner="", lease_expires_at=None)  # gives it up
    crash(CrashPoint.IN_TRANSACTION, occurrence=3)  # the group's two plans, then this one
    results = lease_commit_many([(first, noted(first, "many")), (second, noted(second, "many")),
                                 (third, orm)], SYSTEM_CLOCK, ride_faults=False)
    assert [type(r).__name__ for r in results] == ["Committed", "Committed", "SimulatedCrash"]
    assert Event.objects.filter(payload__note="many").count() == 2
    assert not Event.objects.filter(payload__note="orm").exists()
    assert third.ending is False
