"""``manage.py runagent`` in a real process: events printed, exit codes, bad input refused."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _manage(db: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "DATABASE_URL": f"sqlite:///{db}"}
    return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)


def _count(db: Path, table: str) -> int:
    with sqlite3.connect(db) as conn:
        return conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]


def test_runagent_prints_each_event_and_exits_zero(rdb):
    done = _manage(rdb, "runagent", "hello", "--input", '{"name": "Ada", "language": "fr"}')
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    kinds = [line.split()[2] for line in lines[:-1]]
    assert kinds[:3] == ["run.created", "lease.taken", "run.started"]
    assert kinds[-2:] == ["run.succeeded", "lease.released"]
    assert "step.tool_finished" in kinds
    assert lines[-1].startswith("run 1: succeeded") and "Bonjour, Ada!" in lines[-1]
    assert _manage(rdb, "verifyaudit").returncode == 0


def test_runagent_refuses_bad_json_and_unknown_agents_writing_nothing(rdb):
    bad_json = _manage(rdb, "runagent", "hello", "--input", "{nope")
    assert bad_json.returncode != 0
    assert bad_json.stderr.strip().splitlines()[-1].startswith(
        "CommandError: --input is not valid JSON")
    unknown = _manage(rdb, "runagent", "nobody", "--input", "{}")
    assert unknown.returncode != 0
    assert "unknown agent 'nobody'" in unknown.stderr
    assert _count(rdb, "runtime_run") == 0 and _count(rdb, "runtime_event") == 0
