"""The event-loop worker (``runtime.worker.eventloop``): its runs in flight are tasks on one loop,
a tool that blocks that loop cannot starve the heartbeat, sync calls go to a bounded pool, and
the plans of one turn of the loop are committed together. Both engines, real workers in process.
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from django.test import override_settings

from runtime import start
from runtime.agents.agent import Agent, registry
from runtime.agents.llm import FinalAnswer, ScriptedLLM, ToolCall
from runtime.agents.tools import tool
from runtime.errors import RunLeased
from runtime.loop.driver import Driver
from runtime.models import Run
from runtime.storage.sqlite.group import group_stats
from runtime.worker.process import WorkerProcess
from runtime.worker.threads import DaemonPool
from tests import agents
from tests.kit import Background, Gate, Ledger, events_of
from tests.waiting import wait_until


def _worker(concurrency: int, **kw) -> tuple[WorkerProcess, Background]:
    worker = WorkerProcess(concurrency=concurrency, poll_interval=0.05, loop="asyncio", **kw)
    return worker, Background(worker.run)


def _stop(worker: WorkerProcess, bg: Background) -> None:
    worker.request_stop()
    bg.join(60)
    assert not bg.thread.is_alive(), "the worker did not stop"
    assert bg.error is None, bg.error


def test_a_tool_blocking_the_loop_cannot_starve_the_heartbeat(database, tmp_path):
    """An ``async def`` tool that calls blocking code (here a wait on a gate: a sync sleep)
    holds up every run on the loop, but not the heartbeat: both runs' leases are renewed for
    more than a lease length, nobody can take either over, and the tool runs once."""
    gate, ledger = Gate(once=True), Ledger(tmp_path / "ledger")

    @tool(effect="side_effect")
    async def stall(n: int) -> dict:
        """Blocks the event loop's thread until the test lets go."""
        ledger.record(f"stall-{n}")
        gate.hold()  # no await: the loop is stuck here
        await asyncio.sleep(0)
        return {"n": n}

    agent = Agent("stall", ScriptedLLM(lambda t: FinalAnswer("done") if t.entries else
                                       ToolCall("stall", {"n": t.input["n"]})), [stall])
    with registry.override(agent):
        runs = [start("stall", {"n": n}) for n in (1, 2)]
        worker, bg = _worker(2, lease_seconds=0.6)
        gate.wait_inside()
        wait_until(lambda: Run.objects.filter(status="running").count() == 2,
                   what="both runs claimed")
        before = {r.pk: Run.objects.get(pk=r.pk).lease_expires_at for r in runs}
        assert worker.keeper.wait_ticks(4, timeout=10)  # > one lease length of heartbeats
        after = {r.pk: Run.objects.get(pk=r.pk).lease_expires_at for r in runs}
        for r in runs:
            with pytest.raises(RunLeased):
                Driver(name="intruder", lease_seconds=0.6).drive(r.pk)
        gate.release.set()
        wait_until(lambda: all(Run.objects.get(pk=r.pk).status == "succeeded" for r in runs),
                   what="both runs to finish")
        _stop(worker, bg)
    assert all(after[pk] > before[pk] for pk in before), (before, after)
    assert ledger.count("stall-1") == 1 and ledger.count("stall-2") == 1
    for r in runs:
        assert "lease.lost" not in events_of(r) and "run.taken_over" not in events_of(r)


def test_runs_in_flight_share_the_loop_thread_and_its_commits(database):
    """Eight runs in flight on one worker: each run's code (the LLM and the tool, both async)
    runs on the one loop thread, and on SQLite their commits were written in groups."""
    threads: set[str] = set()
    in_flight, most = [0], [0]

    @tool(effect="read_only")
    async def hop(n: int) -> dict:
        """Awaits, so the other runs go on meanwhile."""
        threads.add(threading.current_thread().name)
        in_flight[0] += 1
        most[0] = max(most[0], in_flight[0])
        await asyncio.sleep(0.01)
        in_flight[0] -= 1
        return {"n": n}

    async def decide(t):
        threads.add(threading.current_thread().name)
        return ToolCall("hop", {"n": len(t.entries)}) if len(t.entries) < 3 else FinalAnswer("ok")

    agent = Agent("hop", ScriptedLLM(decide), [hop])
    before = group_stats()
    with registry.override(agent):
        runs = [start("hop", {}) for _ in range(8)]
        _unused, bg = _worker(8, burst=True)
        bg.join(60)
    assert bg.error is None and not bg.thread.is_alive()
    assert {Run.objects.get(pk=r.pk).status for r in runs} == {"succeeded"}
    assert len(threads) == 1 and next(iter(threads)).endswith("-loop"), threads
    assert most[0] > 1  # the runs' awaits overlapped on the one thread
    if database.engine == "sqlite":
        after = group_stats()
        assert after.plans - before.plans > after.groups - before.groups  # some groups of 2+


def test_sync_tools_run_on_a_bounded_pool_of_their_own(database):
    """``RUNTIME_WORKER_BLOCKING_THREADS = 2``: of four runs whose sync tool blocks, two are in
    it at once (on pool threads, not the loop's); the others queue, then run."""
    gate, entered, names = Gate(), [], set()
    lock = threading.Lock()

    @tool(effect="read_only")
    def block() -> dict:
        """A sync call that waits (on the gate)."""
        with lock:
            entered.append(1)
            names.add(threading.current_thread().name)
        gate.hold()
        return {}

    agent = Agent("block", ScriptedLLM([ToolCall("block"), FinalAnswer("ok")]), [block])
    with override_settings(RUNTIME={"WORKER_BLOCKING_THREADS": 2}), registry.override(agent):
        runs = [start("block", {}) for _ in range(4)]
        worker, bg = _worker(4)
        wait_until(lambda: len(entered) == 2, what="two calls in the pool")
        wait_until(lambda: Run.objects.filter(status="running").count() == 4,
                   what="all four claimed")
        # Every run is claimed and two are in their call: the other two wait for a thread.
        assert worker._loop is not None and worker._loop.blocking.threads == 2
        assert len(entered) == 2
        gate.release.set()
        wait_until(lambda: all(Run.objects.get(pk=r.pk).status == "succeeded" for r in runs),
                   what="all four to finish")
        _stop(worker, bg)
    assert len(entered) == 4
    assert all("-blocking-" in n for n in names), names


def test_the_daemon_pool_queues_past_its_limit_and_passes_errors_back():
    pool = DaemonPool(2, "test-pool")
    release = threading.Event()
    started = threading.Semaphore(0)

    def wait() -> str:
        started.release()
        release.wait(10)
        return threading.current_thread().name

    futures = [pool.submit(wait) for _ in range(5)]
    assert started.acquire(timeout=5) and started.acquire(timeout=5)
    assert not started.acquire(timeout=0.2)  # a third call waits for a thread
    assert pool.threads == 2
    release.set()
    names = {f.result(timeout=10) for f in futures}
    assert len(names) == 2 and all(n.startswith("test-pool-") for n in names)

    class Crash(BaseException):
        pass

    def crash() -> None:
        raise Crash()

    with pytest.raises(Crash):
        pool.submit(crash).result(timeout=10)
    pool.shutdown(wait=True)
    with pytest.raises(RuntimeError, match="shut down"):
        pool.submit(wait)


def test_a_stuck_call_does_not_hold_the_interpreter(database):
    """The pool's threads are daemons: one stuck in a call does not block a join at exit."""
    pool = DaemonPool(1, "stuck")
    pool.submit(time.sleep, 3600)
    wait_until(lambda: pool.threads == 1, what="the pool's thread")
    assert all(t.daemon for t in threading.enumerate() if t.name.startswith("stuck-"))
    pool.shutdown(wait=False, cancel_futures=True)


@pytest.mark.engines("postgres")
def test_a_small_connection_pool_serves_the_loop_its_committers_and_its_pool(database, spawn,
                                                                             tmp_path):
    """A pool of 5 connections for 12 runs in flight whose sync tool reads the database: every
    thread that borrowed a connection gives it back after each call, so the heartbeat, the
    loop and the commits all get one, and every run finishes without a database fault."""
    with registry.override(*agents.AGENTS):
        runs = [start("counts", {}) for _ in range(12)]
    worker = spawn("--burst", "--concurrency", "12", "--lease-seconds", "3",
                   env={"RUNTIME_PG_POOL_SIZE": "5", "RUNTIME_PG_NETWORK_TIMEOUT": "2"})
    assert worker.wait(120) == 0, worker.output()[-3000:]
    assert [Run.objects.get(pk=r.pk).status for r in runs] == ["succeeded"] * 12
    out = worker.output()
    assert "0 database faults ridden out" in out and "couldn't get a connection" not in out, out
    assert Ledger(tmp_path / "ledger.jsonl").count("count_runs") == 36


@pytest.mark.engines("sqlite")
def test_a_fault_in_the_loops_group_commit_is_ridden_out_on_a_committer_thread(database,
                                                                              monkeypatch):
    """The first group the loop writes meets a database fault: each of its plans finds out
    from its chain head on a committer thread that it did not land and commits it there; every
    run finishes, each step once, and the audit chains verify."""
    from django.db import OperationalError

    from runtime.audit.chain import verify
    from runtime.storage.sqlite.committer import SqliteEngine

    real, faulted = SqliteEngine.commit_many, []

    def flaky(self, plans, clock):
        if not faulted and len(plans) > 1 and threading.current_thread().name.endswith("-loop"):
            faulted.append(len(plans))
            return [OperationalError("disk I/O error")] * len(plans)
        return real(self, plans, clock)

    monkeypatch.setattr(SqliteEngine, "commit_many", flaky)

    @tool(effect="read_only")
    async def hop(n: int) -> dict:
        """Awaits, so the runs' commits meet in one turn."""
        await asyncio.sleep(0)
        return {"n": n}

    agent = Agent("hop", ScriptedLLM(lambda t: ToolCall("hop", {"n": len(t.entries)})
                                     if len(t.entries) < 3 else FinalAnswer("ok")), [hop])
    with registry.override(agent):
        runs = [start("hop", {}) for _ in range(4)]
        worker, bg = _worker(4, burst=True)
        bg.join(60)
    assert bg.error is None and not bg.thread.is_alive()
    assert faulted and worker._loop is not None and worker._loop.commits.threads >= 1
    for r in runs:
        assert Run.objects.get(pk=r.pk).status == "succeeded"
        assert events_of(r).count("step.tool_finished") == 3
        assert verify(r.pk).ok
