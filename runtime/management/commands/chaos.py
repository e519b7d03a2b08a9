"""``manage.py chaos``: a soak that kills real workers at random and checks every invariant."""

from __future__ import annotations

import contextlib
import copy
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import dj_database_url
import psycopg
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from django.db import DEFAULT_DB_ALIAS, connections

from runtime.models import Event, Run
from runtime.storage.postgres.network import with_network_options
from runtime.testkit.chaos import Chaos, ChaosConfig
from runtime.testkit.hosts import Cluster, PgServer
from runtime.testkit.partition import FAULTS, PartitionConfig, PartitionSoak


def _point_default_at(config: dict[str, Any]) -> None:
    """Swap the default connection's settings in place (the connection handler holds this very
    dict) and drop this thread's connection, whose class may be the other engine's."""
    connections.close_all()
    with contextlib.suppress(AttributeError):  # never opened on this thread
        del connections[DEFAULT_DB_ALIAS]
    conf = settings.DATABASES[DEFAULT_DB_ALIAS]
    conf.clear()
    conf.update(config)
    connections.configure_settings({DEFAULT_DB_ALIAS: conf})


def _dump_events(path: Path) -> None:
    """Every event of the soak, one JSON object a line, in run and sequence order."""

    with open(path, "w") as out:
        for event in Event.objects.order_by("run_id", "seq").values(
                "run_id", "seq", "step_index", "kind", "actor", "at", "payload").iterator():
            out.write(json.dumps(event, default=str) + "\n")


class Command(BaseCommand):
    help = ("Start workers on a fresh SQLite database (or, with --database-url, an empty "
            "PostgreSQL one), SIGKILL them at random, restart them, decide every approval at "
            "random, then check the crash invariants and print a table. Exit status 1 if any "
            "invariant broke.")

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
        parser.add_argument("--hosts", type=int, default=0,
                            help="the partition soak: one worker on each of this many hosts "
                                 "(network namespaces; needs root) against a PostgreSQL server "
                                 "of its own, with --faults between them")
        parser.add_argument("--faults", default=",".join(FAULTS),
                            help=f"with --hosts, the faults to inject (of {', '.join(FAULTS)})")
        parser.add_argument("--database-url", default=None,
                            help="soak this PostgreSQL database (postgres://...) instead of a "
                                 "fresh SQLite file; it is migrated first and refused if it "
                                 "holds any run, so a soak never fills a real one")

    def handle(self, *args: Any, **opts: Any) -> None:
        for name in ("workers", "runs", "concurrency"):
            if opts[name] < 1:
                raise CommandError(f"--{name} must be at least 1")
        if opts["seconds"] <= 0 or opts["lease_seconds"] <= 0 or opts["tool_seconds"] < 0:
            raise CommandError("--seconds and --lease-seconds must be positive, "
                               "--tool-seconds not negative")
        if opts["hosts"]:
            self._partition_soak(opts)
            return
        url = opts["database_url"]
        target: dict[str, Any] | None = None
        if url is not None:
            target = with_network_options(dict(dj_database_url.parse(url, conn_max_age=0)))
            if "postgres" not in target["ENGINE"]:
                raise CommandError("--database-url takes a PostgreSQL URL; a SQLite soak makes "
                                   "its own fresh file")
        elif connections["default"].vendor != "sqlite":
            raise CommandError("the soak runs on a fresh SQLite file, or on an empty PostgreSQL "
                               "database given with --database-url; unset DATABASE_URL")
        keep = opts["dir"] is not None
        if keep:
            workdir = Path(opts["dir"]).resolve()
            workdir.mkdir(parents=True, exist_ok=True)
            if (workdir / "chaos.sqlite3").exists() or (workdir / "ledger.jsonl").exists():
                raise CommandError(f"{workdir} already holds a soak's evidence; use a new --dir")
        else:
            settings.VAR_DIR.mkdir(parents=True, exist_ok=True)
            workdir = Path(tempfile.mkdtemp(prefix="chaos-", dir=settings.VAR_DIR))
        db: Path | str = url if url is not None else workdir / "chaos.sqlite3"
        config = ChaosConfig(workers=opts["workers"], runs=opts["runs"],
                             seconds=opts["seconds"], seed=opts["seed"],
                             concurrency=opts["concurrency"], lease_seconds=opts["lease_seconds"],
                             tool_seconds=opts["tool_seconds"])
        original = copy.deepcopy(settings.DATABASES["default"])
        _point_default_at(target if target is not None else {**original, "NAME": str(db)})
        try:
            call_command("migrate", verbosity=0, interactive=False)
            if Run.objects.exists():
                raise CommandError(f"{url} already holds runs; the soak needs an empty database")
            self.stdout.write(f"chaos: {config.runs} runs, {config.workers} workers x "
                              f"{config.concurrency} threads, seed {config.seed}, in {workdir}")
            report = Chaos(config, db=db, workdir=workdir,
                           manage=Path(settings.BASE_DIR) / "manage.py").run(out=self.stdout)
        finally:
            _point_default_at(original)
            if not keep:
                shutil.rmtree(workdir, ignore_errors=True)
        for line in report.violations[:50]:
            self.stderr.write(line)
        if not report.ok:
            raise CommandError(f"{len(report.violations)} invariant violation(s)")
        self.stdout.write("chaos: every invariant held")

    def _partition_soak(self, opts: dict[str, Any]) -> None:
        faults = tuple(f for f in opts["faults"].split(",") if f)
        unknown = sorted(set(faults) - set(FAULTS))
        if unknown or not faults:
            raise CommandError(f"--faults takes some of {', '.join(FAULTS)}; not "
                               f"{', '.join(unknown) or 'nothing'}")
        if opts["hosts"] < 2:
            raise CommandError("--hosts must be at least 2 (a takeover needs another host)")
        if os.geteuid() != 0:
            raise CommandError("--hosts needs root: it makes network namespaces")
        settings.VAR_DIR.mkdir(parents=True, exist_ok=True)
        keep = opts["dir"] is not None
        workdir = (Path(opts["dir"]).resolve() if keep
                   else Path(tempfile.mkdtemp(prefix="partition-", dir=settings.VAR_DIR)))
        workdir.mkdir(parents=True, exist_ok=True)
        config = PartitionConfig(workers=opts["hosts"], runs=opts["runs"],
                                 seconds=opts["seconds"], seed=opts["seed"],
                                 concurrency=opts["concurrency"],
                                 lease_seconds=opts["lease_seconds"],
                                 tool_seconds=opts["tool_seconds"], faults=faults,
                                 kill_interval=(0.5, 2.0))
        cluster = Cluster(opts["hosts"])
        server = PgServer(cluster.address, 6400 + cluster.net, cluster.subnet)
        original = copy.deepcopy(settings.DATABASES["default"])
        try:
            cluster.up()
            server.start()
            with psycopg.connect(server.url("postgres"), autocommit=True) as admin:
                admin.execute("CREATE DATABASE chaos")
            url = server.url("chaos")
            _point_default_at(with_network_options(
                dict(dj_database_url.parse(url, conn_max_age=0))))
            call_command("migrate", verbosity=0, interactive=False)
            self.stdout.write(f"partition soak: {config.runs} runs, {opts['hosts']} hosts x "
                              f"{config.concurrency} threads, faults {', '.join(faults)}, "
                              f"seed {config.seed}, in {workdir}")
            report = PartitionSoak(config, cluster=cluster, server=server, url=url,
                                   workdir=workdir,
                                   manage=Path(settings.BASE_DIR) / "manage.py").run(
                                       out=self.stdout)
            if keep:  # the database goes with its server: keep the evidence beside the logs
                _dump_events(workdir / "events.jsonl")
        finally:
            _point_default_at(original)
            cluster.down()
            server.remove()
            if not keep:
                shutil.rmtree(workdir, ignore_errors=True)
        for line in report.violations[:50]:
            self.stderr.write(line)
        if not report.ok:
            raise CommandError(f"{len(report.violations)} invariant violation(s)")
        self.stdout.write("partition soak: every invariant held")
