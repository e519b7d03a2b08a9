"""Separate hosts on one machine, for proving leases across a network: network namespaces on a
bridge, a PostgreSQL server of the test's own listening on that bridge, and named faults.

``Cluster`` makes a bridge (``10.77.N.1/24``, the database host's address, in the machine's own
namespace) and ``hosts`` network namespaces, each joined to it by a veth pair (host i is
``10.77.N.(10+i)``). ``PgServer`` initialises and starts a PostgreSQL server in a directory of
its own, listening on the bridge only (the machine's own server is left alone). Processes run
inside a host with ``Cluster.popen(host, args)``; their pid is theirs (``ip netns exec``
executes the command in place), so a test ends them by it.

Faults, each a named helper: ``partition(host)`` / ``heal(host)`` (the host's link down and up:
its packets to the database are dropped, TCP connections stall, nothing is reset), ``pause`` /
``resume`` (SIGSTOP / SIGCONT a process), ``pause_host`` / ``resume_host`` (every process on a
host), ``kill`` (SIGKILL), ``PgServer.restart()``, and a slow link (``DelayProxy``).

Needs root (network namespaces, and running the server as the ``postgres`` user) and the
PostgreSQL server binaries (``initdb``, ``pg_ctl``; found under ``/usr/lib/postgresql/*/bin`` or
``RUNTIME_PG_BINDIR``).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import glob
import os
import pwd
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

SUBNET_BASE = "10.77"


def _run(*args: str) -> None:
    subprocess.run(list(args), check=True, capture_output=True, text=True, timeout=60)


def pg_bindir() -> Path:
    """The directory of PostgreSQL's server binaries (the newest installed)."""
    if os.environ.get("RUNTIME_PG_BINDIR"):
        return Path(os.environ["RUNTIME_PG_BINDIR"])
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"),
                   key=lambda p: int(p.split("/")[4]) if p.split("/")[4].isdigit() else 0)
    if not found:
        raise RuntimeError("no PostgreSQL server binaries (initdb) found; set RUNTIME_PG_BINDIR")
    return Path(found[-1]).parent


class PgServer:
    """A PostgreSQL server of the test's own: its data in a fresh directory, listening on
    ``host``:``port`` and a Unix socket in that directory; trust authentication for the
    bridge's subnet (a test server on a private bridge)."""

    def __init__(self, host: str, port: int, subnet: str) -> None:
        self.host, self.port, self.subnet = host, port, subnet
        self.root = Path(tempfile.mkdtemp(prefix="rt-pg-"))
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self._user = "postgres" if os.geteuid() == 0 else None
        self.bindir = pg_bindir()

    def _as_server(self, *args: str) -> None:
        cmd = [str(self.bindir / args[0]), *args[1:]]
        if self._user is not None:
            cmd = ["runuser", "-u", self._user, "--", *cmd]
        subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=120)

    def start(self) -> None:
        if self._user is not None:
            entry = pwd.getpwnam(self._user)
            os.chown(self.root, entry.pw_uid, entry.pw_gid)
        os.chmod(self.root, 0o700)
        if not self.data.exists():
            self._as_server("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres",
                            "--no-sync")
            with open(self.data / "postgresql.conf", "a") as conf:
                conf.write(f"\nlisten_addresses = '{self.host}'\nport = {self.port}\n"
                           f"unix_socket_directories = '{self.root}'\nmax_connections = 200\n"
                           "fsync = on\nsynchronous_commit = on\n")
            with open(self.data / "pg_hba.conf", "w") as hba:
                hba.write("local all all trust\n"
                          f"host all all {self.subnet} trust\n"
                          "host all all 127.0.0.1/32 trust\n")
        self._as_server("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60",
                        "start")

    def stop(self, mode: str = "fast") -> None:
        self._as_server("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop")

    def restart(self) -> None:
        """Stop (fast: every connection is cut) and start again, as a deploy or a failover
        would."""
        self.stop()
        self.start()

    def url(self, name: str) -> str:
        return f"postgres://postgres@{self.host}:{self.port}/{name}"

    def remove(self) -> None:
        with contextlib.suppress(subprocess.CalledProcessError):  # not running
            self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)


class Cluster:
    """A bridge and ``hosts`` network namespaces joined to it, each a host of its own."""

    def __init__(self, hosts: int, *, net: int | None = None) -> None:
        self.net = net if net is not None else 100 + os.getpid() % 100
        self.tag = f"rt{self.net}"
        self.bridge = f"{self.tag}br"
        self.address = f"{SUBNET_BASE}.{self.net}.1"
        self.subnet = f"{SUBNET_BASE}.{self.net}.0/24"
        self.hosts = [f"{self.tag}h{i}" for i in range(1, hosts + 1)]
        self._procs: list[subprocess.Popen] = []

    def host_address(self, host: str) -> str:
        return f"{SUBNET_BASE}.{self.net}.{10 + self.hosts.index(host) + 1}"

    def _veth(self, host: str) -> str:
        return f"{host}v"

    def up(self) -> None:
        self.down()  # what an earlier run that died left behind
        _run("ip", "link", "add", self.bridge, "type", "bridge")
        _run("ip", "addr", "add", f"{self.address}/24", "dev", self.bridge)
        _run("ip", "link", "set", self.bridge, "up")
        for host in self.hosts:
            _run("ip", "netns", "add", host)
            _run("ip", "link", "add", self._veth(host), "type", "veth", "peer", "name", "eth0",
                 "netns", host)
            _run("ip", "link", "set", self._veth(host), "master", self.bridge)
            _run("ip", "link", "set", self._veth(host), "up")
            _run("ip", "-n", host, "addr", "add", f"{self.host_address(host)}/24", "dev", "eth0")
            _run("ip", "-n", host, "link", "set", "eth0", "up")
            _run("ip", "-n", host, "link", "set", "lo", "up")

    def down(self) -> None:
        for proc in self._procs:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(10)
        for host in self.hosts:
            subprocess.run(["ip", "netns", "del", host], capture_output=True, timeout=30)
            subprocess.run(["ip", "link", "del", self._veth(host)], capture_output=True,
                           timeout=30)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True, timeout=30)

    # -- processes --------------------------------------------------------------------------

    def popen(self, host: str, args: Sequence[str], *, env: dict[str, str], log: Path,
              cwd: Path | str | None = None,
              preexec_fn: Callable[[], None] | None = None) -> subprocess.Popen:
        """Start ``args`` inside ``host`` (its pid is the command's own)."""
        out = open(log, "w")  # noqa: SIM115 - the child holds it; closed with the process
        proc = subprocess.Popen(["ip", "netns", "exec", host, *args], env=env, cwd=cwd,
                                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                preexec_fn=preexec_fn)
        out.close()
        self._procs.append(proc)
        return proc

    # -- faults -----------------------------------------------------------------------------

    def partition(self, host: str) -> None:
        """Cut ``host`` off the bridge: its packets are dropped, its connections stall."""
        _run("ip", "link", "set", self._veth(host), "down")

    def heal(self, host: str) -> None:
        _run("ip", "link", "set", self._veth(host), "up")

    @staticmethod
    def pause(proc: subprocess.Popen) -> None:
        os.kill(proc.pid, signal.SIGSTOP)

    @staticmethod
    def resume(proc: subprocess.Popen) -> None:
        os.kill(proc.pid, signal.SIGCONT)

    def host_pids(self, host: str) -> list[int]:
        """The pids of every process inside ``host``."""
        done = subprocess.run(["ip", "netns", "pids", host], capture_output=True, text=True,
                              timeout=30, check=True)
        return [int(pid) for pid in done.stdout.split()]

    def pause_host(self, host: str) -> list[int]:
        """Stop every process on ``host`` at once, as a hypervisor pausing the VM would; the
        pids stopped (``resume_host`` continues them)."""
        pids = self.host_pids(host)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
        return pids

    def resume_host(self, host: str) -> None:
        for pid in self.host_pids(host):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)

    @staticmethod
    def kill(proc: subprocess.Popen) -> None:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)

    def reachable(self, host: str, port: int, timeout: float = 10.0) -> bool:
        """Whether ``host`` opens a TCP connection to the database host's ``port`` within
        ``timeout`` seconds (tried once a second)."""
        probe = ("import socket, sys\n"
                 "try:\n    socket.create_connection((sys.argv[1], int(sys.argv[2])), 1).close()\n"
                 "except OSError:\n    sys.exit(1)\n")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            done = subprocess.run(["ip", "netns", "exec", host, sys.executable, "-c", probe,
                                   self.address, str(port)], capture_output=True, timeout=30)
            if done.returncode == 0:
                return True
        return False


class DelayProxy:
    """A slow link: a TCP relay on ``listen`` to ``target`` that holds every chunk ``delay``
    seconds plus up to ``jitter`` more (each way, order kept) before passing it on. A worker
    given the relay's address sees the database ``2 x delay`` further away (``tc netem`` needs
    a kernel module that machines do not always have; this needs nothing). ``delay`` and
    ``jitter`` may be changed while it runs (``slow`` / ``fast``), for a link that degrades and
    recovers."""

    def __init__(self, listen: tuple[str, int], target: tuple[str, int], delay: float = 0.0,
                 jitter: float = 0.0, seed: int = 0) -> None:
        self.listen, self.target, self.delay, self.jitter = listen, target, delay, jitter
        # How long each chunk was held before it went on (its delay and jitter, and any wait
        # behind the chunk ahead of it), newest last: what a test checks instead of a clock.
        self.held: collections.deque[float] = collections.deque(maxlen=1000)
        self._rng = random.Random(seed)
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="delay-proxy")

    def start(self) -> None:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the delay proxy did not start")

    def slow(self, delay: float, jitter: float = 0.0) -> None:
        self.delay, self.jitter = delay, jitter

    def fast(self) -> None:
        self.slow(0.0)

    def url(self, database_url: str) -> str:
        """``database_url`` (a URL of ``target``) redirected through this relay."""
        host, port = self.target
        return database_url.replace(f"@{host}:{port}/", f"@{self.listen[0]}:{self.listen[1]}/")

    def stop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(
            asyncio.start_server(self._relay, self.listen[0], self.listen[1]))
        self._ready.set()
        try:
            self._loop.run_forever()
        finally:
            server.close()
            pending = asyncio.all_tasks(self._loop)
            for task in pending:
                task.cancel()
            self._loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            self._loop.close()

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def deliver() -> None:
            while True:
                due, chunk = await queue.get()
                wait = due - self._loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                if not chunk:
                    break
                writer.write(chunk)
                await writer.drain()
            writer.close()

        sender = asyncio.ensure_future(deliver())
        last = 0.0

        def due() -> float:  # never before the chunk ahead of it: a link keeps order
            nonlocal last
            extra = self._rng.uniform(0, self.jitter) if self.jitter else 0.0
            now = self._loop.time()
            last = max(last, now + self.delay + extra)
            self.held.append(last - now)
            return last

        try:
            while chunk := await reader.read(65536):
                queue.put_nowait((due(), chunk))
        except OSError:
            pass
        queue.put_nowait((due(), b""))
        with contextlib.suppress(OSError):
            await sender
