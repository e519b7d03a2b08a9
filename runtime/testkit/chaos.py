"""The chaos soak: real workers SIGKILLed at random moments (and some armed to kill themselves at
random crash points), restarted by a supervisor, while a random operator decides every approval.
When every run has ended (or time is up) it settles, checks every invariant, and reports.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.db import connection

from runtime.agents.agent import registry
from runtime.approvals.rules import approval_resolvable
from runtime.crashpoints import OFF_STEP_POINTS, CrashPoint
from runtime.errors import AgentRuntimeError
from runtime.host.pids import die_with_parent
from runtime.loop.control import start
from runtime.models import TERMINAL_RUN_STATUSES, Approval, ApprovalStatus, Event, Run
from runtime.storage.faults import DATABASE_FAULTS
from runtime.testkit.agents import AGENTS as KIT_AGENTS
from runtime.testkit.databases import Database, database_url
from runtime.testkit.invariants import Report, check_invariants
from runtime.testkit.ledger import Ledger
from runtime.testkit.operator import APPROVE, REJECT, Decision, decide, resolve_with

AGENTS = "runtime.testkit.agents.AGENTS"
KINDS = ["read", "charge", "send", "reconcile-check", "reconcile-wait", "reconcile-conflict",
         "charge-approved"]
# every point of a run's steps, in the enum's order
ARMABLE = [str(point) for point in CrashPoint if point not in OFF_STEP_POINTS]


@dataclass
class ChaosConfig:
    workers: int = 3
    runs: int = 200
    seconds: float = 60.0
    seed: int = 0
    concurrency: int = 2
    lease_seconds: float = 2.0
    kill_interval: tuple[float, float] = (0.2, 1.2)
    arm_probability: float = 0.5  # chance a (re)started worker is armed to kill itself
    tool_seconds: float = 0.1  # the outside world's latency, so kills land mid-call


@dataclass
class ChaosReport:
    runs: Counter[str] = field(default_factory=Counter)
    steps: int = 0
    events: int = 0
    kills: int = 0
    self_kills: int = 0
    restarts: int = 0
    takeovers: Counter[str] = field(default_factory=Counter)
    approvals: Counter[tuple[str, str]] = field(default_factory=Counter)
    side_effects: int = 0
    duplicates: int = 0
    violations: list[str] = field(default_factory=list)
    locked: int = 0
    seconds: float = 0.0
    faults: Counter[str] = field(default_factory=Counter)  # network, pause, clock, server

    @property
    def ok(self) -> bool:
        return not self.violations and self.duplicates == 0

    def table(self) -> str:
        rows = [("runs", f"{sum(self.runs.values())} ("
                 + ", ".join(f"{k} {v}" for k, v in sorted(self.runs.items())) + ")"),
                ("steps", str(self.steps)), ("events", str(self.events)),
                ("workers SIGKILLed at random moments", str(self.kills)),
                ("workers that SIGKILLed themselves at an armed crash point", str(self.self_kills)),
                ("worker restarts", str(self.restarts)),
                ("takeovers", ", ".join(f"{k} {v}" for k, v in sorted(self.takeovers.items()))
                 or "0")]
        if self.faults:
            rows.append(("faults injected", ", ".join(f"{k} {v}" for k, v in
                                                      sorted(self.faults.items()))))
        for (kind, decision), n in sorted(self.approvals.items()):
            rows.append((f"approvals {kind} / {decision}", str(n)))
        rows += [("side-effect executions counted outside", str(self.side_effects)),
                 ("duplicates without approval", str(self.duplicates)),
                 ('"database is locked" in worker logs', str(self.locked)),
                 ("invariant violations", str(len(self.violations))),
                 ("seconds", f"{self.seconds:.1f}")]
        width = max(len(k) for k, _ in rows)
        return "\n".join(f"{k.ljust(width)}  {v}" for k, v in rows)


class Chaos:
    """Run one soak against the database Django's default connection points at (``db``: a
    fresh SQLite file, or a fresh PostgreSQL database by its URL), with worker processes
    started from ``manage``."""

    def __init__(self, config: ChaosConfig, *, db: Database, workdir: Path,
                 manage: Path) -> None:
        self.cfg, self.db, self.workdir, self.manage = config, db, workdir, manage
        self.url = database_url(db)
        self.rng = random.Random(config.seed)
        self.ledger = Ledger(workdir / "ledger.jsonl")
        self.report = ChaosReport()
        self.procs: dict[int, subprocess.Popen] = {}
        self.armed: dict[int, bool] = {}
        self._n = 0

    def run(self, out: Any = None) -> ChaosReport:
        started = time.monotonic()
        self._create_runs()
        for slot in range(self.cfg.workers):
            self._start(slot)
        deadline = started + self.cfg.seconds
        next_kill = started + self.rng.uniform(*self.cfg.kill_interval)
        try:
            while time.monotonic() < deadline:
                self._supervise()
                if time.monotonic() >= next_kill:
                    self._fault()
                    next_kill = time.monotonic() + self.rng.uniform(*self.cfg.kill_interval)
                try:
                    self._operate()
                    if self._all_ended():
                        break
                except DATABASE_FAULTS:  # the database restarting under the soak: go on
                    connection.close()
                time.sleep(0.05)  # the soak's own pace, not a synchronisation
        finally:
            self._calm()
            self._stop_all()
        self._settle()
        self._tally(time.monotonic() - started)
        if out is not None:
            out.write(self.report.table() + "\n")
        return self.report

    # -- the moving parts -----------------------------------------------------------------------

    def _create_runs(self) -> None:

        with registry.override(*KIT_AGENTS):
            for i in range(self.cfg.runs):
                start(self.rng.choice(KINDS), {"chaos": i}, created_by="chaos")

    def _env(self, arm: bool) -> dict[str, str]:
        env = {**os.environ, "DATABASE_URL": self.url, "RUNTIME_AGENTS": AGENTS,
               "RUNTIME_TEST_DIR": str(self.workdir), "PYTHONUNBUFFERED": "1",
               "RUNTIME_KIT_TOOL_SECONDS": str(self.cfg.tool_seconds)}
        env.pop("RUNTIME_CRASH_POINTS", None)
        if arm:
            spec = [{"point": self.rng.choice(ARMABLE), "occurrence": self.rng.randint(1, 6)}]
            env["RUNTIME_CRASH_POINTS"] = json.dumps(spec)
            env["RUNTIME_CRASH_REACHED_FILE"] = str(self.workdir / f"reached-{self._n}.jsonl")
        return env

    def _start(self, slot: int, extra: tuple[str, ...] = ()) -> subprocess.Popen:
        self._n += 1
        arm = not extra and self.rng.random() < self.cfg.arm_probability
        proc = self._spawn(slot, ["runworker", "--name", f"chaos{slot}",
                                  "--concurrency", str(self.cfg.concurrency), "--lease-seconds",
                                  str(self.cfg.lease_seconds), "--poll-interval", "0.1",
                                  *extra], self._env(arm),
                           self.workdir / f"worker-{self._n}.log")
        self.procs[slot], self.armed[slot] = proc, arm
        return proc

    def _spawn(self, slot: int, args: list[str], env: dict[str, str],
               log_path: Path) -> subprocess.Popen:
        """Start ``manage.py ARGS`` for worker ``slot`` (here, on this host)."""
        log = open(log_path, "w")  # noqa: SIM115 - the child owns it
        proc = subprocess.Popen(
            [sys.executable, str(self.manage), *args], cwd=self.manage.parent, env=env,
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            preexec_fn=die_with_parent)
        log.close()
        return proc

    def _fault(self) -> None:
        """One fault at a random moment: here, a worker SIGKILLed."""
        self._kill_one()

    def _calm(self) -> None:
        """Undo what is still in force before the workers are stopped (nothing here)."""

    def _supervise(self) -> None:
        for slot, proc in list(self.procs.items()):
            if proc.poll() is not None:
                if proc.returncode == -signal.SIGKILL and self.armed[slot]:
                    self.report.self_kills += 1
                self.report.restarts += 1
                self._start(slot)

    def _kill_one(self) -> None:
        live = [(s, p) for s, p in self.procs.items() if p.poll() is None]
        if not live:
            return
        slot, proc = self.rng.choice(live)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        self.armed[slot] = False  # killed from outside, not by its armed point
        self.report.kills += 1

    def _choose(self, approval: Approval) -> Decision:
        roll = self.rng.random()
        if not approval_resolvable(approval):  # a policy question: allowed or denied
            return APPROVE if roll < 0.7 else REJECT
        if roll < 0.5:
            return APPROVE
        return REJECT if roll < 0.75 else resolve_with({"resolved_by": "chaos operator"})

    def _operate(self) -> None:
        for approval in Approval.objects.filter(status=ApprovalStatus.PENDING).order_by("pk"):
            decision = self._choose(approval)
            try:
                decide(approval.pk, decision, "chaos-operator")
            except AgentRuntimeError:
                continue  # raced with a worker re-asking it: the next pass sees the new one
            self.report.approvals[(approval.kind, decision.action)] += 1

    def _all_ended(self) -> bool:
        return not Run.objects.exclude(status__in=TERMINAL_RUN_STATUSES).exists()

    def _stop_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(10)

    def _settle(self) -> None:
        """No more chaos: unarmed workers take over the dead, the operator decides, until every
        run has ended (bounded)."""
        for _ in range(30):
            if self._all_ended():
                return
            proc = self._start(0, extra=("--burst",))
            try:
                proc.wait(120)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(10)
            self._operate()

    def _tally(self, seconds: float) -> None:
        r = self.report
        r.seconds = seconds
        r.runs = Counter(Run.objects.values_list("status", flat=True))
        taken = Event.objects.filter(kind="lease.taken_over").values_list("payload", flat=True)
        r.takeovers = Counter(p.get("reason", "?") for p in taken)
        checked: Report = check_invariants(executions=self.ledger.executions(),
                                           raise_on_violation=False)
        r.steps, r.events, r.side_effects = checked.steps, checked.events, \
            checked.side_effect_executions
        r.violations = [str(v) for v in checked.violations]
        r.duplicates = sum(v.invariant == 1 for v in checked.violations)
        r.locked = sum(p.read_text().count("database is locked")
                       for p in self.workdir.glob("worker-*.log"))
