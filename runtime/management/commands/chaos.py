"""``manage.py chaos``: a soak that kills real workers at random and checks every invariant."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from django.db import connections

from runtime.testkit.chaos import Chaos, ChaosConfig


class Command(BaseCommand):
    help = ("Start workers on a fresh SQLite database, SIGKILL them at random, restart them, "
            "decide every approval at random, then check the crash invariants and print a "
            "table. Exit status 1 if any invariant broke.")

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--workers", type=int, default=3)
        parser.add_argument("--runs", type=int, default=200)
        parser.add_argument("--seconds", type=float, default=60.0,
                            help="stop killing after this long even if runs remain")
        parser.add_argument("--seed", type=int, default=0)
        parser.add_argument("--concurrency", type=int, default=2, help="threads per worker")
        parser.add_argument("--lease-seconds", type=float, default=2.0)
        parser.add_argument("--tool-seconds", type=float, default=0.1,
                            help="the test tools' random latency, so kills land mid-call")
        parser.add_argument("--dir", default=None,
                            help="where to put the database, ledger and logs (kept); default: "
                                 "a temporary directory under var/, removed afterwards")

    def handle(self, *args: Any, **opts: Any) -> None:
        for name in ("workers", "runs", "concurrency"):
            if opts[name] < 1:
                raise CommandError(f"--{name} must be at least 1")
        if opts["seconds"] <= 0 or opts["lease_seconds"] <= 0 or opts["tool_seconds"] < 0:
            raise CommandError("--seconds and --lease-seconds must be positive, "
                               "--tool-seconds not negative")
        if connections["default"].vendor != "sqlite":
            raise CommandError("the soak runs on the embedded SQLite default; unset DATABASE_URL")
        keep = opts["dir"] is not None
        if keep:
            workdir = Path(opts["dir"]).resolve()
            workdir.mkdir(parents=True, exist_ok=True)
            if (workdir / "chaos.sqlite3").exists():
                raise CommandError(f"{workdir} already holds a soak's database; use a new --dir")
        else:
            settings.VAR_DIR.mkdir(parents=True, exist_ok=True)
            workdir = Path(tempfile.mkdtemp(prefix="chaos-", dir=settings.VAR_DIR))
        db = workdir / "chaos.sqlite3"
        config = ChaosConfig(workers=opts["workers"], runs=opts["runs"],
                             seconds=opts["seconds"], seed=opts["seed"],
                             concurrency=opts["concurrency"], lease_seconds=opts["lease_seconds"],
                             tool_seconds=opts["tool_seconds"])
        conf = settings.DATABASES["default"]
        original = conf["NAME"]
        connections.close_all()
        conf["NAME"] = str(db)  # in place: the connection handler holds this very dict
        try:
            call_command("migrate", verbosity=0, interactive=False)
            self.stdout.write(f"chaos: {config.runs} runs, {config.workers} workers x "
                              f"{config.concurrency} threads, seed {config.seed}, in {workdir}")
            report = Chaos(config, db=db, workdir=workdir,
                           manage=Path(settings.BASE_DIR) / "manage.py").run(out=self.stdout)
        finally:
            connections.close_all()
            conf["NAME"] = original
            if not keep:
                shutil.rmtree(workdir, ignore_errors=True)
        for line in report.violations[:50]:
            self.stderr.write(line)
        if not report.ok:
            raise CommandError(f"{len(report.violations)} invariant violation(s)")
        self.stdout.write("chaos: every invariant held")
