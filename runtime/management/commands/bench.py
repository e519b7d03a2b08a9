"""``manage.py bench``: what a durable step costs here, next to what the disk allows.

Runs on a fresh SQLite database of its own under ``var/bench-<pid>/`` (same filesystem and
PRAGMAs as the real one), never the user's; removed at the end unless ``--keep``. With a
PostgreSQL ``DATABASE_URL`` it measures that server instead, on a fresh database of its own
there, against SQLite measured in the same run (``runtime.benchkit.postgres``).

``--console`` is a section of its own (the data set takes a while to build): the console's and
the admin's pages on 100,000 runs, 10,000 pending approvals, 1,000,000 events and a 5,000-step
run, each page's server time (p50, p95), queries and size (``runtime.benchkit.pages``).

``--export`` is another: the audit export's speed and peak memory on 100,000 and 1,000,000
events (``runtime.benchkit.export``).

``--inflight`` is another: real ``runworker`` processes with 1 to 256 runs in flight whose LLM
answers after 100 ms, the same with no wait, and 1, 2, 4 processes, measured from the database
(``runtime.benchkit.inflight``).
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import sqlite3
import statistics
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from django.conf import settings
from django.core.management.base import BaseCommand
from django.db import connections

from runtime.benchkit import export, inflight, postgres, report, scale, workers
from runtime.benchkit.ceiling import ceiling
from runtime.benchkit.db import bench_database, point_default_at, use_database
from runtime.benchkit.floor import cpu_scaling, floor
from runtime.benchkit.pages import FULL, QUICK, PostgresLoader, Sizes, SqliteLoader
from runtime.benchkit.pages import measure as measure_pages
from runtime.benchkit.steps import durable_steps
from runtime.effects import Effect

if TYPE_CHECKING:
    from django.db.backends.postgresql.base import DatabaseWrapper as PostgresWrapper

# (default, --quick) sizes: the default run stays under 3 minutes, --quick under 30 s.
SIZES: dict[str, tuple[Any, Any]] = {
    "ceiling_seconds": (1.5, 0.3),
    "cpu_seconds": (1.0, 0.3),
    "step_runs": (40, 6),
    "worker_runs": (100, 10),
    "approvals": (200, 20),
    "scale": ([10_000, 100_000, 1_000_000], [1_000, 5_000, 20_000]),
    "scale_reps": (40, 10),
    "rss_runs": ((1_000, 10_000), (100, 300)),
}
# On PostgreSQL: the same shapes, rounds of durable steps interleaved with SQLite's.
PG_SIZES: dict[str, tuple[Any, Any]] = {
    "ceiling_seconds": (1.5, 0.3),
    "cpu_seconds": (1.0, 0.3),
    "rounds": (3, 1),
    "step_runs": (40, 6),
    "worker_runs": (100, 10),
}
CONFIGS = [(1, 1), (1, 4), (1, 16), (2, 1), (4, 1)]  # (processes, threads per process)


class Command(BaseCommand):
    help = ("Benchmark the runtime on a fresh database of its own: the disk's commit ceiling, "
            "durable steps per second, workers, approval-to-restart latency, query scaling and "
            "worker memory. Prints a table; --json FILE writes the figures.")

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--quick", action="store_true", help="smaller sizes (under 30 s)")
        parser.add_argument("--json", metavar="FILE", help="write the results as JSON")
        parser.add_argument("--keep", action="store_true", help="keep var/bench-<pid>/")
        parser.add_argument("--console", action="store_true",
                            help="only the console section: build a large data set and time "
                                 "each console and admin page")
        parser.add_argument("--worker-cpu", choices=("auto", "off"), default="auto",
                            help="--inflight: every worker's runworker --cpu (default auto: "
                            "each on a CPU of its own)")
        parser.add_argument("--inflight", action="store_true",
                            help="only the in-flight section: runworker with 1 to 256 runs in "
                                 "flight (LLM 100 ms), no wait, and 1, 2, 4 processes")
        parser.add_argument("--export", action="store_true",
                            help="only the audit export section: 100,000 and 1,000,000 events "
                                 "exported, events/s and peak memory (--quick: 20,000 and "
                                 "100,000)")

    def handle(self, *args: Any, **opts: Any) -> None:
        quick, self.verbosity = opts["quick"], opts["verbosity"]
        self.timings: dict[str, float] = {}
        self._section: str | None = None
        self._since = 0.0
        started = time.perf_counter()
        if opts["console"]:
            results = self.measure_console(QUICK if quick else FULL, quick,
                                           opts["keep"])
            render = report.render_console
        elif opts["export"]:
            with bench_database(keep=opts["keep"]):
                results = export.measure(quick, self.step)
            render = export.render
        elif opts["inflight"]:
            with bench_database(keep=opts["keep"]) as path:
                results = inflight.measure(path, quick, self.step, cpu=opts["worker_cpu"])
            results["machine"] = {"sqlite": sqlite3.sqlite_version,
                                  "python": platform.python_version(),
                                  "cpus": os.cpu_count() or 1, "directory": str(path.parent)}
            render = report.render_inflight
        elif connections["default"].vendor == "postgresql":
            size = {k: v[1] if quick else v[0] for k, v in PG_SIZES.items()}
            results = self.measure_postgres(size, quick, opts["keep"])
            render = postgres.render
        else:
            size = {k: v[1] if quick else v[0] for k, v in SIZES.items()}
            with bench_database(keep=opts["keep"]) as path:
                results = self.measure(path, size, quick)
            results["targets"] = report.targets(results)
            render = report.render
        self.step("")
        results["seconds"] = time.perf_counter() - started
        results["section_seconds"] = {k: round(v, 2) for k, v in self.timings.items()}
        self.stdout.write(render(results))
        if opts["json"]:
            Path(opts["json"]).write_text(json.dumps(results, indent=2, default=str) + "\n")

    def measure_console(self, size: Sizes, quick: bool, keep: bool) -> dict[str, Any]:
        """The console section, on a fresh database of its own: a SQLite file, or with a
        PostgreSQL ``DATABASE_URL`` a database on that server (dropped afterwards)."""
        if connections["default"].vendor != "postgresql":
            with bench_database(keep=keep) as path:
                return measure_pages(SqliteLoader(path), size, quick, self.step)
        var = Path(getattr(settings, "VAR_DIR", Path(settings.BASE_DIR) / "var"))
        directory = var / f"bench-{os.getpid()}"
        shutil.rmtree(directory, ignore_errors=True)
        directory.mkdir(parents=True)
        try:
            with postgres.bench_databases(directory, keep=keep) as dbs:
                use_database(dbs["postgres"])
                r = measure_pages(PostgresLoader(dbs["url"]), size, quick, self.step)
                r["machine"]["server"] = cast("PostgresWrapper", connections["default"]).pg_version
                return r
        finally:
            if not keep:
                shutil.rmtree(directory, ignore_errors=True)

    def measure_postgres(self, size: dict[str, Any], quick: bool, keep: bool) -> dict[str, Any]:
        """The PostgreSQL sections, against a SQLite file measured in the same run."""
        var = Path(getattr(settings, "VAR_DIR", Path(settings.BASE_DIR) / "var"))
        directory = var / f"bench-{os.getpid()}"
        shutil.rmtree(directory, ignore_errors=True)
        (directory / "logs").mkdir(parents=True)
        try:
            with postgres.bench_databases(directory, keep=keep) as dbs:
                r = postgres.measure(dbs, directory / "logs", size, self.step)
                r["server"] = cast("PostgresWrapper", connections["default"]).pg_version
        finally:
            if not keep:
                shutil.rmtree(directory, ignore_errors=True)
        r.update(quick=quick, machine={"sqlite": sqlite3.sqlite_version,
                                       "python": platform.python_version(),
                                       "cpus": os.cpu_count() or 1})
        r["targets"] = postgres.targets(r)
        return r

    def step(self, what: str) -> None:
        """Note where the time goes (in the JSON; on stderr with -v 2)."""
        now = time.perf_counter()
        if self._section is not None:
            self.timings[self._section] = now - self._since
        self._section, self._since = what, now
        if self.verbosity > 1 and what:
            self.stderr.write(f"bench: {what}")

    def measure(self, path: Path, size: dict[str, Any], quick: bool) -> dict[str, Any]:
        directory = path.parent
        connections.close_all()
        template = directory / "template.sqlite3"
        shutil.copyfile(path, template)  # freshly migrated, for the scale section's own file
        r: dict[str, Any] = {"quick": quick, "machine": {
            "sqlite": sqlite3.sqlite_version, "python": platform.python_version(),
            "cpus": os.cpu_count() or 1, "directory": str(directory)}}
        samples, floors = [], []

        def disk() -> None:  # the ceiling and the floor, between the runtime's own sections
            samples.append(ceiling(directory, size["ceiling_seconds"]))
            floors.append(floor(template, directory, size["ceiling_seconds"]))

        self.step("ceiling, floor and durable steps")
        disk()
        steps = []
        for agent, effect in (("bench_read", Effect.READ_ONLY),
                              ("bench_write", Effect.SIDE_EFFECT)):
            steps.append({"effect": effect, **durable_steps(agent, size["step_runs"])})
            disk()
        r["ceiling"] = {"commits_per_s": statistics.median(samples), "samples": samples}
        r["floor"] = {"steps_per_s": statistics.median(floors), "samples": floors}
        for s in steps:
            s["efficiency"] = s["steps_per_s"] * s["commits_per_step"] / r["ceiling"][
                "commits_per_s"]
        r["steps"] = steps
        logs = directory / "logs"
        logs.mkdir(exist_ok=True)
        self.step("cpu scaling")
        r["cpu_scaling"] = cpu_scaling(size["cpu_seconds"])
        r["concurrency"] = []
        for processes, threads in CONFIGS:
            self.step(f"{processes} process(es) x {threads} thread(s)")
            r["concurrency"].append(workers.throughput(
                path, logs, processes=processes, threads=threads, runs=size["worker_runs"]))
        r["writer_limit"] = report.writer_limit(r)
        self.step("approval to restart")
        r["approvals"] = workers.approval_latency(path, logs, count=size["approvals"])
        self.step("worker memory")
        first, total = size["rss_runs"]
        r["rss"] = workers.worker_rss(path, logs, first=first, total=total)
        self.step("query scaling")
        scale_path = directory / "scale.sqlite3"
        shutil.move(template, scale_path)
        point_default_at(scale_path)
        try:
            r["scale"] = list(scale.measure(scale_path, size["scale"], size["scale_reps"]))
        finally:
            point_default_at(path)
        return r
