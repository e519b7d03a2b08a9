"""The partition soak: the chaos soak with each worker on a host of its own (network namespaces)
against a PostgreSQL server of its own, and faults between machines: a host cut off the
database and healed, a worker paused past its lease and resumed, a worker restarted with its
clock two hours off, a worker SIGKILLed, the database server restarted. A random operator
decides every approval; the outside world's ledger counts side effects; every invariant of
design §11 is checked at the end (``runtime.testkit.chaos`` does the rest).
"""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from ..procs import die_with_parent
from .chaos import Chaos, ChaosConfig
from .hosts import Cluster, PgServer

FAULTS = ("partition", "pause", "skew", "kill", "db-restart")


@dataclass
class PartitionConfig(ChaosConfig):
    faults: tuple[str, ...] = FAULTS
    skew_seconds: float = 7200.0
    arm_probability: float = 0.0  # faults come from outside here, not armed crash points


class PartitionSoak(Chaos):
    """One soak on ``cluster`` (a host per worker) against ``server``."""

    def __init__(self, config: PartitionConfig, *, cluster: Cluster, server: PgServer,
                 url: str, workdir: Path, manage: Path) -> None:
        super().__init__(config, db=url, workdir=workdir, manage=manage)
        self.cfg: PartitionConfig = config
        self.cluster, self.server = cluster, server
        self.skews: dict[int, float] = {}
        self.cut: dict[str, float] = {}  # host -> when to heal it
        self.paused: dict[int, tuple[subprocess.Popen, float]] = {}  # slot -> (proc, resume)

    def _host(self, slot: int) -> str:
        return self.cluster.hosts[slot % len(self.cluster.hosts)]

    def _spawn(self, slot: int, args: list[str], env: dict[str, str],
               log_path: Path) -> subprocess.Popen:
        skew = self.skews.get(slot, 0.0)
        command = ([sys.executable, str(Path(__file__).with_name("skew.py")), str(skew)]
                   if skew else [sys.executable, str(self.manage)])
        return self.cluster.popen(self._host(slot), [*command, *args], env=env, log=log_path,
                                  cwd=self.manage.parent, preexec_fn=die_with_parent)

    def _supervise(self) -> None:
        now = time.monotonic()
        for host, heal_at in list(self.cut.items()):
            if now >= heal_at:
                self.cluster.heal(host)
                del self.cut[host]
        for slot, (proc, resume_at) in list(self.paused.items()):
            if now >= resume_at:
                if proc.poll() is None:
                    self.cluster.resume(proc)
                del self.paused[slot]
        super()._supervise()

    def _lapse(self) -> float:
        """How long a fault lasts: from under a lease to three of them."""
        return self.rng.uniform(0.5, 3.0) * self.cfg.lease_seconds

    def _fault(self) -> None:
        kind = self.rng.choice(self.cfg.faults)
        live = [(s, p) for s, p in self.procs.items()
                if p.poll() is None and s not in self.paused]
        if kind == "partition":
            free = [h for h in self.cluster.hosts if h not in self.cut]
            if not free:
                return
            host = self.rng.choice(free)
            self.cluster.partition(host)
            self.cut[host] = time.monotonic() + self._lapse()
        elif kind == "pause":
            if not live:
                return
            slot, proc = self.rng.choice(live)
            self.cluster.pause(proc)
            self.paused[slot] = (proc, time.monotonic() + self._lapse())
        elif kind == "skew":
            if not live:
                return
            slot, proc = self.rng.choice(live)
            self.skews[slot] = self.rng.choice((-1, 1)) * self.cfg.skew_seconds
            self.cluster.kill(proc)  # the supervisor restarts it with the skewed clock
        elif kind == "kill":
            if not live:
                return
            self._kill_one()
        elif kind == "db-restart":
            self.server.restart()
        else:
            raise ValueError(f"unknown fault {kind!r}")
        self.report.faults[kind] += 1

    def _calm(self) -> None:
        for host in list(self.cut):
            self.cluster.heal(host)
        self.cut.clear()
        for proc, _at in self.paused.values():
            if proc.poll() is None:
                self.cluster.resume(proc)
        self.paused.clear()
