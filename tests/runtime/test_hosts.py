"""runtime.testkit.hosts: workers on separate hosts (network namespaces on a bridge) against a
PostgreSQL server of the test's own, with network faults between them."""

from __future__ import annotations

import os
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.core.management import call_command

from runtime.benchkit.db import use_database
from runtime.models import Approval, ApprovalStatus, Event, Run, RunStatus
from runtime.models import Worker as WorkerRow
from runtime.testkit import APPROVE, ProcessKit
from runtime.testkit.hosts import Cluster, PgServer
from tests.engines import postgres_config
from tests.procs import ROOT
from tests.waiting import wait_until

# Real processes on hosts of their own (network namespaces, a PostgreSQL server each):
# slow, and one machine-wide resource, so they never run beside each other.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("machine")]

AGENTS = "runtime.testkit.agents.AGENTS"
LEASE = 2.0


class Site:
    """The cluster, its database server and the test's view of both."""

    def __init__(self, cluster: Cluster, server: PgServer, url: str, workdir: Path) -> None:
        self.cluster, self.server, self.url, self.workdir = cluster, server, url, workdir
        self.env = {**os.environ, "DATABASE_URL": url, "RUNTIME_AGENTS": AGENTS,
                    "RUNTIME_TEST_DIR": str(workdir), "RUNTIME_KIT_HOLD_DIR": str(workdir),
                    "PYTHONUNBUFFERED": "1"}
        for key in ("RUNTIME_CRASH_POINTS", "RUNTIME_CRASH_REACHED_FILE"):
            self.env.pop(key, None)

    def worker(self, host: str, name: str, *extra: str, skew: float = 0.0,
               url: str | None = None) -> Any:
        """``runworker`` inside ``host``; ``skew``: its clock that many seconds off;
        ``url``: another way to the database (a slow link)."""
        command = ([sys.executable, str(ROOT / "runtime" / "testkit" / "skew.py"), str(skew)]
                   if skew
                   else [sys.executable, str(ROOT / "manage.py")])
        env = {**self.env, "DATABASE_URL": url} if url else self.env
        proc = self.cluster.popen(
            host, [*command, "runworker", "--name", name, "--lease-seconds", str(LEASE),
                   "--poll-interval", "0.2", *extra],
            env=env, log=self.workdir / f"{name}.log", cwd=ROOT)
        proc.log = self.workdir / f"{name}.log"  # type: ignore[attr-defined]
        return proc




@pytest.fixture
def site(tmp_path: Path, _sqlite_settings: dict[str, Any], django_db_blocker) -> Iterator[Site]:
    cluster = Cluster(3)
    cluster.up()
    server = PgServer(cluster.address, 6400 + cluster.net, cluster.subnet)
    try:
        server.start()
        with psycopg.connect(server.url("postgres"), autocommit=True) as admin:
            admin.execute("CREATE DATABASE runtime")
        url = server.url("runtime")
        with django_db_blocker.unblock():
            use_database(postgres_config(url))
            try:
                call_command("migrate", verbosity=0, interactive=False)
                yield Site(cluster, server, url, tmp_path)
            finally:
                use_database(_sqlite_settings)
    finally:
        cluster.down()  # kills what it started, by pid
        server.remove()


def _state(pid: int) -> str:
    """A process's state letter (``T``: stopped)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def _owner(name: str) -> str:
    return WorkerRow.objects.get(name=name).owner


@pytest.mark.parametrize("fault", ["partition", "pause", "pause-host"])
def test_a_cut_off_worker_is_taken_over_and_afterwards_records_nothing(site, fault):
    """Worker A (host 1) is inside a side-effect call when its host loses the database
    (``partition``: its link goes down) or its process stops (``pause``: SIGSTOP) or every
    process on its host does (``pause-host``, as a VM paused for longer than its lease). Its
    lease lapses by the database's clock; worker B (host 2) takes the run over and, the call's
    outcome being unknown, asks a person. When A
    comes back and its call returns, A records nothing (its commit is fenced off by the new
    epoch) and starts no further call; the outside world's ledger counts the one call A made,
    then the one an approval allowed."""
    a_host, b_host = site.cluster.hosts[0], site.cluster.hosts[1]
    kit = ProcessKit(site.url, site.workdir, agents=AGENTS, manage=ROOT / "manage.py",
                     lease_seconds=LEASE, env=site.env)
    run_id = kit.start("charge")
    a = site.worker(a_host, "a")
    entered = site.workdir / f"entered-{run_id}-1"
    wait_until(entered.exists, "worker A inside the charge")
    owner_a = _owner("a")
    if fault == "partition":
        site.cluster.partition(a_host)
        assert not site.cluster.reachable(a_host, site.server.port, timeout=1)
    elif fault == "pause":
        site.cluster.pause(a)
    else:
        assert a.pid in site.cluster.pause_host(a_host)
        wait_until(lambda: _state(a.pid) == "T", "worker A stopped", timeout=10)
    kit.wait_for_expiry([run_id])
    b = site.worker(b_host, "b")
    wait_until(lambda: Approval.objects.filter(run_id=run_id,
                                             status=ApprovalStatus.PENDING).exists(),
             "worker B to take the run over and ask a person")
    taken = Event.objects.get(run_id=run_id, kind="lease.taken_over")
    assert taken.payload["previous_owner"] == owner_a and taken.actor != owner_a
    if fault == "partition":
        site.cluster.heal(a_host)
    elif fault == "pause":
        site.cluster.resume(a)
    else:
        site.cluster.resume_host(a_host)
    (site.workdir / f"release-{run_id}").touch()
    wait_until(lambda: re.search(rf"run={run_id} owner={re.escape(owner_a)} stopped",
                               a.log.read_text()) is not None,
             "worker A to find its lease gone", timeout=120)
    assert a.poll() is None  # A survived it
    assert not Event.objects.filter(run_id=run_id, seq__gt=taken.seq, actor=owner_a).exists()
    assert kit.ledger.executions()[(run_id, 2)] == 1  # A's one call; nothing started after
    kit.operate(lambda approval: APPROVE)
    wait_until(lambda: Run.objects.get(pk=run_id).status == RunStatus.SUCCEEDED,
             "the approved re-run to finish")
    assert kit.ledger.executions()[(run_id, 2)] == 2  # one more, with the approval consumed
    report = kit.check([run_id])
    assert report.approvals_consumed == 1 and report.violations == []
    for proc in (a, b):
        site.cluster.kill(proc)


def _held_run_survives(site, kit, holder: Any, others: Any, seconds: float) -> tuple[int, list]:
    """Start a charge, let ``holder`` (the only worker yet) enter it, start the others
    (``others()``), keep the call open ``seconds`` while they look for runs to take, release
    it; the run's id once it has succeeded, and the others."""
    run_id = kit.start("charge")
    wait_until((site.workdir / f"entered-{run_id}-1").exists, "the holder inside the charge")
    started = others()
    wait_until(lambda: WorkerRow.objects.count() == 1 + len(started), "the others registered")
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:  # the others poll every 0.2 s meanwhile
        assert holder.poll() is None
        assert not Event.objects.filter(run_id=run_id, kind="lease.taken_over").exists()
        time.sleep(0.2)
    (site.workdir / f"release-{run_id}").touch()
    wait_until(lambda: Run.objects.get(pk=run_id).status == RunStatus.SUCCEEDED,
             "the held run to finish")
    assert not Event.objects.filter(run_id=run_id, kind="lease.taken_over").exists()
    assert kit.ledger.executions()[(run_id, 2)] == 1
    return run_id, started


@pytest.mark.parametrize("skew", [7200.0, -7200.0])
def test_a_clock_two_hours_off_neither_takes_a_live_lease_nor_loses_its_own(site, skew):
    """The holder's clock is two hours off one way and the other workers' two hours off the
    other way (one of them always "sees" the lease as long expired by its own clock): the
    database's clock judges leases, so a call held open for three lease periods is never taken
    over, and the holder's renewals keep its lease."""
    kit = ProcessKit(site.url, site.workdir, agents=AGENTS, manage=ROOT / "manage.py",
                     lease_seconds=LEASE, env=site.env)
    a = site.worker(site.cluster.hosts[0], "a", skew=skew)
    began = time.monotonic()
    run_id, others = _held_run_survives(
        site, kit, a, lambda: [site.worker(site.cluster.hosts[i], f"o{i}", skew=-skew)
                               for i in (1, 2)], 3 * LEASE)
    window = time.monotonic() - began
    # the skew was real: the holder stamped its events with its own clock, so the time between
    # the run's creation (this process) and the charge's start (the holder) is the skew plus
    # some of the time this test took
    started = Event.objects.get(run_id=run_id, kind="step.tool_started", step_index=2)
    claimed = Event.objects.get(run_id=run_id, kind="run.created")
    real = (started.at - claimed.at).total_seconds() - skew
    assert -0.01 <= real <= window
    assert a.log.read_text().count("lease lost") == 0
    for proc in (a, *others):
        site.cluster.kill(proc)


def test_a_worker_on_a_slow_link_keeps_its_runs(site):
    """Worker A reaches the database through a link that holds every packet 100-150 ms each
    way (well below the two-second lease); the other workers are close by. A call held open for
    three lease periods is never taken over and the run finishes."""
    from runtime.testkit.hosts import DelayProxy

    port = site.server.port + 1
    proxy = DelayProxy((site.cluster.address, port), (site.cluster.address, site.server.port),
                       delay=0.1, jitter=0.05)
    proxy.start()
    try:
        kit = ProcessKit(site.url, site.workdir, agents=AGENTS, manage=ROOT / "manage.py",
                         lease_seconds=LEASE, env=site.env)
        slow = proxy.url(site.url)
        a = site.worker(site.cluster.hosts[0], "a", url=slow)
        _run_id, others = _held_run_survives(
            site, kit, a, lambda: [site.worker(site.cluster.hosts[i], f"o{i}") for i in (1, 2)],
            3 * LEASE)
        for proc in (a, *others):
            site.cluster.kill(proc)
    finally:
        proxy.stop()


def test_every_worker_rides_out_a_database_restart_and_every_run_ends(site):
    """Three workers on three hosts work through 30 runs (reads and charges); the database
    server restarts in the middle. Every worker survives, every run ends (an operator approving
    what a cut connection left in doubt), and no side effect ran twice without an approval
    consumed, by the outside world's ledger."""
    env = {k: v for k, v in site.env.items() if k != "RUNTIME_KIT_HOLD_DIR"}
    env["RUNTIME_KIT_TOOL_SECONDS"] = "0.2"
    site.env = env
    kit = ProcessKit(site.url, site.workdir, agents=AGENTS, manage=ROOT / "manage.py",
                     lease_seconds=LEASE, env=env)
    runs = [kit.start("charge" if i % 2 else "read") for i in range(30)]
    workers = [site.worker(host, f"w{i}", "--concurrency", "3")
               for i, host in enumerate(site.cluster.hosts)]
    wait_until(lambda: Run.objects.filter(pk__in=runs, status=RunStatus.SUCCEEDED).count() >= 5,
             "work under way")
    site.server.restart()
    from django.db import connection

    connection.close()  # this process's connection died with the server too

    def settled() -> bool:
        kit.operate(lambda approval: APPROVE)
        return not Run.objects.filter(pk__in=runs).exclude(
            status__in=[RunStatus.SUCCEEDED, RunStatus.FAILED]).exists()

    wait_until(settled, "every run to end", timeout=120)
    assert all(w.poll() is None for w in workers)  # every worker survived the restart
    assert set(Run.objects.filter(pk__in=runs).values_list("status", flat=True)) == {
        RunStatus.SUCCEEDED}
    report = kit.check(runs)
    assert report.runs == 30 and report.violations == []
    logs = "".join(w.log.read_text() for w in workers)
    assert "database fault" in logs  # they did meet the restart
    for proc in workers:
        site.cluster.kill(proc)


def test_a_long_partition_ends_in_database_errors_not_a_hang_and_the_worker_serves_again(site):
    """Worker A's host is cut off for longer than the network timeout (3 s here, 15 s by
    default; runtime/dbnet.py). Its statements and its idle connection fail within that bound
    instead of waiting in TCP's retransmissions for many minutes; A survives, and once the
    link is back it reconnects and serves a new run."""
    site.env["RUNTIME_PG_NETWORK_TIMEOUT"] = "3"
    kit = ProcessKit(site.url, site.workdir, agents=AGENTS, manage=ROOT / "manage.py",
                     lease_seconds=LEASE, env=site.env)
    host = site.cluster.hosts[0]
    a = site.worker(host, "a")
    wait_until(lambda: WorkerRow.objects.filter(name="a").exists(), "worker A registered")
    site.cluster.partition(host)
    try:
        # the claim loop's statement gives up (without the bounds it waits for many minutes)
        wait_until(lambda: "database fault while claiming" in a.log.read_text(),
                 "A's claim to fail while its host is cut off", timeout=30)
    finally:
        site.cluster.heal(host)
    assert a.poll() is None
    run_id = kit.start("read")
    wait_until(lambda: Run.objects.get(pk=run_id).status == RunStatus.SUCCEEDED,
             "A to serve a new run after the link healed", timeout=60)
    assert Event.objects.filter(run_id=run_id, kind="run.succeeded",
                                actor=_owner("a")).exists()
    site.cluster.kill(a)


LOCKER = """
import os, time
from django.db import connection, transaction
with transaction.atomic():
    with connection.cursor() as cursor:
        cursor.execute('SELECT id FROM runtime_run WHERE id = %s FOR UPDATE',
                       [int(os.environ['LOCK_RUN'])])
    print('locked', flush=True)
    time.sleep(3600)
"""


def test_a_transaction_orphaned_by_a_partition_releases_its_locks(site):
    """A process on host 1 locks a run's row in a transaction (as a claim does between its two
    statements) and its host is cut off: the server ends the orphaned transaction after the
    network timeout (``idle_in_transaction_session_timeout``), so worker B on host 2 can take
    the run over; left to the server's own keepalive, the lock would stand for hours."""
    site.env["RUNTIME_PG_NETWORK_TIMEOUT"] = "3"
    kit = ProcessKit(site.url, site.workdir, agents=AGENTS, manage=ROOT / "manage.py",
                     lease_seconds=LEASE, env=site.env)
    run_id = kit.start("read")
    host = site.cluster.hosts[0]
    locker = site.cluster.popen(
        host, [sys.executable, str(ROOT / "manage.py"), "shell", "-c", LOCKER],
        env={**site.env, "LOCK_RUN": str(run_id)}, log=site.workdir / "locker.log", cwd=ROOT)
    wait_until(lambda: "locked" in (site.workdir / "locker.log").read_text(), "the row locked")
    site.cluster.partition(host)
    b = site.worker(site.cluster.hosts[1], "b")
    wait_until(lambda: Run.objects.get(pk=run_id).status == RunStatus.SUCCEEDED,
             "B to run it once the server ended the orphaned transaction", timeout=60)
    assert locker.poll() is None  # the locker never gave the lock up itself
    site.cluster.heal(host)
    for proc in (locker, b):
        site.cluster.kill(proc)


def test_a_slow_link_delays_each_way_keeps_order_and_can_change_while_it_runs():
    """DelayProxy against an echo server on this machine: a reply takes at least the two
    delays, bytes arrive in the order sent whatever the jitter, and ``slow()`` / ``fast()``
    change the delay for what is sent after them."""
    import asyncio
    import socket
    import threading

    from runtime.testkit.hosts import DelayProxy

    loop = asyncio.new_event_loop()

    async def echo(reader, writer):
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        writer.close()

    server = loop.run_until_complete(asyncio.start_server(echo, "127.0.0.1", 0))
    port = server.sockets[0].getsockname()[1]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    proxy = DelayProxy(("127.0.0.1", port + 1 if port < 65535 else port - 1),
                       ("127.0.0.1", port), delay=0.2, jitter=0.1, seed=7)
    proxy.start()
    try:
        with socket.create_connection(proxy.listen, timeout=10) as conn:
            sent = b"".join(bytes([i]) * 100 for i in range(40))
            began = time.monotonic()
            for i in range(40):  # forty writes, each with its own jitter
                conn.sendall(sent[i * 100:(i + 1) * 100])
            got = b""
            while len(got) < len(sent):
                got += conn.recv(65536)
            assert time.monotonic() - began >= 0.4  # two delays at least
            assert got == sent
            proxy.slow(1.0)
            began = time.monotonic()
            conn.sendall(b"x")
            assert conn.recv(10) == b"x"
            assert time.monotonic() - began >= 2.0  # a second each way
            assert list(proxy.held)[-2:] == pytest.approx([1.0, 1.0], abs=1e-6)
            proxy.fast()  # recovered: the next chunks are held no time at all, either way
            conn.sendall(b"x")
            assert conn.recv(10) == b"x"
            assert list(proxy.held)[-2:] == [0.0, 0.0]
    finally:
        proxy.stop()
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        server.close()
