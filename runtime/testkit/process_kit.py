"""The process kit: crash a real worker process with SIGKILL at a named point, then resume the
run in a fresh process on a fresh open of the database (a SQLite file, or a PostgreSQL database
by its URL).

Nothing of the dead process survives a SIGKILL: no ``finally`` blocks, no lease release, no
buffered writes. What the next process finds is exactly what a deploy, an OOM kill or a power
cut would leave (minus the page cache, which synchronous=FULL already makes irrelevant).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.conf import settings
from django.utils.module_loading import import_string

from runtime.agents.agent import registry
from runtime.clock import SYSTEM_CLOCK
from runtime.errors import CrashNotReached, RunLeased
from runtime.leasing.claims import run_acquire
from runtime.loop.control import start
from runtime.models import Run, RunStatus
from runtime.testkit.base import Kit
from runtime.testkit.databases import Database, database_url, describe, same_database
from runtime.testkit.ledger import Ledger
from runtime.testkit.reached import Crash, Reached


@dataclass
class Exited:
    """How a kit process ended: its exit status and what it printed."""

    args: list[str]
    returncode: int
    output: str

    @property
    def killed(self) -> bool:
        return self.returncode == -signal.SIGKILL


class ProcessKit(Kit):
    """Crash, resume and decide, each step in its own process, against one database.

    ``db`` is a SQLite file (a ``Path`` or path string), a database URL, or anything with a
    ``url`` attribute; it must be the database this process's default connection uses, since
    the kit starts runs, reads and decides here.

    ``agents`` is the dotted path of the agent list the processes load (``RUNTIME_AGENTS``);
    their tools should record calls in a ``Ledger`` at ``ledger_path``. ``manage`` is the
    project's ``manage.py``. Leases are short so a test can wait one out instead of sleeping.
    """

    def __init__(self, db: Database, workdir: Path | str, *, agents: str,
                 ledger_path: Path | str | None = None, manage: Path | str = "manage.py",
                 lease_seconds: float = 1.0, env: dict[str, str] | None = None,
                 timeout: float = 60.0) -> None:
        self.db, self.url, self.workdir = db, database_url(db), Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.agents, self.lease_seconds, self.timeout = agents, lease_seconds, timeout
        self.manage = Path(manage).resolve()
        self.ledger = Ledger(ledger_path or self.workdir / "ledger.jsonl")
        self.reached = Reached()
        self.env = {**os.environ, "DATABASE_URL": self.url,
                    "RUNTIME_AGENTS": agents, "PYTHONUNBUFFERED": "1", **(env or {})}
        for key in ("RUNTIME_CRASH_POINTS", "RUNTIME_CRASH_REACHED_FILE"):
            self.env.pop(key, None)
        self._n = 0
        self.refusals = 0
        default = settings.DATABASES["default"]
        if not same_database(self.url, default):
            raise ValueError(f"this process's default database is {describe(default)}, "
                             f"not {self.url}")

    # -- processes ----------------------------------------------------------------------------

    def _spawn(self, args: Sequence[str], crashes: Sequence[Crash] = ()) -> subprocess.Popen:
        self._n += 1
        env = dict(self.env)
        if crashes:
            env["RUNTIME_CRASH_POINTS"] = json.dumps([c.as_json() for c in crashes])
            env["RUNTIME_CRASH_REACHED_FILE"] = str(self.workdir / f"reached-{self._n}.jsonl")
        log = open(self.workdir / f"proc-{self._n}.log", "w")  # noqa: SIM115 - closed in _wait
        proc = subprocess.Popen([sys.executable, str(self.manage), *args],
                                cwd=self.manage.parent, env=env, stdout=log,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        proc.kit_log = log  # type: ignore[attr-defined]
        proc.kit_n = self._n  # type: ignore[attr-defined]
        return proc

    def _wait(self, proc: subprocess.Popen, args: Sequence[str]) -> Exited:
        try:
            code = proc.wait(self.timeout)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)
            raise AssertionError(f"kit process {list(args)} ran past {self.timeout}s; "
                                 f"killed") from None
        finally:
            proc.kit_log.close()  # type: ignore[attr-defined]
        out = (self.workdir / f"proc-{proc.kit_n}.log").read_text()  # type: ignore[attr-defined]
        reached = self.workdir / f"reached-{proc.kit_n}.jsonl"  # type: ignore[attr-defined]
        self.reached.load(reached)
        return Exited(list(args), code, out)

    def run(self, *args: str, crashes: Sequence[Crash] = ()) -> Exited:
        """Run ``manage.py ARGS`` in a fresh process (armed with ``crashes``) to its end."""
        return self._wait(self._spawn(args, crashes), args)

    # -- the kit's verbs ------------------------------------------------------------------------

    def start(self, agent: str, input: Any = None, created_by: str = "kit") -> int:
        """Queue a run (in this process, with the kit's agents registered) and return its id."""

        loaded = import_string(self.agents)
        with registry.override(*(loaded if isinstance(loaded, list | tuple) else [loaded])):
            return start(agent, input, created_by).pk

    def agents_registered(self) -> Any:
        loaded = import_string(self.agents)
        return registry.override(*(loaded if isinstance(loaded, list | tuple) else [loaded]))

    def crash(self, run_id: int, *crashes: Crash) -> Exited:
        """Execute ``run_id`` in a fresh process armed with ``crashes``; it must die by SIGKILL
        at one of them. Raises ``CrashNotReached`` if the process ended any other way."""
        return self.crash_many([(run_id, crashes)])[0]

    def crash_many(self, plan: Iterable[tuple[int, Sequence[Crash]]], parallel: int = 2,
                   refuse: bool = False) -> list[Exited]:
        """``crash`` for several runs, ``parallel`` processes at a time (one run each). With
        ``refuse``, right after each kill a takeover is tried and must be refused while the
        dead owner's lease is live (``self.refusals`` counts the proofs)."""
        todo, results = list(plan), []
        running: list[tuple[subprocess.Popen, list[str], int, Sequence[Crash]]] = []
        try:
            while todo or running:
                while todo and len(running) < parallel:
                    run_id, crashes = todo.pop(0)
                    for c in crashes:
                        self.reached.expect(run_id, c)
                    args = ["runagent", "--resume", str(run_id), "--name", "kit-crash",
                            "--lease-seconds", str(self.lease_seconds)]
                    running.append((self._spawn(args, crashes), args, run_id, crashes))
                # whichever died first is checked first, while its lease is still young
                done = self._first_exited([p for p, *_ in running])
                index = next(i for i, entry in enumerate(running) if entry[0] is done)
                proc, args, run_id, crashes = running.pop(index)
                exited = self._wait(proc, args)
                if not exited.killed:
                    first = crashes[0]
                    raise CrashNotReached(str(first.point), run_id, first.step_index,
                                          f"the process exited with status "
                                          f"{exited.returncode}:\n{exited.output[-2000:]}")
                if refuse and Run.objects.filter(pk=run_id, status=RunStatus.RUNNING).exists():
                    self.refusals += self.refused(run_id)
                results.append(exited)
        finally:
            for proc, *_ in running:  # an error above leaves no process behind
                if proc.poll() is None:
                    os.kill(proc.pid, signal.SIGKILL)
                    proc.wait(10)
        return results

    def _first_exited(self, procs: list[subprocess.Popen]) -> subprocess.Popen:
        """The first of ``procs`` to end (bounded by the kit's timeout)."""
        deadline = time.monotonic() + self.timeout
        while True:
            for proc in procs:
                if proc.poll() is not None:
                    return proc
            if time.monotonic() > deadline:
                return procs[0]  # _wait kills it and reports the overrun
            time.sleep(0.005)  # polling child processes for their exit

    def crash_worker(self, *crashes: Crash, extra: Sequence[str] = ()) -> Exited:
        """A ``runworker --burst`` armed with ``crashes`` (it claims what is runnable); it must
        die by SIGKILL. Used where the dead owner must be a registered worker process."""
        for c in crashes:
            self.reached.expect(None, c)
        args = ["runworker", "--burst", "--name", "kit-crash", "--lease-seconds",
                str(self.lease_seconds), *extra]
        exited = self.run(*args, crashes=crashes)
        if not exited.killed:
            raise CrashNotReached(str(crashes[0].point), None, crashes[0].step_index,
                                  f"the worker exited with status {exited.returncode}:\n"
                                  f"{exited.output[-2000:]}")
        return exited

    def refused(self, run_id: int) -> bool:
        """True if a takeover now is refused because the dead owner's lease is live; False,
        trying nothing, if the lease has already expired. Never writes: a takeover at ``now``
        before the expiry can only be refused."""
        now = SYSTEM_CLOCK.now()
        expires = Run.objects.filter(pk=run_id).values_list("lease_expires_at", flat=True).get()
        if expires is None or expires <= now:
            return False
        try:
            run_acquire(run_id, "kit-probe", lease_seconds=self.lease_seconds)
        except RunLeased:
            return True
        raise AssertionError(f"run {run_id} was taken over before its lease expired")

    def wait_for_expiry(self, run_ids: Iterable[int] | None = None) -> None:
        """Wait (bounded) until every running run's lease has expired by the database's clock
        as the runtime reads it: this is waiting for a deadline, not sleeping for a guess."""
        qs = Run.objects.filter(status=RunStatus.RUNNING)
        if run_ids is not None:
            qs = qs.filter(pk__in=list(run_ids))
        latest = max((r for r in qs.values_list("lease_expires_at", flat=True) if r),
                     default=None)
        if latest is None:
            return
        limit = time.monotonic() + self.lease_seconds * 3 + 5
        while SYSTEM_CLOCK.now() <= latest:
            if time.monotonic() > limit:
                raise AssertionError(f"leases did not expire by {latest}")
            time.sleep(min(0.05, max(0.0, (latest - SYSTEM_CLOCK.now()).total_seconds())))

    def resume(self, run_id: int) -> Exited:
        """``runagent --resume`` in a fresh process: exit 0 succeeded, 2 failed, 3 waiting,
        1 refused (lease live) or error."""
        return self.run("runagent", "--resume", str(run_id), "--name", "kit-resume",
                        "--lease-seconds", str(self.lease_seconds))

    def drain(self, *, concurrency: int = 4, expiry: bool = True,
              crashes: Sequence[Crash] = ()) -> Exited:
        """One ``runworker --burst`` process that runs everything runnable, then exits.
        With ``expiry`` it first waits out the dead owners' leases (no instant takeover)."""
        if expiry:
            self.wait_for_expiry()
        exited = self.run("runworker", "--burst", "--name", "kit-drain", "--concurrency",
                          str(concurrency), "--lease-seconds", str(max(self.lease_seconds, 5)),
                          crashes=crashes)
        if exited.returncode != 0 and not crashes:
            raise AssertionError(f"the draining worker exited {exited.returncode}:\n"
                                 f"{exited.output[-3000:]}")
        return exited
