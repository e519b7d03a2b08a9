"""Real ``manage.py runworker`` processes: throughput and latency by threads and processes,
approval-to-restart latency with default settings, and a worker's memory over many runs.

Every process is started here, watched by its pid and ended by its pid (SIGKILL on overrun).
"""

from __future__ import annotations

import os
import random
import re
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from django.conf import settings

from runtime.approvals.decisions import approve
from runtime.benchkit.db import subprocess_env
from runtime.benchkit.steps import create_runs
from runtime.models import Approval, ApprovalStatus, Event, Run, Step

LOCKED = "database is locked"
_WRITER = re.compile(r"write lock: (\d+) transactions, held ([\d.]+) s .*waited ([\d.]+) s")


_GROUPS = re.compile(r"group commits: (\d+) carrying (\d+) plans")


def group_use(outputs: list[str]) -> tuple[int, int]:
    """(group commits, plans they carried), summed over the workers' stop lines."""
    found = [m for o in outputs for m in _GROUPS.finditer(o)]
    return sum(int(m[1]) for m in found), sum(int(m[2]) for m in found)


def writer_use(outputs: list[str]) -> tuple[int, float, float]:
    """(write transactions, seconds holding the write lock, seconds waiting for it), summed
    over the workers' own accounts (their stop line)."""
    found = [m for o in outputs for m in _WRITER.finditer(o)]
    return (sum(int(m[1]) for m in found), sum(float(m[2]) for m in found),
            sum(float(m[3]) for m in found))


class WorkerProc:
    """``manage.py runworker`` with its output in a file; reaped with its CPU time."""

    def __init__(self, db: Path, log_dir: Path, args: list[str], tag: str,
                 env: dict[str, str] | None = None) -> None:
        self.log_path = log_dir / f"{tag}.log"
        self._log = open(self.log_path, "w")  # noqa: SIM115 - closed when reaped
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(settings.BASE_DIR) / "manage.py"), "runworker", *args],
            cwd=settings.BASE_DIR, env={**subprocess_env(db), **(env or {})}, stdout=self._log,
            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.pid = self.proc.pid
        self.returncode: int | None = None
        self.cpu_seconds = 0.0
        self.overran = False

    def cpu_seconds_now(self) -> float:
        """CPU time used so far (user + system, from /proc/<pid>/stat); 0.0 once it exited."""
        try:
            fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            return 0.0
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def rss_kib(self) -> int:
        """Resident memory now (``VmRSS`` of /proc/<pid>/status), in KiB."""
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise RuntimeError(f"no VmRSS for pid {self.pid}")

    def exited(self) -> bool:
        """Whether the process has ended, without reaping it (``wait`` reaps it, with its CPU
        time; ``Popen.poll`` would reap it first and lose that)."""
        if self.returncode is not None:
            return True
        found = os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        return found is not None

    def wait(self, timeout: float) -> int:
        """Reap the process (SIGKILL by pid past ``timeout``); keeps its CPU seconds."""
        if self.returncode is not None:
            return self.returncode
        deadline = time.monotonic() + timeout
        while True:
            pid, status, usage = os.wait4(self.pid, os.WNOHANG)
            if pid == self.pid:
                break
            if time.monotonic() > deadline and not self.overran:
                self.overran = True
                os.kill(self.pid, signal.SIGKILL)
            time.sleep(0.02)
        self.returncode = os.waitstatus_to_exitcode(status)
        self.proc.returncode = self.returncode
        self.cpu_seconds = usage.ru_utime + usage.ru_stime
        self._log.close()
        return self.returncode

    def stop(self, timeout: float = 60) -> int:
        """SIGTERM (a clean stop), then reap."""
        if self.returncode is None:
            os.kill(self.pid, signal.SIGTERM)
        return self.wait(timeout)

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")


def _wait_for(predicate: Callable[[], Any], timeout: float, what: str,
              workers: list[WorkerProc]) -> None:
    """Poll ``predicate`` (bounded); a worker exiting early is an error, not a hang."""
    deadline = time.monotonic() + timeout
    while not predicate():
        for w in workers:
            if w.exited():
                raise RuntimeError(f"worker {w.pid} exited while waiting for {what}:\n"
                                   + w.output()[-2000:])
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.02)


def pct(values: list[float], q: float) -> float:
    """The q-quantile (0..1) by nearest rank; 0.0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered) + 0.5) - 1))]


def throughput(db: Path, log_dir: Path, *, processes: int, threads: int, runs: int,
               steps: int = 10, timeout: float = 180, loop: str = "asyncio") -> dict[str, Any]:
    """``processes`` burst workers, ``threads`` runs in flight each (``--loop loop``), drain
    ``runs`` queued runs."""
    ids = create_runs("bench_read", runs, steps)
    lo, hi = min(ids), max(ids)
    tag = f"p{processes}-c{threads}-{loop}"
    workers = [WorkerProc(db, log_dir, ["--burst", "--concurrency", str(threads),
                                        "--loop", loop], f"{tag}-{i}")
               for i in range(processes)]
    # CPU per step counts from the first step on: a process's start-up (imports, Django) is
    # not the cost of a step.
    mine = Step.objects.filter(run_id__gte=lo, run_id__lte=hi)
    _wait_for(lambda: mine.exists() or any(w.exited() for w in workers),
              timeout, "the first step", [])
    since = datetime.now(UTC)
    cpu_before = sum(w.cpu_seconds_now() for w in workers)
    codes = [w.wait(timeout) for w in workers]
    rows = list(mine.filter(tool="bench_read").values_list("started_at", "finished_at"))
    counted = sum(1 for s, _ in rows if s >= since)
    done = Run.objects.filter(pk__gte=lo, pk__lte=hi, status="succeeded").count()
    # A worker killed past the timeout (``overran``) may leave a step unfinished.
    finished = [(s, f) for s, f in rows if f is not None]
    window = ((max(f for _, f in finished) - min(s for s, _ in finished)).total_seconds()
              if finished else 0.0)
    latencies = [(f - s).total_seconds() * 1000 for s, f in finished]
    outputs = [w.output() for w in workers]
    transactions, held, waited = writer_use(outputs)
    return {
        "processes": processes, "threads": threads, "loop": loop, "runs": runs,
        "steps": len(rows),
        "succeeded": done, "exit_codes": codes, "overran": any(w.overran for w in workers),
        "seconds": window, "steps_per_s": len(rows) / window if window else 0.0,
        "p50_ms": pct(latencies, 0.50), "p99_ms": pct(latencies, 0.99),
        "cpu_ms_per_step": 1000 * (sum(w.cpu_seconds for w in workers) - cpu_before)
        / max(1, counted),
        "locked_errors": sum(o.count(LOCKED) for o in outputs),
        "tracebacks": sum(o.count("Traceback") for o in outputs),
        # The share of the window some worker held SQLite's one write lock, and how long a
        # write transaction waited for it on average.
        "writer_busy": held / window if window else 0.0,
        "writer_wait_ms": 1000 * waited / max(transactions, 1),
    }


def approval_latency(db: Path, log_dir: Path, *, count: int, mean_gap: float = 0.04,
                     timeout: float = 180) -> dict[str, Any]:
    """A default ``runworker`` pauses ``count`` runs on a policy approval; they are approved at
    random moments (about ``mean_gap`` apart) and each approval's delay until its step's
    ``step.tool_started`` is measured (event time minus the moment ``approve`` returned)."""
    worker = WorkerProc(db, log_dir, [], "approvals")
    try:
        ids = create_runs("bench_approve", count)
        lo, hi = min(ids), max(ids)
        mine = Approval.objects.filter(run_id__gte=lo, run_id__lte=hi)
        _wait_for(lambda: mine.filter(status=ApprovalStatus.PENDING).count() == count,
                  timeout, f"{count} runs to pause for approval", [worker])
        rng = random.Random(20261203)
        approved: dict[int, datetime] = {}
        for approval_id, run_id in mine.order_by("pk").values_list("pk", "run_id"):
            approve(approval_id, by="bench")
            approved[run_id] = datetime.now(UTC)
            time.sleep(rng.expovariate(1 / mean_gap))  # arrivals spread at random: load shape
        _wait_for(lambda: Run.objects.filter(pk__gte=lo, pk__lte=hi, status="succeeded")
                  .count() == count, timeout, "the approved runs to finish", [worker])
    finally:
        code = worker.stop()
    started = dict(Event.objects.filter(run_id__gte=lo, run_id__lte=hi,
                                        kind="step.tool_started").values_list("run_id", "at"))
    delays = [(started[r] - t).total_seconds() * 1000 for r, t in approved.items()]
    out = worker.output()
    return {
        "approvals": count, "exit_code": code, "p50_ms": pct(delays, 0.50),
        "p95_ms": pct(delays, 0.95), "max_ms": max(delays), "mean_ms": statistics.fmean(delays),
        "locked_errors": out.count(LOCKED), "tracebacks": out.count("Traceback"),
    }


def worker_rss(db: Path, log_dir: Path, *, first: int, total: int,
               timeout: float = 300) -> dict[str, Any]:
    """One default worker's resident memory after ``first`` runs and after ``total`` (runs
    that end at once: claim, one step, the final answer), all queued before it starts so
    nothing but the worker writes while it works."""
    ids = create_runs("bench_final", total)
    lo = min(ids)
    worker = WorkerProc(db, log_dir, [], "rss")
    rss: dict[int, int] = {}
    start = time.monotonic()
    try:
        while len(rss) < 2:
            done = Run.objects.filter(pk__gte=lo, status="succeeded").count()
            if done >= first and first not in rss:
                rss[first] = worker.rss_kib()
            if done >= total:
                rss[total] = worker.rss_kib()
                break
            if worker.exited() or time.monotonic() - start > timeout:
                raise RuntimeError(f"the memory run stopped at {done} runs:\n"
                                   + worker.output()[-2000:])
            time.sleep(0.1)  # the bench's own polling pace
        elapsed = time.monotonic() - start
    finally:
        code = worker.stop()
    out = worker.output()
    return {
        "first_runs": first, "total_runs": total, "rss_first_kib": rss[first],
        "rss_total_kib": rss[total], "growth_kib": rss[total] - rss[first],
        "seconds": elapsed, "exit_code": code, "locked_errors": out.count(LOCKED),
        "tracebacks": out.count("Traceback"),
    }
