"""``manage.py runworker`` as real processes: claims, signals, takeover of dead workers."""

from __future__ import annotations

import os
import re
import signal
from collections import Counter
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from runtime import start
from runtime.agents.agent import registry
from runtime.models import Event, Run
from runtime.models import Worker as WorkerRow
from runtime.selectors.approvals import pending
from runtime.storage.postgres.network import DEFAULT_POOL_SIZE
from tests import agents
from tests.kit import Ledger, events_of
from tests.waiting import wait_until

pytestmark = pytest.mark.engines


@contextmanager
def _agents():
    with registry.override(*agents.AGENTS):
        yield


def _ledger(tmp_path) -> Ledger:
    return Ledger(tmp_path / "ledger.jsonl")


def _entered(tmp_path, name: str, run_id: int, attempt: int = 1):
    path = tmp_path / f"entered-{name}-{run_id}-{attempt}"
    return lambda: path.exists()


def _status(run_id: int) -> str:
    return Run.objects.get(pk=run_id).status


def test_burst_drains_the_queue_and_exits_zero(database, tmp_path, spawn):
    with _agents():
        runs = [start("steps5", {"i": i}) for i in range(6)]
    worker = spawn("--burst", "--concurrency", "3")
    assert worker.wait() == 0, worker.output()
    assert {_status(r.pk) for r in runs} == {"succeeded"}
    assert _ledger(tmp_path).count("noop") == 30
    assert not WorkerRow.objects.exists()  # removed on a clean exit
    out = worker.output()
    # The default shows each run's lifecycle; the events themselves are in the audit log.
    assert f"run={runs[0].pk} owner=worker@" in out and " left succeeded" in out
    assert f"run={runs[0].pk} #" not in out


def test_verbosity_2_logs_every_recorded_event(database, tmp_path, spawn):
    with _agents():
        run = start("steps5", {})
    worker = spawn("--burst", "-v", "2")
    assert worker.wait() == 0, worker.output()
    out = worker.output()
    assert f"run={run.pk} #" in out and "step.tool_finished step=1 actor=worker@" in out


def test_sigterm_lets_the_call_in_flight_finish_then_releases_the_run(database, tmp_path, spawn):
    with _agents():
        run = start("slow", {})
    worker = spawn("--grace-seconds", "60")
    wait_until(_entered(tmp_path, "slow_read", run.pk), what="the tool to start")
    row = WorkerRow.objects.get()
    assert row.pid == worker.pid and row.concurrency == 1
    worker.signal(signal.SIGTERM)
    # The call must still be in flight when the worker takes the signal: on PostgreSQL the
    # handler runs when the idle wait on the listening connection ends, not at once.
    wait_until(lambda: "stopping: no new claims" in worker.output(), what="the signal")
    (tmp_path / "release-slow_read").touch()
    assert worker.wait() == 0, worker.output()
    kinds = events_of(run)
    assert kinds[-3:] == ["step.tool_finished", "run.released", "lease.released"]
    released = Run.objects.get(pk=run.pk)
    assert released.status == "queued" and released.lease_owner == ""
    assert not WorkerRow.objects.exists()
    assert spawn("--burst").wait() == 0
    assert _status(run.pk) == "succeeded"
    assert _ledger(tmp_path).count("slow_read") == 1  # finished once, never re-run


def test_sigterm_past_the_grace_period_releases_an_interrupted_step(database, tmp_path, spawn):
    with _agents():
        run = start("slowpay", {})
    worker = spawn("--grace-seconds", "0.3")
    wait_until(_entered(tmp_path, "slow_charge", run.pk), what="the charge to start")
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0, worker.output()
    assert events_of(run)[-3:] == ["step.interrupted", "run.released", "lease.released"]
    assert _status(run.pk) == "queued"
    assert spawn("--burst").wait() == 0
    # The charge's outcome is unknown: the next worker puts it to a person, it does not re-run.
    assert _status(run.pk) == "waiting"
    assert [a.kind for a in pending()] == ["interrupted_side_effect"]
    assert _ledger(tmp_path).count("slow_charge") == 0


def test_a_second_signal_exits_at_once_leaving_the_lease_to_expire(database, tmp_path, spawn):
    with _agents():
        run = start("slow", {})
    worker = spawn("--grace-seconds", "60")
    wait_until(_entered(tmp_path, "slow_read", run.pk), what="the tool to start")
    worker.signal(signal.SIGTERM)
    wait_until(lambda: "waiting up to 60s" in worker.output(), what="the first signal")
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=20) == 1
    row = Run.objects.get(pk=run.pk)
    assert row.status == "running" and row.lease_owner.startswith("worker@")


def test_a_killed_workers_run_is_taken_over_at_once_on_the_same_host(database, tmp_path, spawn):
    with _agents():
        run = start("slow", {})
    first = spawn("--lease-seconds", "30")
    wait_until(_entered(tmp_path, "slow_read", run.pk), what="the tool to start")
    held = Run.objects.get(pk=run.pk)
    first.kill()  # SIGKILL: nothing of the process survives, its lease is still on the row
    (tmp_path / "release-slow_read").touch()
    second = spawn("--lease-seconds", "30", "--name", "survivor")
    wait_until(lambda: _status(run.pk) == "succeeded", timeout=20, what="the takeover")
    second.signal(signal.SIGTERM)
    assert second.wait() == 0
    taken = Event.objects.get(run_id=run.pk, kind="lease.taken_over")
    assert taken.payload["reason"] == "owner proved dead"
    assert taken.payload["previous_owner"] == held.lease_owner
    assert taken.actor.startswith("survivor@")
    # Well under one lease length: the dead owner's lease had most of its 30 s left.
    assert (held.lease_expires_at - taken.at).total_seconds() > 20
    assert events_of(run).count("step.interrupted") == 1
    # The dead worker's row stays, to be shown as dead; it is not deleted silently.
    assert WorkerRow.objects.filter(pid=first.pid).exists()


def test_a_live_workers_run_is_never_taken(database, tmp_path, spawn):
    with _agents():
        run = start("slow", {})
    holder = spawn("--lease-seconds", "30")
    wait_until(_entered(tmp_path, "slow_read", run.pk), what="the tool to start")
    owner = Run.objects.get(pk=run.pk).lease_owner
    other = spawn("--burst", "--lease-seconds", "30", "--name", "other")
    assert other.wait() == 0
    assert Run.objects.get(pk=run.pk).lease_owner == owner
    assert "lease.taken_over" not in events_of(run)
    (tmp_path / "release-slow_read").touch()
    wait_until(lambda: _status(run.pk) == "succeeded", what="the run to finish")
    holder.signal(signal.SIGTERM)
    assert holder.wait() == 0


def test_a_survivor_takes_over_after_the_lease_expires(database, tmp_path, spawn):
    """Without proof of death (the row says another boot), the survivor waits out the lease."""
    with _agents():
        run = start("slow", {})
    first = spawn("--lease-seconds", "1")
    wait_until(_entered(tmp_path, "slow_read", run.pk), what="the tool to start")
    first.kill()
    WorkerRow.objects.filter(pid=first.pid).update(boot_id="another-boot")
    expires = Run.objects.get(pk=run.pk).lease_expires_at
    (tmp_path / "release-slow_read").touch()
    survivor = spawn("--lease-seconds", "1", "--poll-interval", "0.1")
    wait_until(lambda: _status(run.pk) == "succeeded", timeout=20, what="the takeover")
    survivor.signal(signal.SIGTERM)
    assert survivor.wait() == 0
    taken = Event.objects.get(run_id=run.pk, kind="lease.taken_over")
    assert taken.payload["reason"] == "lease expired" and taken.at >= expires


def test_a_failing_run_never_takes_the_worker_or_other_runs_down(database, tmp_path, spawn):
    with _agents():
        down, boom, fine = start("llmdown", {}), start("toolboom", {}), start("steps5", {})
    worker = spawn("--burst", "--concurrency", "3")
    assert worker.wait() == 0, worker.output()
    assert Run.objects.get(pk=down.pk).failure_message.startswith("LLM request failed")
    assert Run.objects.get(pk=boom.pk).output == "survived"
    assert _status(fine.pk) == "succeeded"


@pytest.mark.slow
def test_four_workers_share_one_database_without_locking_errors(database, tmp_path, spawn):
    with _agents():
        runs = [start("steps5", {"i": i}) for i in range(300)]
    workers = [spawn("--burst", "--concurrency", "4", "--poll-interval", "0.05",
                     tag=f"w{i}") for i in range(4)]
    for w in workers:
        assert w.wait(timeout=600) == 0, w.output()[-2000:]
    statuses = Counter(Run.objects.filter(pk__in=[r.pk for r in runs])
                       .values_list("status", flat=True))
    assert statuses == {"succeeded": 300}
    calls = Counter((c["run"], c["step"]) for c in _ledger(tmp_path).calls("noop"))
    assert len(calls) == 1500 and max(calls.values()) == 1  # no step executed twice
    for w in workers:
        out = w.output()
        assert "database is locked" not in out and "Traceback" not in out
    handled = [int(re.search(r"\((\d+) runs handled", w.output())[1]) for w in workers]
    assert sum(handled) == 300


def test_agents_option_claims_only_those_agents_runs(database, tmp_path, spawn):
    with _agents():
        mine = start("steps5", {})
        other = start("toolboom", {})
    assert spawn("--burst", "--agents", "steps5").wait() == 0
    assert _status(mine.pk) == "succeeded" and _status(other.pk) == "queued"
    assert spawn("--burst", "--agents", "nobody").wait() != 0  # unknown agent: refused
    assert _status(other.pk) == "queued"


def test_a_worker_given_a_cpu_runs_every_thread_on_it_and_says_so(database, tmp_path, spawn):
    import os
    from pathlib import Path

    cpu = max(os.sched_getaffinity(0))
    with _agents():
        run = start("steps5", {})
    worker = spawn("--concurrency", "4", "--cpu", str(cpu))
    wait_until(lambda: _status(run.pk) == "succeeded", what="the run to finish")
    assert "concurrency 4, lease" in worker.output() and f", CPU {cpu}" in worker.output()
    masks = set()
    for task in Path(f"/proc/{worker.pid}/task").iterdir():
        for line in (task / "status").read_text().splitlines():
            if line.startswith("Cpus_allowed_list:"):
                masks.add(line.split()[1])
    assert masks == {str(cpu)}, masks  # the slots, heartbeat, checkpointer: one CPU
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0, worker.output()


@pytest.fixture
def unfrozen():
    """An in-process worker freezes what exists at its start (``gc.freeze``): undone after."""
    import gc

    gc.unfreeze()
    yield
    gc.unfreeze()


def test_a_slot_s_next_run_is_claimed_while_its_run_commits_its_end(database, unfrozen):
    """A run's last commit and its successor's claim overlap: the successor is claimed while
    the slot's run is still committing its end, waits for that slot, and only then starts
    (one run at a time in a slot of its own)."""
    import threading

    from runtime.worker.process import WorkerProcess

    with _agents():
        first, second = start("final", {}), start("final", {})
    claimed = threading.Event()

    class Watched(WorkerProcess):
        def _ending(self) -> None:  # on the first run's thread, before its last commit
            super()._ending()
            if not claimed.is_set():
                # the claim loop, woken by the line above, claims the second run meanwhile
                assert wait_until(lambda: _status(second.pk) == "running",
                                  what="the successor's claim")
                assert _status(first.pk) == "running"  # its end is not committed yet
                claimed.set()

    with _agents():
        worker = Watched(concurrency=1, burst=True, poll_interval=0.05)
        assert worker.run() == 0
    assert claimed.is_set()
    assert _status(first.pk) == _status(second.pk) == "succeeded"
    ended = Event.objects.get(run_id=first.pk, kind="run.succeeded")
    took = Event.objects.get(run_id=second.pk, kind="run.started")
    began = Event.objects.filter(run_id=second.pk, kind="step.started").first()
    assert took.pk < ended.pk < began.pk  # claimed before the first ended; ran after it
    assert worker.finished == 2


def test_a_worker_keeps_what_start_up_built_out_of_the_collector_s_full_passes(database, unfrozen):
    import gc

    from runtime.worker.process import WorkerProcess

    assert gc.get_freeze_count() == 0
    with _agents():
        run = start("final", {})
        assert WorkerProcess(concurrency=1, burst=True, poll_interval=0.05).run() == 0
    assert gc.get_freeze_count() > 0
    assert _status(run.pk) == "succeeded"


def _connections_to(pid: int, port: int) -> int:
    """TCP connections process ``pid`` holds open to ``port`` (its sockets, matched in the
    kernel's table)."""
    fds = Path(f"/proc/{pid}/fd")
    inodes = {link[8:-1] for fd in fds.iterdir()
              if (link := os.readlink(fd)).startswith("socket:[")}
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            remote_port, state, inode = int(fields[2].split(":")[1], 16), fields[3], fields[9]
            count += remote_port == port and state == "01" and inode in inodes
    return count


def _entered_pids(tmp_path) -> list[str]:
    """The pid each ``slow_read`` that has announced itself wrote (a file still empty is one
    being written: not yet counted)."""
    return [pid for p in tmp_path.glob("entered-slow_read-*") if (pid := p.read_text())]


def test_one_worker_holds_256_runs_in_flight_at_once(database, tmp_path, spawn):
    """``--concurrency 256``: every run is in its tool at the same moment, in one process; on
    PostgreSQL the runs waiting outside the database hold no connection of the server's."""
    with _agents():
        runs = [start("slow", {}) for _ in range(256)]
    worker = spawn("--burst", "--concurrency", "256")
    try:
        entered = wait_until(lambda: len(pids := _entered_pids(tmp_path)) == 256 and pids,
                             timeout=120, what="256 runs in their tool")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; the worker said: {worker.output()[-1500:]}") from None
    assert set(entered) == {str(worker.pid)}
    assert Run.objects.filter(status="running").count() == 256
    if database.is_postgres:
        # What the worker's pool lends at most, and its listener's own connection.
        assert _connections_to(worker.pid, urlsplit(database.url).port) <= DEFAULT_POOL_SIZE + 1
    (tmp_path / "release-slow_read").write_text("")
    assert worker.wait(timeout=300) == 0, worker.output()[-2000:]
    assert Counter(Run.objects.filter(pk__in=[r.pk for r in runs])
                   .values_list("status", flat=True)) == {"succeeded": 256}
    assert sorted(c["run"] for c in _ledger(tmp_path).calls("slow_read")) == sorted(
        r.pk for r in runs)
    assert "Traceback" not in worker.output()


def test_a_worker_started_while_its_database_is_down_waits_for_it(tmp_path):
    """A worker that starts while the server is away (a restart) asks again instead of dying:
    here it is pointed at a PostgreSQL port nobody listens on, and is still alive (waiting,
    saying why) until the test ends it by its pid."""
    import socket

    from tests.procs import SpawnedWorker
    from tests.waiting import wait_until

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    worker = SpawnedWorker(f"postgres://root@127.0.0.1:{port}/nowhere", tmp_path, "--burst")
    try:
        wait_until(lambda: worker.output().count("the database cannot be reached") >= 2,
                   "the worker to ask again", timeout=60)
        assert worker.proc.poll() is None
    finally:
        worker.kill()
