"""Design §12b in process: a restored database holds every run that was unfinished at the
backup's moment, so none of its side effects runs again without a person; keys are derived
from what a restore cannot change. Side-effect counts come from the Ledger."""

from __future__ import annotations

from datetime import timedelta

import pytest

from runtime import FinalAnswer, ToolCall, resume, start
from runtime.agents.agent import registry
from runtime.approvals.decisions import approve, reject, resolve
from runtime.audit.chain import verify
from runtime.backups.fence import restore_fence
from runtime.backups.operations import backup_restore, backup_take
from runtime.canonical import step_idempotency_key
from runtime.crashpoints import CrashPoint
from runtime.errors import RestoreRefused, SimulatedCrash
from runtime.models import Approval, Restoration, Run, Schedule, Step, Worker
from runtime.schedules.changes import schedule_authorize, schedule_create
from runtime.schedules.firing import schedules_fire_due
from runtime.selectors.approvals import pending
from tests.kit import Ledger, charges_need_approval, events, make_agent

pytestmark = pytest.mark.engines

SCRIPT = [ToolCall("read", {"key": "k"}), ToolCall("charge", {"amount": 5}),
          ToolCall("send", {"to": "ann"}), ToolCall("charge", {"amount": 6}),
          FinalAnswer("done")]


def _agent(ledger: Ledger, name: str = "pns", **kw):
    return make_agent(name, SCRIPT, ledger, **kw)


def _step(run_id: int, index: int) -> Step:
    return Step.objects.get(run_id=run_id, index=index)


def test_step_keys_come_from_the_run_and_the_steps_position(database, tmp_path, clock):
    ledger = Ledger(tmp_path / "ledger")
    with registry.override(_agent(ledger)):
        first = resume(start("pns", {}, clock=clock).pk, owner="w", clock=clock)
        clock.advance(1)
        second = resume(start("pns", {}, clock=clock).pk, owner="w", clock=clock)
    for run in (first, second):
        for s in Step.objects.filter(run_id=run.pk):
            assert s.idempotency_key == step_idempotency_key(run.pk, run.created_at, s.index)
    keys = [c["key"] for c in ledger.calls("charge")]
    assert len(keys) == len(set(keys)) == 4  # one per (run, step)
    # The same id with another creation time (a run created after a backup, its id reused)
    # gets other keys.
    assert step_idempotency_key(first.pk, first.created_at + timedelta(microseconds=1), 2) != (
        _step(first.pk, 2).idempotency_key)


def test_the_fence_holds_every_unfinished_run_and_only_those(database, tmp_path, clock, crash):
    ledger = Ledger(tmp_path / "ledger")
    gated = _agent(ledger, "gated", policy=charges_need_approval)
    with registry.override(_agent(ledger), gated):
        done = resume(start("pns", {}, clock=clock).pk, owner="w", clock=clock)
        queued = start("pns", {}, clock=clock)
        waiting = resume(start("gated", {}, clock=clock).pk, owner="w", clock=clock)
        crash(CrashPoint.AFTER_TOOL_STARTED, step_index=3)  # send started, dispatch unrecorded
        mid = start("pns", {}, clock=clock)
        with pytest.raises(SimulatedCrash):
            resume(mid.pk, owner="dead", clock=clock, lease_seconds=1)
    assert done.status == "succeeded" and waiting.status == "waiting"
    Worker.objects.create(owner="w-old", host="h", pid=1, started_at=clock.now(),
                          heartbeat_at=clock.now())
    taken_at = clock.now() - timedelta(minutes=5)
    clock.advance(60)
    restoration = restore_fence(by="olga", now=clock.now(), taken_at=taken_at)

    assert restoration.runs_held == 3 and Restoration.objects.count() == 1
    assert not Worker.objects.exists()
    assert Run.objects.get(pk=done.pk).restored_at is None  # finished: nothing to hold
    for run_id in (queued.pk, waiting.pk, mid.pk):
        row = Run.objects.get(pk=run_id)
        assert (row.status, row.restored_at, row.lease_owner) == ("queued", taken_at, "")
        (event,) = events(row, "run.restored")
        assert event.payload["backup_taken_at"] == taken_at.isoformat(timespec="microseconds")
        assert event.actor == "olga"
    # A decision taken before the restore may have been acted on after it: cancelled.
    assert Approval.objects.get(run_id=waiting.pk).status == "cancelled"
    for run_id in (done.pk, queued.pk, waiting.pk, mid.pk):
        assert verify(run_id).ok, verify(run_id).problems  # rows replay from events


def test_a_restored_run_asks_before_each_side_effect_and_reads_go_ahead(database, tmp_path,
                                                                         clock):
    ledger = Ledger(tmp_path / "ledger")
    with registry.override(_agent(ledger)):
        run = start("pns", {}, clock=clock)
        restore_fence(by="olga", now=clock.now(), taken_at=clock.now())
        run = resume(run.pk, owner="w", clock=clock)
        assert run.status == "waiting"
        assert ledger.count("read") == 1 and ledger.count("charge") == 0  # the read went ahead
        (first,) = pending()
        assert first.kind == "restored" and first.step.index == 2
        assert first.step.status == "waiting"  # it never started
        assert "Restored from a backup taken at" in first.title
        assert first.step.idempotency_key in first.detail

        approve(first.pk, by="olga")
        run = resume(run.pk, owner="w", clock=clock)
        assert ledger.count("charge") == 1  # the one approved call
        (second,) = pending()
        assert (second.kind, second.step.index) == ("restored", 3)  # the next one asks again
        resolve(second.pk, by="olga", result={"sent": "ann"})
        run = resume(run.pk, owner="w", clock=clock)
        assert ledger.count("send") == 0  # recorded as happened: not sent again
        (third,) = pending()
        reject(third.pk, by="olga", note="already charged before the disk died")
    assert Run.objects.get(pk=run.pk).status == "failed"
    assert ledger.count("charge") == 1
    assert verify(run.pk).ok, verify(run.pk).problems


def test_no_proof_of_non_dispatch_from_before_the_restore_is_trusted(database, tmp_path, clock,
                                                                      crash):
    ledger = Ledger(tmp_path / "ledger")
    with registry.override(_agent(ledger)):
        run = start("pns", {}, clock=clock)
        crash(CrashPoint.AFTER_TOOL_STARTED, step_index=3)  # send started, no dispatch yet
        with pytest.raises(SimulatedCrash):
            resume(run.pk, owner="dead", clock=clock, lease_seconds=1)
        assert ledger.count("charge") == 1 and ledger.count("send") == 0
        clock.advance(5)
        restore_fence(by="olga", now=clock.now(), taken_at=clock.now())
        run = resume(run.pk, owner="w", clock=clock)
    # Without the restore the dispatch record would prove the send never went out and re-run
    # it (side_effect.auto_confirmed); after it, that proof may be stale: a person decides.
    assert run.status == "waiting" and ledger.count("send") == 0
    assert not events(run, "side_effect.auto_confirmed")
    (held,) = pending()
    assert (held.kind, held.step.index, held.step.status) == ("restored", 3, "interrupted")
    assert verify(run.pk).ok, verify(run.pk).problems


def test_a_run_restored_while_a_call_was_approved_asks_again(database, tmp_path, clock):
    ledger = Ledger(tmp_path / "ledger")
    gated = _agent(ledger, "gated", policy=charges_need_approval)
    with registry.override(gated):
        run = resume(start("gated", {}, clock=clock).pk, owner="w", clock=clock)
        approve(pending()[0].pk, by="olga")  # approved, not yet consumed at the backup
        restore_fence(by="olga", now=clock.now(), taken_at=clock.now())
        run = resume(run.pk, owner="w", clock=clock)
    assert ledger.count("charge") == 0
    (held,) = pending()
    assert held.kind == "restored"


def test_a_fence_without_a_known_backup_moment_is_refused_and_changes_nothing(database, clock):
    with pytest.raises(RestoreRefused, match="records no backup"):
        restore_fence(by="olga", now=clock.now())
    assert not Restoration.objects.exists()


def test_an_occurrence_fired_again_after_a_restore_asks_before_its_side_effect(database,
                                                                               tmp_path, clock):
    """The restored schedule's next occurrence is the backup's: an occurrence that fired (and
    paid, under a standing authorization) after the backup fires again, and its run must ask."""
    ledger = Ledger(tmp_path / "ledger")
    with registry.override(_agent(ledger, "nightly-pay", policy=charges_need_approval)):
        s = schedule_create("nightly", "nightly-pay", {}, by="alice", now=clock.now(),
                            interval_seconds=3600)
        schedule_authorize(s.pk, True, by="carol", now=clock.now())
        backup_at = clock.now()
        backup_take(tmp_path / "nightly.backup", by="ops", now=backup_at)
        clock.advance(3600)
        (fired,) = schedules_fire_due(clock.now())  # after the backup: in the lost timeline
        resume(fired, owner="w", clock=clock)
        assert ledger.count("charge") == 2  # the standing authorization let both through
        clock.advance(600)
        backup_restore(tmp_path / "nightly.backup", by="ops", now=clock.now())
        assert Schedule.objects.get(pk=s.pk).next_fire_at <= clock.now()  # due once more
        (again,) = schedules_fire_due(clock.now())
        run = resume(again, owner="w", clock=clock)
        assert run.restored_at == backup_at and run.status == "waiting"
        assert ledger.count("charge") == 2  # not paid a second time without a person
        (held,) = pending()
        assert held.kind == "restored"
        assert verify(run.pk).ok, verify(run.pk).problems
        clock.advance(3600)  # an occurrence after the restore is new: the grant applies
        (later,) = schedules_fire_due(clock.now())
        assert Run.objects.get(pk=later).restored_at is None


def test_a_worker_fires_only_the_schedules_of_its_own_agents(database, tmp_path, clock):
    ledger = Ledger(tmp_path / "ledger")
    with registry.override(_agent(ledger), _agent(ledger, "other")):
        mine = schedule_create("mine", "pns", {}, by="alice", now=clock.now(),
                               interval_seconds=60)
        theirs = schedule_create("theirs", "other", {}, by="alice", now=clock.now(),
                                 interval_seconds=60)
        clock.advance(61)
        fired = schedules_fire_due(clock.now(), agents=["pns"])
    assert [Run.objects.get(pk=pk).schedule_id for pk in fired] == [mine.pk]
    theirs.refresh_from_db()
    assert theirs.next_fire_at <= clock.now()  # left due for a worker that has the agent
