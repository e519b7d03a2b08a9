"""``manage.py runworker``: a worker process that claims and executes runs until stopped."""

from __future__ import annotations

import logging
import os
import signal
import sys
from collections.abc import Callable
from typing import Any, TypeVar

from django.core.management.base import BaseCommand, CommandError
from django.db import connection

from runtime import conf, crashpoints
from runtime.agents.agent import registry
from runtime.backups.behind import database_behind_check
from runtime.backups.pending import restore_pending
from runtime.errors import AuditKeyError, CheckpointRefused, DatabaseBehind, UnknownAgent
from runtime.host.cpu import parse_cpu
from runtime.metrics import serve_process_metrics
from runtime.storage.faults import DATABASE_FAULTS, pause_after_fault
from runtime.worker.process import WorkerProcess

T = TypeVar("T")

LEVELS = {0: logging.WARNING, 1: logging.INFO, 2: logging.DEBUG, 3: logging.DEBUG}
# One line per recorded event repeats the audit log on stdout and cost a quarter of a busy
# worker's CPU: shown from -v 2 on; -v 1 shows each run's claims, takeovers and endings.
EVENT_LEVELS = {0: logging.WARNING, 1: logging.WARNING}


class Command(BaseCommand):
    help = ("Claim queued runs (oldest first), take over runs whose owner died, and execute "
            "them. SIGTERM/SIGINT: stop claiming, finish calls in flight, release, exit 0. "
            "-v 1 logs each run's claim and end, -v 2 also every event it records.")

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--concurrency", type=int, default=1,
                            help="runs in flight at once (default 1)")
        parser.add_argument("--loop", choices=("asyncio", "threads"),
                            default=str(conf.value("RUNTIME_WORKER_LOOP")),
                            help="runs in flight as tasks on one event loop (asyncio, the "
                            "default; RUNTIME_WORKER_LOOP sets another) or a thread each")
        parser.add_argument("--name", default="worker", help="lease owner name prefix")
        parser.add_argument("--lease-seconds", type=float, default=None)
        parser.add_argument("--poll-interval", type=float, default=None,
                            help="seconds between looks for expired leases (default 0.5 on "
                            "SQLite, 2 on PostgreSQL, where LISTEN wakes idle workers)")
        parser.add_argument("--grace-seconds", type=float, default=30.0)
        parser.add_argument("--burst", action="store_true", help="drain what is runnable, exit")
        parser.add_argument("--agents", nargs="*", default=[],
                            help="only runs of these agents (default: every agent this "
                            "process has; a run of an agent no live worker has stays queued)")
        parser.add_argument("--cpu", default=str(conf.value("RUNTIME_WORKER_CPU")),
                            help="confine the worker to one CPU: auto (one no other worker "
                            "of this host holds), a CPU number, or off (default; "
                            "RUNTIME_WORKER_CPU sets another)")
        parser.add_argument("--metrics-port", type=int, default=None,
                            help="serve this process's Prometheus metrics on this port (0: a "
                            "free one, logged); off by default")
        parser.add_argument("--metrics-addr", default="127.0.0.1",
                            help="the address --metrics-port binds (default 127.0.0.1)")

    def until_reachable(self, check: Callable[[], T]) -> T:
        """``check()``, asked again while the database cannot be reached: a worker started
        while its server restarts waits for it, as a running one does."""
        delay = 0.5
        while True:
            try:
                return check()
            except DATABASE_FAULTS as exc:
                self.stderr.write(f"the database cannot be reached ({type(exc).__name__}: "
                                  f"{exc}); asking again")
                pause_after_fault(delay)
                delay = min(delay * 2, 5.0)

    def handle(self, *args: Any, **opts: Any) -> None:
        if opts["concurrency"] < 1:
            raise CommandError("--concurrency must be at least 1")
        if opts["lease_seconds"] is not None and opts["lease_seconds"] <= 0:
            raise CommandError("--lease-seconds must be positive")
        try:
            cpu = parse_cpu(opts["cpu"])
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        try:
            for name in opts["agents"]:
                registry.get(name)
        except UnknownAgent as exc:
            raise CommandError(str(exc)) from None
        logging.getLogger("runtime").setLevel(LEVELS.get(opts["verbosity"], logging.INFO))
        logging.getLogger("runtime.events").setLevel(
            EVENT_LEVELS.get(opts["verbosity"], logging.INFO))
        try:  # a database restored and not fenced could repeat side effects
            if self.until_reachable(restore_pending):
                raise CommandError("a restore of this database did not finish: its unfinished "
                                   "runs are not held yet. Run `manage.py restore "
                                   "--acknowledge` (or the restore again), then start workers")
            self.until_reachable(database_behind_check)
        except AuditKeyError as exc:
            raise CommandError(f"RUNTIME_CHECKPOINT_DIR is set, so the newest checkpoint "
                               f"must be read: {exc}") from None
        except (DatabaseBehind, CheckpointRefused) as exc:
            raise CommandError(str(exc)) from None
        if opts["metrics_port"] is not None:
            try:
                serve_process_metrics(opts["metrics_port"], opts["metrics_addr"])
            except (OSError, OverflowError) as exc:
                raise CommandError(f"--metrics-port {opts['metrics_port']} on "
                                   f"{opts['metrics_addr']}: {exc}") from None
        crashpoints.arm_from_env()  # the crash test kit arms this process through its env
        worker = WorkerProcess(
            name=opts["name"], concurrency=opts["concurrency"],
            lease_seconds=opts["lease_seconds"],
            poll_interval=opts["poll_interval"] or (
                2.0 if connection.vendor == "postgresql" else 0.5),
            grace_seconds=opts["grace_seconds"], agents=opts["agents"], burst=opts["burst"],
            cpu=cpu, loop=opts["loop"])
        signals = {"count": 0}

        def on_signal(signum: int, frame: Any) -> None:
            signals["count"] += 1
            if signals["count"] > 1:  # a second signal: leave now; leases will expire
                os._exit(1)
            worker.request_stop()

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        code = worker.run()
        if worker.refusal is not None:
            self.stderr.write(str(worker.refusal))
        sys.exit(code)
