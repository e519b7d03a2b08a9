"""Design §6, one test per lease property (named after the reference implementation's tests).

Lease expiry is driven by a ManualClock wherever the test is about time; the heartbeat tests use
the real clock with sub-second leases and wait on heartbeat ticks, never on sleeps.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from datetime import timedelta

import pytest
from django.db import connection
from django.db.models import F

from runtime import FinalAnswer, ScriptedLLM, ToolCall, start, tool
from runtime.agents.agent import Agent, registry
from runtime.audit.chain import verify
from runtime.errors import LeaseLost, RunLeased, RunNotResumable
from runtime.leasing.claims import run_acquire, run_claim_many
from runtime.leasing.heartbeat import LeaseKeeper, lease_renew, make_owner
from runtime.loop.driver import Driver
from runtime.models import Event, Run, Step
from runtime.storage.postgres.instrument import PgTrace
from runtime.storage.runs import run_create
from runtime.storage.sqlite.instrument import SqliteCounter
from tests.kit import Background, Gate, Ledger, events_of, make_agent

pytestmark = pytest.mark.engines


def _idle_keeper(clock, lease_seconds: float = 1.0) -> LeaseKeeper:
    """A keeper that is never started: no heartbeat, so the lease lapses when the clock says."""
    return LeaseKeeper(lease_seconds, clock=clock)


def _events(run_id: int, kind: str) -> list[Event]:
    return list(Event.objects.filter(run_id=run_id, kind=kind).order_by("seq"))


def test_long_tool_call_keeps_the_lease(database, tmp_path):
    ledger, gate = Ledger(tmp_path / "ledger"), Gate()
    agent = make_agent("long", [ToolCall("read", {"key": "a"}), FinalAnswer("ok")], ledger,
                       {"read": gate})
    keeper = LeaseKeeper(0.6).start()  # renews every 0.2 s
    driver = Driver(name="a", lease_seconds=0.6, keeper=keeper)
    with registry.override(agent):
        run = start("long", {})
        bg = Background(lambda: driver.drive(run.pk))
        gate.wait_inside()
        first_expiry = Run.objects.get(pk=run.pk).lease_expires_at
        entered = time.monotonic()
        assert keeper.wait_ticks(5, timeout=10)
        assert time.monotonic() - entered > 0.6  # the call has outlived the lease's length
        row = Run.objects.get(pk=run.pk)
        assert row.lease_owner == driver.owner
        assert row.lease_expires_at > first_expiry
        with pytest.raises(RunLeased):
            Driver(name="b", lease_seconds=0.6).drive(run.pk)
        gate.release.set()
        bg.join()
    keeper.stop()
    assert bg.error is None
    assert bg.result.status == "succeeded"
    assert ledger.count("read") == 1
    assert _events(run.pk, "step.tool_finished")[0].payload["result"] == {"value": "A"}


def test_held_connection_does_not_starve_the_heartbeat(database):
    gate, seen = Gate(), {}

    @tool(effect="read_only")
    def hog() -> dict:
        """Hold this thread's database connection inside an open transaction."""
        cur = connection.cursor()
        cur.execute("BEGIN")
        cur.execute("SELECT COUNT(*) FROM runtime_event")
        seen["tool_conn"] = id(connection.connection)
        gate.hold()
        cur.execute("COMMIT")
        return {"held": True}

    def on_tick() -> None:
        seen["beat_conn"] = id(connection.connection)

    agent = Agent("hog", ScriptedLLM([ToolCall("hog"), FinalAnswer("ok")]), [hog])
    keeper = LeaseKeeper(0.6, on_tick=on_tick).start()
    driver = Driver(name="a", lease_seconds=0.6, keeper=keeper)
    with registry.override(agent):
        run = start("hog", {})
        bg = Background(lambda: driver.drive(run.pk))
        gate.wait_inside()
        before = Run.objects.get(pk=run.pk).lease_expires_at
        assert keeper.wait_ticks(4, timeout=10)  # > one lease length of heartbeats
        after = Run.objects.get(pk=run.pk).lease_expires_at
        gate.release.set()
        bg.join()
    keeper.stop()
    assert after > before
    assert seen["beat_conn"] != seen["tool_conn"]
    assert bg.error is None and bg.result.status == "succeeded"


def test_lapsed_lease_starts_no_side_effect(database, tmp_path, clock):
    ledger = Ledger(tmp_path / "ledger")

    def stalled_llm(transcript):
        clock.advance(5)  # the process stalls past its 1 s lease while the LLM answers
        return ToolCall("charge", {"amount": 10})

    agent = make_agent("lapse", [], ledger, llm=ScriptedLLM(stalled_llm))
    driver = Driver(name="a", lease_seconds=1, clock=clock, keeper=_idle_keeper(clock))
    with registry.override(agent):
        run = start("lapse", {})
        with pytest.raises(LeaseLost) as err:
            driver.drive(run.pk)
    assert err.value.expired_but_held  # nobody took the run: the clock alone stopped it
    assert ledger.count("charge") == 0
    assert "step.tool_started" not in events_of(run)
    row = Run.objects.get(pk=run.pk)
    assert row.status == "running" and row.lease_owner == driver.owner


def test_loop_that_loses_its_lease_stops_before_the_next_tool_call(database, tmp_path, clock):
    ledger, gate = Ledger(tmp_path / "ledger"), Gate(once=True)
    agent = make_agent("lose", [ToolCall("charge", {"amount": 1}),
                                ToolCall("charge", {"amount": 2}), FinalAnswer("ok")],
                       ledger, {"charge": gate})
    a = Driver(name="a", lease_seconds=1, clock=clock, keeper=_idle_keeper(clock))
    b = Driver(name="b", lease_seconds=30, clock=clock, keeper=_idle_keeper(clock, 30))
    with registry.override(agent):
        run = start("lose", {})
        bg = Background(lambda: a.drive(run.pk))
        gate.wait_inside()
        clock.advance(2)
        taken = b.drive(run.pk)  # takes over; the side effect's outcome is unknown: it waits
        assert taken.status == "waiting"
        gate.release.set()
        bg.join()
    assert isinstance(bg.error, LeaseLost) and not bg.error.expired_but_held
    assert ledger.count("charge") == 1  # the first call went out; the second never started
    assert [c["amount"] for c in ledger.calls("charge")] == [1]
    assert "step.tool_finished" not in events_of(run)  # the late result was not recorded
    assert not Step.objects.filter(run_id=run.pk, index=2).exists()
    after = Event.objects.filter(run_id=run.pk, seq__gt=_events(run.pk, "lease.taken_over")[0].seq)
    assert a.owner not in set(after.values_list("actor", flat=True))
    assert verify(run.pk).ok


def test_no_llm_call_after_the_lease_is_lost(database, tmp_path):
    ledger, gate = Ledger(tmp_path / "ledger"), Gate()
    llm = ScriptedLLM([ToolCall("read", {"key": "a"}), ToolCall("read", {"key": "b"}),
                       FinalAnswer("ok")])
    agent = make_agent("nollm", [], ledger, {"read": gate}, llm=llm)
    keeper = LeaseKeeper(30)
    driver = Driver(name="a", lease_seconds=30, keeper=keeper)
    with registry.override(agent):
        run = start("nollm", {})
        bg = Background(lambda: driver.drive(run.pk))
        gate.wait_inside()
        # Another owner takes the run (a newer epoch), as a takeover would.
        Run.objects.filter(pk=run.pk).update(lease_owner="thief", lease_epoch=F("lease_epoch") + 1)
        keeper.renew_now()  # the heartbeat notices
        gate.release.set()
        bg.join()
    assert isinstance(bg.error, LeaseLost)
    assert llm.calls == 1
    assert events_of(run).count("llm.requested") == 1
    assert ledger.count("read") == 1


def test_expired_lease_records_the_result_but_starts_nothing(database, tmp_path, clock):
    ledger, gate = Ledger(tmp_path / "ledger"), Gate(once=True)
    agent = make_agent("exp", [ToolCall("read", {"key": "a"}), ToolCall("read", {"key": "b"}),
                               FinalAnswer("ok")], ledger, {"read": gate})
    a = Driver(name="a", lease_seconds=1, clock=clock, keeper=_idle_keeper(clock))
    with registry.override(agent):
        run = start("exp", {})
        bg = Background(lambda: a.drive(run.pk))
        gate.wait_inside()
        clock.advance(2)  # expired, but nobody has taken it
        gate.release.set()
        bg.join()
        assert isinstance(bg.error, LeaseLost) and bg.error.expired_but_held
        kinds = events_of(run)
        assert kinds[-1] == "step.tool_finished"  # recorded: the lease was still ours alone
        assert kinds.count("llm.requested") == 1  # but no further LLM request
        done = Driver(name="b", clock=clock, keeper=_idle_keeper(clock)).drive(run.pk)
    assert done.status == "succeeded"
    assert [c["key"] for c in ledger.calls("read")] == ["a", "b"]
    assert events_of(run).count("step.interrupted") == 0  # nothing was in flight


def test_resume_of_a_live_run_is_refused(database, tmp_path):
    ledger, gate = Ledger(tmp_path / "ledger"), Gate()
    agent = make_agent("live", [ToolCall("read", {"key": "a"}), FinalAnswer("ok")], ledger,
                       {"read": gate})
    a = Driver(name="same", lease_seconds=30)
    with registry.override(agent):
        run = start("live", {})
        bg = Background(lambda: a.drive(run.pk))
        gate.wait_inside()
        before = Run.objects.values().get(pk=run.pk)
        events_before = Event.objects.filter(run_id=run.pk).count()
        for name in ("other", "same"):
            with pytest.raises(RunLeased) as err:
                Driver(name=name, lease_seconds=30).drive(run.pk)
            assert err.value.holder == a.owner
        assert Run.objects.values().get(pk=run.pk) == before
        assert Event.objects.filter(run_id=run.pk).count() == events_before
        gate.release.set()
        bg.join()
    assert bg.result.status == "succeeded"
    assert ledger.count("read") == 1


def test_same_lease_owner_name_is_two_owners(database, tmp_path):
    one, two = make_owner("worker"), make_owner("worker")
    assert one != two
    for owner in (one, two):
        assert owner.startswith(f"worker@{socket.gethostname()}:{os.getpid()}:")
    ledger, gate = Ledger(tmp_path / "ledger"), Gate()
    agent = make_agent("twin", [ToolCall("read", {"key": "a"}), FinalAnswer("ok")], ledger,
                       {"read": gate})
    a, b = Driver(name="worker", lease_seconds=30), Driver(name="worker", lease_seconds=30)
    assert a.owner != b.owner
    with registry.override(agent):
        run = start("twin", {})
        bg = Background(lambda: a.drive(run.pk))
        gate.wait_inside()
        with pytest.raises(RunLeased):
            b.drive(run.pk)
        gate.release.set()
        bg.join()
    assert bg.result.status == "succeeded"


def test_expired_lease_is_taken_over_and_reconciled_once(database, tmp_path, clock):
    ledger, gate = Ledger(tmp_path / "ledger"), Gate(once=True)
    agent = make_agent("take", [ToolCall("read", {"key": "a"}), FinalAnswer("ok")], ledger,
                       {"read": gate})
    a = Driver(name="a", lease_seconds=1, clock=clock, keeper=_idle_keeper(clock))
    b = Driver(name="b", lease_seconds=30, clock=clock, keeper=_idle_keeper(clock, 30))
    with registry.override(agent):
        run = start("take", {})
        bg = Background(lambda: a.drive(run.pk))
        gate.wait_inside()
        with pytest.raises(RunLeased):  # refused until the lease expires
            b.drive(run.pk)
        clock.advance(1.5)
        done = b.drive(run.pk)
        gate.release.set()  # the dead owner's tool call finally returns
        bg.join()
        with pytest.raises(RunNotResumable):
            Driver(name="c", clock=clock).drive(run.pk)
    assert done.status == "succeeded"
    assert isinstance(bg.error, LeaseLost)
    kinds = events_of(run)
    assert kinds.count("lease.taken_over") == 1
    assert kinds.count("step.interrupted") == 1
    taken = _events(run.pk, "lease.taken_over")[0]
    assert taken.payload["previous_owner"] == a.owner and taken.actor == b.owner
    interrupted = _events(run.pk, "step.interrupted")[0]
    assert interrupted.seq == taken.seq + 2  # same transaction: taken_over, resumed, interrupted
    finished = _events(run.pk, "step.tool_finished")
    assert [e.payload["attempt"] for e in finished] == [2]  # the dead owner's result is not there
    assert [e.payload["attempt"] for e in _events(run.pk, "step.tool_started")] == [1, 2]
    assert verify(run.pk).ok


def test_a_queued_run_is_claimed_by_exactly_one_of_many_racers(database, tmp_path):
    ledger = Ledger(tmp_path / "ledger")
    agent = make_agent("race", [ToolCall("charge", {"amount": 1}), FinalAnswer("ok")], ledger)
    barrier = threading.Barrier(6)
    outcomes: list[str] = []

    def racer() -> None:
        barrier.wait()
        try:
            Driver(name="r", lease_seconds=30).drive(run.pk)
            outcomes.append("drove")
        except (RunLeased, RunNotResumable) as exc:
            outcomes.append(type(exc).__name__)

    with registry.override(agent):
        run = start("race", {})
        threads = [Background(racer) for _ in range(6)]
        for t in threads:
            t.join()
    assert outcomes.count("drove") == 1, outcomes
    assert ledger.count("charge") == 1
    assert events_of(run).count("lease.taken") == 1


def test_renewal_needs_the_same_owner_and_epoch_and_an_unexpired_lease(database, clock, tmp_path):
    agent = make_agent("renew", [FinalAnswer("ok")], Ledger(tmp_path / "ledger"))
    with registry.override(agent):
        run = start("renew", {})
    lease = run_acquire(run.pk, "me", lease_seconds=1, clock=clock).lease
    clock.advance(0.5)
    assert lease_renew([lease], lease_seconds=1, clock=clock) == []  # renewed
    assert lease.expires_at == clock.now() + timedelta(seconds=1)
    clock.advance(1.5)  # lapsed: a lapsed lease is never revived
    assert lease_renew([lease], lease_seconds=1, clock=clock) == [lease]
    taken = run_acquire(run.pk, "other", lease_seconds=1, clock=clock).lease
    assert taken.epoch == lease.epoch + 1
    assert lease_renew([lease], lease_seconds=1, clock=clock) == [lease]  # old epoch fenced off
    clock.advance(0.1)
    assert lease_renew([lease, taken], lease_seconds=1, clock=clock) == [lease]  # one statement


def _counter():
    return SqliteCounter() if connection.vendor == "sqlite" else PgTrace()


def test_claims_in_a_batch_take_each_run_once_in_one_commit(database, clock):
    queued = [run_create("batch", {"i": i}, now=clock.now()).pk for i in range(40)]
    with _counter() as counted:
        got = run_claim_many("me", 32, lease_seconds=30, clock=clock)
    assert [a.run.pk for a in got] == queued[:32]  # oldest first, each once
    assert all(a.lease.owner == "me" and a.lease.epoch == 1 for a in got)
    if connection.vendor == "sqlite":
        assert counted.commits == 1  # one group commit for all 32 claims
    else:
        assert counted.round_trips < 32 * 2  # one transaction, not a commit per claim
    assert Event.objects.filter(run_id__in=queued, kind="lease.taken").count() == 32
    again = run_claim_many("other", 32, lease_seconds=30, clock=clock)
    assert [a.run.pk for a in again] == queued[32:]  # the rest; none taken twice
    for run_id in queued:
        verify(Run.objects.get(pk=run_id))


def test_the_leases_of_256_runs_in_flight_are_renewed_by_one_statement(database, clock):
    for i in range(256):
        run_create("many", {"i": i}, now=clock.now())
    leases = []
    while len(leases) < 256:
        leases += [a.lease for a in run_claim_many("me", 64, lease_seconds=2, clock=clock)]
    clock.advance(1)
    with _counter() as counted:
        assert lease_renew(leases, lease_seconds=2, clock=clock) == []
    assert counted.statements == 1
    assert all(lease.expires_at == clock.now() + timedelta(seconds=2) for lease in leases)
    assert Run.objects.filter(lease_expires_at=clock.now() + timedelta(seconds=2)).count() == 256


def test_a_claim_looks_at_gone_leases_first_then_queued_runs_of_its_agents_not_excluded(
        database, clock):
    def claimed(pk: int, owner: str, seconds: float) -> int:
        run_acquire(pk, owner, lease_seconds=seconds, clock=clock)
        return pk

    mk = lambda agent: run_create(agent, {}, now=clock.now()).pk  # noqa: E731
    live = claimed(mk("a"), "alive", 60)
    ghost = claimed(mk("a"), "ghost", 60)  # live lease, owner proved dead
    lapsed = claimed(mk("a"), "gone", 1)
    other_agent = mk("b")
    excluded, queued = mk("a"), mk("a")
    clock.advance(2)
    got = run_claim_many("me", 10, lease_seconds=30, clock=clock, agents=["a"],
                         dead_owners=["ghost"], exclude=[excluded])
    assert [a.run.pk for a in got] == [ghost, lapsed, queued]
    assert [a.taken_over for a in got] == [True, True, False]
    reasons = dict(Event.objects.filter(kind="lease.taken_over", run_id__in=[ghost, lapsed])
                   .values_list("run_id", "payload__reason"))
    assert reasons == {ghost: "owner proved dead", lapsed: "lease expired"}
    assert Run.objects.get(pk=live).lease_owner == "alive"
    assert Run.objects.get(pk=other_agent).status == "queued"
    assert Run.objects.get(pk=excluded).status == "queued"


def test_a_claimed_run_is_read_as_the_orm_reads_it_every_field_and_type(database, clock):
    """Claims read runs with a plain cursor and the ORM's converters: times, JSON, decimals
    and the lease's expiry come back as the ORM gives them (what the loop then works with)."""
    run = run_create("a", {"text": "é", "n": [1, 2.5, None]}, now=clock.now())
    Run.objects.filter(pk=run.pk).update(planned=[{"tool": "t", "arguments": {"x": 1}}],
                                         cost="1.250000", tokens_in=7)
    run_acquire(run.pk, "gone", lease_seconds=1, clock=clock)
    clock.advance(2)
    before = Run.objects.get(pk=run.pk)
    [got] = run_claim_many("me", 1, lease_seconds=30, clock=clock)
    assert got.taken_over and got.run.pk == run.pk
    claimed = got.run
    for f in Run._meta.concrete_fields:
        if f.attname in ("status", "lease_owner", "lease_epoch", "lease_expires_at",
                         "event_seq", "event_hash"):
            continue  # moved by the claim itself
        want, have = getattr(before, f.attname), getattr(claimed, f.attname)
        assert (have, type(have)) == (want, type(want)), f.attname
    assert claimed.created_at.tzinfo is not None
    assert claimed._state.adding is False and claimed._state.db == before._state.db
    assert (claimed.lease_owner, claimed.lease_epoch) == ("me", before.lease_epoch + 1)
