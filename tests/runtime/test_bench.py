"""``manage.py bench`` works end to end, and what a step costs does not grow with the run."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from runtime.agents import registry
from runtime.benchkit.agents import AGENTS
from runtime.benchkit.steps import create_runs
from runtime.driver import Driver
from runtime.instrument import SqliteCounter
from runtime.lease import LeaseKeeper
from runtime.models import Step
from runtime.protocol import protocol_check
from tests.procs import ROOT

SECTIONS = {"machine", "ceiling", "floor", "cpu_scaling", "steps", "concurrency", "writer_limit",
            "approvals", "rss", "scale", "targets", "seconds", "quick"}


def _counted(steps: int) -> SqliteCounter:
    """Drive one bench run of ``steps`` read-only tool steps, counting its statements."""
    (run_id,) = create_runs("bench_read", 1, steps)
    driver = Driver(name="t", lease_seconds=30, keeper=LeaseKeeper(30))  # no heartbeat thread
    with SqliteCounter() as counter:
        assert driver.drive(run_id).status == "succeeded"
    assert Step.objects.filter(run_id=run_id).exclude(tool="").count() == steps
    return counter


def test_statements_and_commits_per_step_stay_constant_from_10_to_1000_steps(rdb):
    protocol_check()  # once per process: not a cost of the first run counted
    with registry.override(*AGENTS):
        a, b, c = _counted(10), _counted(100), _counted(1_000)
    early = (b.statements - a.statements) / 90
    late = (c.statements - b.statements) / 900
    assert early == late  # nothing per step reads or rewrites what earlier steps wrote
    assert (b.commits - a.commits) / 90 == (c.commits - b.commits) / 900 == 2
    assert a.rollbacks == b.rollbacks == c.rollbacks == 0


@pytest.mark.slow
def test_bench_quick_runs_and_writes_every_section(tmp_path):
    out = tmp_path / "bench.json"
    env = {**os.environ, "RUNTIME_VAR_DIR": str(tmp_path / "var")}
    env.pop("DATABASE_URL", None)
    proc = subprocess.run([sys.executable, "manage.py", "bench", "--quick", "--json", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads(out.read_text())
    assert set(data) >= SECTIONS, sorted(SECTIONS - set(data))
    assert {s["effect"] for s in data["steps"]} == {"read_only", "side_effect"}
    assert {(c["processes"], c["threads"]) for c in data["concurrency"]} >= {
        (1, 1), (1, 4), (1, 16), (2, 1), (4, 1)}
    # Every worker told how much of the write lock it held (its stop line), and it held some.
    assert all(c["writer_busy"] > 0 for c in data["concurrency"])
    assert data["floor"]["steps_per_s"] > 0 and data["cpu_scaling"] > 0
    assert len(data["scale"]) == 3 and all(s["queries"] for s in data["scale"])
    assert {"p50_ms", "p95_ms"} <= set(data["approvals"])
    assert {"rss_first_kib", "rss_total_kib"} <= set(data["rss"])
    assert all({"target", "met", "figure"} <= set(t) for t in data["targets"])
    assert "Targets" in proc.stdout
    assert not list((tmp_path / "var").glob("bench-*"))  # its database was removed


@pytest.mark.slow
def test_bench_on_postgres_measures_round_trips_against_sqlite_in_the_same_run(tmp_path,
                                                                               pg_admin):
    """``DATABASE_URL=postgres://...`` benches that server (on a database of its own, dropped
    after) against SQLite in the same run; a steady step is two round trips, counted."""
    from tests.engines import SERVER

    out = tmp_path / "bench.json"
    env = {**os.environ, "RUNTIME_VAR_DIR": str(tmp_path / "var"), "DATABASE_URL": SERVER}
    proc = subprocess.run([sys.executable, "manage.py", "bench", "--quick", "--json", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads(out.read_text())
    pg, lite = data["steps"]["postgresql"], data["steps"]["sqlite"]
    assert pg["engine"] == "postgresql" and lite["engine"] == "sqlite"
    assert pg["steady_round_trips_per_step"] == pg["late_round_trips_per_step"] == 2
    assert lite["steady_commits_per_step"] == 2
    assert data["steps"]["ratio"] == pytest.approx(pg["steps_per_s"] / lite["steps_per_s"])
    assert [c["processes"] for c in data["processes"]] == [1, 2, 4]
    assert all(c["succeeded"] == c["runs"] for c in data["processes"])
    assert any(t["target"].startswith("round trips") and t["met"] for t in data["targets"])
    names = {n for (n,) in pg_admin.execute(
        "SELECT datname FROM pg_database WHERE datname LIKE 'runtime_bench_%'").fetchall()}
    assert not names  # its database was dropped
    assert not list((tmp_path / "var").glob("bench-*"))
