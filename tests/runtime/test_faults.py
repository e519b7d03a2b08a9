"""Workers that survive the database: claims without races, terminated connections, a write
lock held by someone else, heartbeats under contention, runs that end without a false alarm,
and a database that speaks another protocol. Real worker processes, real servers."""

from __future__ import annotations

import re
import signal
import sqlite3
from collections import Counter
from contextlib import contextmanager

import psycopg
import pytest
from django.db import connection

from runtime import start
from runtime.agents.agent import registry
from runtime.clock import SYSTEM_CLOCK
from runtime.errors import ProtocolMismatch
from runtime.leasing.claims import run_acquire
from runtime.models import Event, Protocol, Run
from runtime.storage.protocol import PROTOCOL_VERSION, forget
from tests import agents
from tests.kit import Ledger
from tests.waiting import wait_until

pytestmark = pytest.mark.slow


@contextmanager
def _agents():
    with registry.override(*agents.AGENTS):
        yield


def _statuses(ids: list[int]) -> Counter:
    return Counter(Run.objects.filter(pk__in=ids).values_list("status", flat=True))


def _stop_line(output: str) -> re.Match:
    found = re.search(r"\((\d+) runs handled, (\d+) claim conflicts, (\d+) database faults",
                      output)
    assert found, output[-2000:]
    return found


@pytest.mark.engines("postgres")
def test_eight_workers_claim_five_hundred_runs_each_exactly_once(database, spawn):
    with _agents():
        ids = [start("final", {"i": i}).pk for i in range(500)]
    workers = [spawn("--burst", "--concurrency", "4", tag=f"w{i}") for i in range(8)]
    for w in workers:
        assert w.wait(timeout=300) == 0, w.output()[-2000:]
    assert _statuses(ids) == {"succeeded": 500}
    taken = Counter(Event.objects.filter(run_id__in=ids, kind="lease.taken")
                    .values_list("run_id", flat=True))
    assert len(taken) == 500 and set(taken.values()) == {1}  # each claimed exactly once
    assert not Event.objects.filter(run_id__in=ids, kind="lease.taken_over").exists()
    lines = [_stop_line(w.output()) for w in workers]
    assert sum(int(m[1]) for m in lines) == 500
    assert [int(m[2]) for m in lines] == [0] * 8  # no claim lost a race and was retried


@pytest.mark.engines("postgres")
def test_a_worker_rides_out_its_connections_being_terminated(database, tmp_path, spawn):
    with _agents():
        ids = [start("mixed", {"i": i}).pk for i in range(40)]
    worker = spawn("--concurrency", "4", "--poll-interval", "0.2")
    events = Event.objects.filter(run_id__in=ids)

    def finished() -> bool:
        return not Run.objects.filter(pk__in=ids, status__in=["queued", "running"]).exists()

    terminated = 0
    while not finished():
        # Wait for progress, then cut every connection the worker has (its slots', its
        # heartbeat's, its listener's): the server-side kill a failover or an admin does.
        seen = events.count()
        wait_until(lambda seen=seen: worker.proc.poll() is not None or finished()
                   or events.count() > seen + 5, timeout=60, what="progress")
        assert worker.proc.poll() is None, worker.output()[-3000:]
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                           "WHERE datname = current_database() AND pid <> pg_backend_pid()")
            terminated += 1 if cursor.fetchone()[0] else 0
    assert worker.proc.poll() is None  # alive through every cut
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=60) == 0, worker.output()[-3000:]
    assert terminated >= 5
    assert _statuses(ids) == {"succeeded": len(ids)}, worker.output()[-3000:]
    charges = Counter(c["run"] for c in Ledger(tmp_path / "ledger.jsonl").calls("fast_charge"))
    assert charges == dict.fromkeys(ids, 1)  # every charge ran once: none twice, none lost
    assert "database fault" in worker.output()


@pytest.mark.engines("sqlite")
def test_a_worker_waits_out_a_write_lock_held_past_its_timeout(database, tmp_path, spawn):
    """Another process sits on SQLite's write lock longer than the worker's timeout while the
    worker looks for work and a dead owner's lease runs out: the worker stays up, and claims
    and takes over once the lock is free."""
    with _agents():
        expiring = start("steps5", {}).pk
    lease = run_acquire(expiring, "gone@elsewhere:1:x", lease_seconds=2).lease
    worker = spawn("--poll-interval", "0.1", env={"RUNTIME_SQLITE_TIMEOUT": "0.5"})
    wait_until(lambda: "started" in worker.output(), timeout=30, what="the worker to start")
    holder = sqlite3.connect(database.path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another process, frozen with the write lock
    try:
        wait_until(lambda: worker.output().count("database fault while claiming") >= 2
                   and SYSTEM_CLOCK.now() > lease.expires_at, timeout=30,
                   what="the worker to meet the held lock past the dead owner's lease")
        assert worker.proc.poll() is None
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    with _agents():
        queued = start("steps5", {}).pk
    wait_until(lambda: _statuses([queued, expiring]) == {"succeeded": 2}, timeout=30,
               what="both runs to finish once the lock is free")
    assert Event.objects.filter(run_id=expiring, kind="lease.taken_over").count() == 1
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0, worker.output()[-2000:]
    assert int(_stop_line(worker.output())[3]) >= 2


@pytest.mark.engines("sqlite")
def test_a_heartbeat_renews_on_time_under_write_contention(database, tmp_path, spawn):
    """A 3 s lease on a 10 s call, while 4 workers x 4 threads commit short runs."""
    with _agents():
        long_run = start("long", {}).pk
    holder = spawn("--lease-seconds", "3", tag="long")
    wait_until(lambda: Event.objects.filter(run_id=long_run, kind="step.tool_started").exists(),
               timeout=30, what="the long call to start")
    with _agents():
        short = [start("steps5", {"i": i}).pk for i in range(200)]
    crowd = [spawn("--burst", "--concurrency", "4", "--lease-seconds", "3", tag=f"c{i}")
             for i in range(4)]
    for w in crowd:
        assert w.wait(timeout=300) == 0, w.output()[-2000:]
    wait_until(lambda: _statuses([long_run]) == {"succeeded": 1}, timeout=60,
               what="the long run to finish")
    holder.signal(signal.SIGTERM)
    assert holder.wait(timeout=30) == 0
    assert _statuses(short) == {"succeeded": 200}
    assert not Event.objects.filter(run_id=long_run, kind="lease.taken_over").exists()
    assert Ledger(tmp_path / "ledger.jsonl").count("long_read") == 1
    for w in [holder, *crowd]:
        assert "lease lost" not in w.output(), w.output()[-2000:]


@pytest.mark.engines
def test_runs_that_end_normally_are_never_reported_lost(database, spawn):
    with _agents():
        ids = [start("steps5", {"i": i}).pk for i in range(300)]
    worker = spawn("--burst", "--concurrency", "4", "--lease-seconds", "0.6")
    assert worker.wait(timeout=300) == 0, worker.output()[-2000:]
    assert _statuses(ids) == {"succeeded": 300}
    assert "lease lost" not in worker.output()
    assert not Event.objects.filter(run_id__in=ids, kind="lease.taken_over").exists()


@pytest.mark.engines
@pytest.mark.parametrize("version", [PROTOCOL_VERSION + 1, PROTOCOL_VERSION - 1])
def test_a_database_of_another_protocol_is_refused(database, spawn, version):
    with _agents():
        run = start("steps5", {})
    Protocol.objects.filter(pk=1).update(version=version)
    forget()
    try:
        worker = spawn("--burst")
        assert worker.wait(timeout=60) == 3
        out = worker.output()
        assert f"the database speaks protocol {version}" in out
        assert ("deploy the new version" if version > PROTOCOL_VERSION
                else "run `manage.py migrate`") in out
        with pytest.raises(ProtocolMismatch):
            run_acquire(run.pk, "me", lease_seconds=5)
    finally:
        forget()
    assert Run.objects.get(pk=run.pk).status == "queued"  # nothing claimed, nothing written
    assert Event.objects.filter(run_id=run.pk).count() == 1


@pytest.mark.engines("postgres")
def test_an_idle_worker_wakes_on_a_notification_not_its_poll(database, spawn):
    worker = spawn("--poll-interval", "120")
    wait_until(lambda: "started" in worker.output(), timeout=30, what="the worker to start")
    with _agents():
        run = start("steps5", {}).pk  # notifies after its commit
    wait_until(lambda: _statuses([run]) == {"succeeded": 1}, timeout=30,
               what="the idle worker to wake (its next poll is two minutes away)")
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0


@pytest.mark.engines("postgres")
def test_leases_are_judged_by_the_servers_clock(database, monkeypatch):
    """A worker whose clock runs two hours slow still sets expiries by the server's clock, and
    cannot start an outside call on a lease the server's clock says has lapsed."""
    import datetime as real

    from runtime import clock as clock_module
    from runtime.errors import LeaseLost
    from runtime.leasing.lease import lease_commit, lease_plan

    class Slow(real.datetime):
        @classmethod
        def now(cls, tz=None):
            return real.datetime.now(tz) - real.timedelta(hours=2)

    with _agents():
        run = start("steps5", {})
    monkeypatch.setattr(clock_module, "datetime", Slow)
    with psycopg.connect(database.url) as conn:
        before = conn.execute("SELECT clock_timestamp()").fetchone()[0]
        lease = run_acquire(run.pk, "slow@elsewhere:1:x", lease_seconds=30).lease
        server_now = conn.execute("SELECT clock_timestamp()").fetchone()[0]
    # Set by the server's clock at the claim, between the two readings: not two hours early.
    thirty = real.timedelta(seconds=30)
    assert before + thirty <= lease.expires_at <= server_now + thirty
    Run.objects.filter(pk=run.pk).update(lease_expires_at=server_now)  # lapsed, by the server
    plan = lease_plan(lease, clock_module.SYSTEM_CLOCK.now())
    plan.event("llm.requested", {"request": 1})
    with pytest.raises(LeaseLost) as lost:
        lease_commit(lease, plan, clock_module.SYSTEM_CLOCK)
    assert lost.value.expired_but_held
    assert Event.objects.filter(run_id=run.pk, kind="llm.requested").count() == 0


@contextmanager
def _fault_after_commit(kind: str, then=None):
    """The first commit holding a ``kind`` event lands, then its reply is lost (a fault)."""
    from django.db import OperationalError

    from runtime.storage.engines import engine

    cls = type(engine())
    real = cls.commit
    fired = []

    def commit(self, plan, clock):
        done = real(self, plan, clock)
        if not fired and any(e.kind == kind for e in plan.events):
            fired.append(plan)
            if then is not None:
                then()
            raise OperationalError("server closed the connection unexpectedly")
        return done

    cls.commit = commit
    try:
        yield fired
    finally:
        cls.commit = real


def _charge_agent(tmp_path):
    from runtime import FinalAnswer, ToolCall
    from tests.kit import make_agent

    ledger = Ledger(tmp_path / "ledger")
    return make_agent("pay", [ToolCall("charge", {"amount": 5}), FinalAnswer("ok")], ledger), ledger


@pytest.mark.engines
def test_a_commit_whose_reply_was_lost_is_found_landed_not_sent_again(database, tmp_path):
    from runtime import resume
    from runtime.audit.chain import verify

    agent, ledger = _charge_agent(tmp_path)
    with registry.override(agent):
        run = start("pay", {})
        with _fault_after_commit("step.tool_started") as fired:
            done = resume(run.pk, lease_seconds=30)
    assert fired and done.status == "succeeded"
    assert ledger.count("charge") == 1
    kinds = list(Event.objects.filter(run_id=run.pk).values_list("kind", flat=True))
    assert kinds.count("step.tool_started") == 1 and kinds.count("step.started") == 2
    assert verify(run.pk).ok


@pytest.mark.engines
def test_a_landed_tool_start_on_a_lease_that_lapsed_meanwhile_starts_nothing(database, tmp_path,
                                                                              clock):
    from runtime import resume
    from runtime.errors import LeaseLost

    agent, ledger = _charge_agent(tmp_path)
    with registry.override(agent):
        run = start("pay", {})
        with (_fault_after_commit("step.tool_started", then=lambda: clock.advance(60)),
              pytest.raises(LeaseLost) as lost):
            resume(run.pk, lease_seconds=5, clock=clock)
    assert lost.value.expired_but_held
    assert ledger.count("charge") == 0  # recorded as started, never called
    assert Run.objects.get(pk=run.pk).status == "running"  # a takeover puts it to a person


@pytest.mark.engines
def test_a_fault_while_finding_out_is_asked_again_never_committed_blind(database, tmp_path,
                                                                        monkeypatch):
    from django.db import OperationalError

    from runtime import resume
    from runtime.leasing import lease as store

    real = store._landed
    asked = []

    def flaky(plan, clock, lease):
        asked.append(plan)
        if len(asked) == 1:
            raise OperationalError("the connection is lost")
        return real(plan, clock, lease)

    monkeypatch.setattr(store, "_landed", flaky)
    agent, ledger = _charge_agent(tmp_path)
    with registry.override(agent):
        run = start("pay", {})
        with _fault_after_commit("step.tool_started"):
            assert resume(run.pk, lease_seconds=30).status == "succeeded"
    assert len(asked) == 2 and ledger.count("charge") == 1
    assert Event.objects.filter(run_id=run.pk, kind="step.tool_started").count() == 1


def test_a_wake_up_written_after_a_clear_still_wakes():
    """set() raced clear(): the flag ended cleared but set()'s byte is in the pipe."""
    import os

    from runtime.worker.slots import Wakeup

    wake = Wakeup()
    try:
        wake.clear()
        os.write(wake._write, b"\0")
        woken, _ = wake.wait(5.0)
        assert woken
        wake.clear()
        assert wake.wait(0.0) == (False, False)
    finally:
        wake.close()
