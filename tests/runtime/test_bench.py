"""``manage.py bench`` works end to end, and what a step costs does not grow with the run."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from contextlib import closing

import pytest

from runtime.agents.agent import registry
from runtime.benchkit import pages as page_bench
from runtime.benchkit.agents import AGENTS
from runtime.benchkit.inflight import paired_ratios
from runtime.benchkit.steps import create_runs
from runtime.leasing.heartbeat import LeaseKeeper
from runtime.loop.driver import Driver
from runtime.models import Step
from runtime.storage.protocol import protocol_check
from runtime.storage.sqlite.instrument import SqliteCounter
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


def test_statements_and_commits_per_step_stay_constant_from_10_to_1000_steps(sqlite_path):
    protocol_check()  # once per process: not a cost of the first run counted
    with registry.override(*AGENTS):
        a, b, c = _counted(10), _counted(100), _counted(1_000)
    early = (b.statements - a.statements) / 90
    late = (c.statements - b.statements) / 900
    assert early == late  # nothing per step reads or rewrites what earlier steps wrote
    assert (b.commits - a.commits) / 90 == (c.commits - b.commits) / 900 == 2
    assert a.rollbacks == b.rollbacks == c.rollbacks == 0


@pytest.mark.slow
@pytest.mark.xdist_group("machine")  # its workers claim CPUs machine-wide (--cpu auto)
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
@pytest.mark.xdist_group("machine")  # its workers claim CPUs machine-wide (--cpu auto)
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
    assert [(c["processes"], c["threads"], c["loop"]) for c in data["inflight"]] == [
        (1, 16, "threads"), (1, 16, "asyncio"), (2, 16, "asyncio")]
    assert all(c["succeeded"] == c["runs"] and c["steps_per_s"] > 0 for c in data["inflight"])
    assert any(t["target"].startswith("PostgreSQL, 16 in flight each: 2 workers")
               for t in data["targets"])
    assert any(t["target"].startswith("round trips") and t["met"] for t in data["targets"])
    names = {n for (n,) in pg_admin.execute(
        "SELECT datname FROM pg_database WHERE datname LIKE 'runtime_bench_%'").fetchall()}
    assert not names  # its database was dropped
    assert not list((tmp_path / "var").glob("bench-*"))


CONSOLE_PAGES = {"/", "/pending-count/", "/runs/", "/runs/?status=failed", "/workers/",
                 "/admin/runtime/event/", "/admin/runtime/run/",
                 "/admin/runtime/approval/?status=pending", "/admin/runtime/step/"}


@pytest.mark.slow
@pytest.mark.xdist_group("machine")  # its workers claim CPUs machine-wide (--cpu auto)
def test_bench_console_quick_times_every_page_on_the_data_set_asked_for(tmp_path):
    """``bench --console --quick`` builds the data set at the sizes asked (counted in the
    database it leaves with ``--keep``, every run's audit chain valid) and times every page,
    each answering 200."""
    out, var = tmp_path / "console.json", tmp_path / "var"
    env = {**os.environ, "RUNTIME_VAR_DIR": str(var)}
    env.pop("DATABASE_URL", None)
    proc = subprocess.run([sys.executable, "manage.py", "bench", "--console", "--quick",
                           "--keep", "--json", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads(out.read_text())
    q = page_bench.QUICK
    assert data["section"] == "console" and data["quick"] is True
    assert data["sizes"] == {"runs": q.runs, "pending": q.pending, "events": q.events,
                             "long_run_steps": q.long_steps, "reps": q.reps}
    built = data["built"]
    asked = {"runs": q.runs, "pending": q.pending, "events": q.events,
             "long_run_steps": q.long_steps}
    assert {k: built[k] for k in asked} == asked
    assert {k: data["counted"][k] for k in asked} == asked

    (db,) = var.glob("bench-*/bench.sqlite3")
    with closing(sqlite3.connect(db)) as conn:
        def one(sql: str, *args) -> int:
            return conn.execute(sql, args).fetchone()[0]

        assert one("SELECT COUNT(*) FROM runtime_run") == q.runs
        assert one("SELECT COUNT(*) FROM runtime_event") == q.events
        assert one("SELECT COUNT(*) FROM runtime_step") == built["steps"]
        assert one("SELECT COUNT(*) FROM runtime_approval WHERE status = 'pending'") == q.pending
        assert one("SELECT COUNT(*) FROM runtime_step WHERE run_id = ?",
                   built["long_run"]) == q.long_steps
        pending_kinds = {k for (k,) in conn.execute(
            "SELECT DISTINCT kind FROM runtime_approval WHERE status = 'pending'")}
        assert pending_kinds == {"policy", "interrupted_side_effect"}
        assert one("SELECT COUNT(*) FROM runtime_approval WHERE status != 'pending'") > 0
        assert one("SELECT COUNT(*) FROM runtime_approval WHERE run_id = ?",
                   built["long_run"]) > 1
        statuses = {s for (s,) in conn.execute("SELECT DISTINCT status FROM runtime_run")}
        assert statuses == {"succeeded", "failed", "waiting", "queued", "running", "cancelled"}
        assert one("SELECT COUNT(*) FROM runtime_run WHERE status = 'running' "
                   "AND lease_owner = ''") == 0
        assert one("SELECT COUNT(*) FROM runtime_worker") == built["workers"] >= 2
        assert one("SELECT COUNT(DISTINCT actor) FROM runtime_event WHERE actor LIKE "
                   "'worker@%'") >= 200  # ~200 dead workers' owners among them
    # Bulk-built, yet every run's hash chain holds.
    audit = subprocess.run([sys.executable, "manage.py", "verifyaudit"], cwd=ROOT,
                           env={**env, "DATABASE_URL": f"sqlite:///{db}"},
                           capture_output=True, text=True, timeout=240)
    assert audit.returncode == 0, audit.stdout[-2000:] + audit.stderr[-2000:]
    assert f"ok: {q.runs} runs verified" in audit.stdout

    pages = data["pages"]
    assert {p["path"] for p in pages} >= CONSOLE_PAGES
    assert {p["path"] for p in pages if p["htmx"]} >= {"/", "/pending-count/"}
    assert any(p["path"] == f"/runs/{built['long_run']}/" for p in pages)
    assert any(p["path"].startswith("/admin/runtime/event/?kind=") and "&p=" in p["path"]
               for p in pages)
    for p in pages:
        assert p["status"] == 200, (p["page"], p["answer"])
        assert 0 < p["p50_ms"] <= p["p95_ms"] <= p["max_ms"], p
        assert p["queries"] > 0 and p["bytes"] > 0 and p["reps"] == q.reps, p
        assert p["over_target"] == (p["p95_ms"] > data["target_ms"])
    assert data["target_ms"] == 150
    assert all({"target", "met", "figure"} <= set(t) for t in data["targets"])
    assert data["build_seconds"] > 0 and data["seconds"] > 0
    assert "Targets" in proc.stdout and "p95 ms" in proc.stdout


@pytest.mark.slow
@pytest.mark.xdist_group("machine")  # its workers claim CPUs machine-wide (--cpu auto)
def test_bench_inflight_quick_reports_every_level(tmp_path):
    """``bench --inflight --quick`` runs real workers at every level and reports each one's
    figures, measured (not their values: speed targets are the benchmark's, not the tests')."""
    out = tmp_path / "inflight.json"
    env = {**os.environ, "RUNTIME_VAR_DIR": str(tmp_path / "var")}
    env.pop("DATABASE_URL", None)
    proc = subprocess.run([sys.executable, "manage.py", "bench", "--inflight", "--quick",
                           "--json", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["section"] == "inflight" and data["quick"] is True
    assert [x["loop"] for x in data["loops"]] == ["threads", "asyncio"]
    assert [(x["agent"], x["in_flight"]) for x in data["agents"]] == [
        ("native", 64), ("pydantic-ai", 64)]
    assert all(x["failed_runs"] == 0 and x["steps_per_s"] > 0 for x in data["agents"])
    assert data["pydantic_ai_own_cpu_ms"] > 0
    assert {x["in_flight"] for x in data["loops"]} == {16}
    assert {x["loop"] for x in data["levels"] + data["nowait"]} == {"asyncio"}
    assert [x["in_flight"] for x in data["levels"]] == [1, 16, 64]
    assert [x["in_flight"] for x in data["nowait"]] == [1, 16]
    assert [x["processes"] for x in data["processes"]] == [1, 2]
    assert {x["in_flight"] for x in data["processes"]} == {16, 32}
    # with many runs in flight, commits carry several plans: fewer commits than plans
    sixteen = data["nowait"][1]
    assert sixteen["commits_per_step"] < sixteen["plans_per_step"], sixteen
    for x in data["levels"]:
        assert x["ideal_steps_per_s"] == x["in_flight"] * 10
        assert x["percent_of_ideal"] == pytest.approx(
            100 * x["steps_per_s"] / x["ideal_steps_per_s"])
    for x in data["levels"] + data["nowait"] + data["processes"] + data["loops"]:
        assert x["steps_per_s"] > 0 and x["steps"] > 0, x
        assert x["p99_ms"] >= x["p50_ms"] > 0, x
        assert x["rss_mib"] > 10, x  # a Django process's resident memory, read from /proc
        assert x["locked_errors"] == 0 and x["tracebacks"] == 0, x
        assert x["failed_runs"] == 0 and not any(x["exit_codes"]) and not x["overran"], x
        assert x["write_transactions"] > 0 and x["plans_per_step"] > 0, x
        assert x["group_commits"] > 0 and x["plans_per_group"] >= 1, x
        assert x["fsyncs_per_step"] is None or x["fsyncs_per_step"] > 0, x
        # every line in rounds (one with --quick), each configuration its median round's
        assert x["rounds_steps_per_s"] == [x["steps_per_s"]], x
    for line in ("nowait", "processes", "loops"):
        assert data[line][0]["ratio"] == 1.0
        for x in data[line]:  # one round: the paired ratio is the ratio of the medians
            assert x["rounds_ratio"] == [pytest.approx(x["ratio"])]
            assert x["ratio"] == pytest.approx(x["ratio_of_medians"])
    names = [t["target"] for t in data["targets"]]
    assert any("ideal" in n and "64 in flight" in n for n in names)
    assert any(n.startswith("no wait: 16 in flight") for n in names)
    assert any(n.startswith("2 processes") for n in names)
    assert any(n.startswith("event loop >= thread per run") for n in names)
    assert any("pydantic-ai agent at 64 in flight" in n for n in names)
    assert any(n.startswith("no wait: CPU per step at 16") for n in names)
    assert any("database is locked" in n for n in names)
    assert all(isinstance(t["met"], bool) and t["figure"] for t in data["targets"])
    assert "Targets" in proc.stdout and "% ideal" in proc.stdout and "4. Loops" in proc.stdout
    assert "5. Agents" in proc.stdout
    assert not list((tmp_path / "var").glob("bench-*"))  # its databases were removed


def test_a_ratio_pairs_the_configurations_measured_in_the_same_round():
    """Three rounds on a machine that slowed down in the middle: each configuration's median
    round comes from a different round, and their ratio (1.5) is not what any round saw; the
    median of the rounds' own ratios (2.0) is."""
    base = [{"steps_per_s": v} for v in (100.0, 60.0, 90.0)]
    double = [{"steps_per_s": v} for v in (200.0, 120.0, 135.0)]
    line = [{"steps_per_s": 90.0}, {"steps_per_s": 135.0}]  # each one's median round
    paired_ratios(line, [base, double])
    assert line[0]["ratio"] == 1.0 and line[0]["rounds_ratio"] == [1.0, 1.0, 1.0]
    assert line[1]["rounds_ratio"] == [2.0, 2.0, 1.5]
    assert line[1]["ratio"] == 2.0
    assert line[1]["ratio_of_medians"] == 1.5


def test_the_peers_script_of_this_project_measures_its_runs(tmp_path):
    """``bench/peers/runtime_steps.py`` (the recipe's line for this project) runs as written."""
    proc = subprocess.run([sys.executable, "bench/peers/runtime_steps.py", "--runs", "2",
                           "--steps", "3"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    line = json.loads(proc.stdout.strip().splitlines()[-1])
    assert line["steps"] == 6 and line["steps_per_s"] > 0 and line["inflight"] == 1


def test_the_peers_script_of_this_project_measures_runs_in_flight(tmp_path):
    """``--inflight 4``: a worker drains the queued runs, four in flight, every one finished."""
    proc = subprocess.run([sys.executable, "bench/peers/runtime_steps.py", "--runs", "6",
                           "--steps", "3", "--inflight", "4"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    line = json.loads(proc.stdout.strip().splitlines()[-1])
    assert line["steps"] == 18 and line["inflight"] == 4 and line["steps_per_s"] > 0
    assert "worker, --loop asyncio" in line["system"]
