"""The partition soak: the chaos soak with each worker on a host of its own (network namespaces)
against a PostgreSQL server of its own, and faults between machines: a host cut off the
database and healed, a worker (or its whole host) paused past its lease and resumed, a host's
link to the database slowed (a delay and jitter below the lease) and restored, a worker
restarted with its clock two hours off, a worker SIGKILLed, the database server restarted.
A random operator decides every approval; the outside world's ledger counts side effects;
every invariant of design §11 is checked at the end (``runtime.testkit.chaos`` does the rest).
"""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runtime.host.pids import die_with_parent
from runtime.testkit.chaos import Chaos, ChaosConfig, ChaosReport
from runtime.testkit.hosts import Cluster, DelayProxy, PgServer

FAULTS = ("partition", "pause", "pause-host", "slow", "skew", "kill", "db-restart")


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
        self.deck: list[str] = []  # the fault kinds still to deal in this round
        self.stopped: dict[str, float] = {}  # host -> when to resume it
        self.slowed: dict[str, float] = {}  # host -> when its link is fast again
        # Each host reaches the database through a relay of its own (no delay until slowed).
        self.links = {host: DelayProxy((cluster.address, server.port + 1 + i),
                                       (cluster.address, server.port), seed=config.seed + i)
                      for i, host in enumerate(cluster.hosts)} if "slow" in config.faults else {}

    def run(self, out: Any = None) -> ChaosReport:
        for link in self.links.values():
            link.start()
        try:
            return super().run(out)
        finally:
            for link in self.links.values():
                link.stop()

    def _host(self, slot: int) -> str:
        return self.cluster.hosts[slot % len(self.cluster.hosts)]

    def _spawn(self, slot: int, args: list[str], env: dict[str, str],
               log_path: Path) -> subprocess.Popen:
        skew = self.skews.get(slot, 0.0)
        command = ([sys.executable, str(Path(__file__).with_name("skew.py")), str(skew)]
                   if skew else [sys.executable, str(self.manage)])
        link = self.links.get(self._host(slot))
        if link is not None:
            env = {**env, "DATABASE_URL": link.url(env["DATABASE_URL"])}
        return self.cluster.popen(self._host(slot), [*command, *args], env=env, log=log_path,
                                  cwd=self.manage.parent, preexec_fn=die_with_parent)

    def _supervise(self) -> None:
        now = time.monotonic()
        for host, heal_at in list(self.cut.items()):
            if now >= heal_at:
                self.cluster.heal(host)
                del self.cut[host]
        for host, resume_at in list(self.stopped.items()):
            if now >= resume_at:
                self.cluster.resume_host(host)
                del self.stopped[host]
        for host, fast_at in list(self.slowed.items()):
            if now >= fast_at:
                self.links[host].fast()
                del self.slowed[host]
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
        if not self.deck:  # every kind once, in a seeded order, before any comes again
            self.deck = self.rng.sample(self.cfg.faults, len(self.cfg.faults))
        kind = self.deck.pop()
        if self._inject(kind):
            self.report.faults[kind] += 1
        else:  # nothing to inject it on now: it comes round again later
            self.deck.insert(0, kind)

    def _inject(self, kind: str) -> bool:
        """Inject one fault of ``kind``; False if there is nothing to inject it on now."""
        live = [(s, p) for s, p in self.procs.items()
                if p.poll() is None and s not in self.paused]
        if kind == "partition":
            free = [h for h in self.cluster.hosts if h not in self.cut]
            if not free:
                return False
            host = self.rng.choice(free)
            self.cluster.partition(host)
            self.cut[host] = time.monotonic() + self._lapse()
        elif kind == "pause":
            if not live:
                return False
            slot, proc = self.rng.choice(live)
            self.cluster.pause(proc)
            self.paused[slot] = (proc, time.monotonic() + self._lapse())
        elif kind in ("pause-host", "slow"):
            held = self.stopped if kind == "pause-host" else self.slowed
            free = [h for h in self.cluster.hosts if h not in held]
            if not free:
                return False
            host = self.rng.choice(free)
            if kind == "pause-host":
                self.cluster.pause_host(host)
            else:  # each way 3-8% of a lease and jitter up to half that again: a renewal's
                # round trips stay well inside the lease, so it must never be taken over
                delay = self.rng.uniform(0.03, 0.08) * self.cfg.lease_seconds
                self.links[host].slow(delay, jitter=delay / 2)
            held[host] = time.monotonic() + self._lapse()
        elif kind == "skew":
            if not live:
                return False
            slot, proc = self.rng.choice(live)
            self.skews[slot] = self.rng.choice((-1, 1)) * self.cfg.skew_seconds
            self.cluster.kill(proc)  # the supervisor restarts it with the skewed clock
        elif kind == "kill":
            if not live:
                return False
            self._kill_one()
        elif kind == "db-restart":
            self.server.restart()
        else:
            raise ValueError(f"unknown fault {kind!r}")
        return True

    def _calm(self) -> None:
        for host in list(self.cut):
            self.cluster.heal(host)
        self.cut.clear()
        for proc, _at in self.paused.values():
            if proc.poll() is None:
                self.cluster.resume(proc)
        self.paused.clear()
        for host in list(self.stopped):
            self.cluster.resume_host(host)
        self.stopped.clear()
        for host in list(self.slowed):
            self.links[host].fast()
        self.slowed.clear()
