"""``manage.py runagent`` in a real process: events printed, exit codes, bad input refused."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _manage(db: Path, *args: str, **env_vars: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "DATABASE_URL": f"sqlite:///{db}", **env_vars}
    return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)


def _count(db: Path, table: str) -> int:
    with sqlite3.connect(db) as conn:
        return conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]


def test_runagent_prints_each_event_and_exits_zero(sqlite_path):
    done = _manage(sqlite_path, "runagent", "hello", "--input", '{"name": "Ada", "language": "fr"}')
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    kinds = [line.split()[2] for line in lines[:-1]]
    assert kinds[:3] == ["run.created", "lease.taken", "run.started"]
    assert kinds[-2:] == ["run.succeeded", "lease.released"]
    assert "step.tool_finished" in kinds
    assert lines[-1].startswith("run 1: succeeded") and "Bonjour, Ada!" in lines[-1]
    assert _manage(sqlite_path, "verifyaudit").returncode == 0


def test_runagent_refuses_bad_json_and_unknown_agents_writing_nothing(sqlite_path):
    bad_json = _manage(sqlite_path, "runagent", "hello", "--input", "{nope")
    assert bad_json.returncode != 0
    assert bad_json.stderr.strip().splitlines()[-1].startswith(
        "CommandError: --input is not valid JSON")
    unknown = _manage(sqlite_path, "runagent", "nobody", "--input", "{}")
    assert unknown.returncode != 0
    assert "unknown agent 'nobody'" in unknown.stderr
    assert _count(sqlite_path, "runtime_run") == 0 and _count(sqlite_path, "runtime_event") == 0


def test_startrun_queues_a_run_and_waits_for_a_worker(sqlite_path, spawn):
    queued = _manage(sqlite_path, "startrun", "hello", "--input", '{"name": "Grace"}')
    assert queued.returncode == 0, queued.stderr
    assert queued.stdout.strip() == "run 1 queued (hello)"
    assert _count(sqlite_path, "runtime_run") == 1
    spawn("--poll-interval", "0.05")
    waited = _manage(sqlite_path, "startrun", "hello", "--input", '{"name": "Ada"}', "--wait",
                     "--timeout", "50")
    assert waited.returncode == 0, waited.stdout + waited.stderr
    assert waited.stdout.splitlines()[-1].startswith("run 2: succeeded")
    assert "Hello, Ada!" in waited.stdout


def test_startrun_wait_prints_the_approvals_address_when_the_run_waits(sqlite_path, spawn,
                                                                       tmp_path):
    """The README's own agent asks before a refund above 150.00: ``startrun --wait`` ends
    with exit status 3 and the address where a person decides."""
    from tests.demo.test_readme_walk import readme_agent

    readme_agent(tmp_path / "mine")
    env = {"RUNTIME_AGENTS": "myapp.agents.refunds", "PYTHONPATH": str(tmp_path / "mine"),
           "RUNTIME_APPROVAL_URL": "https://console.example.com/approvals/{id}/"}
    spawn("--poll-interval", "0.05", env=env)
    waited = _manage(sqlite_path, "startrun", "refunds", "--input", '{"order_id": 1001}',
                     "--wait", "--timeout", "50", **env)
    assert waited.returncode == 3, waited.stdout + waited.stderr
    with sqlite3.connect(sqlite_path) as conn:
        (approval_id,) = conn.execute("SELECT id FROM runtime_approval WHERE status='pending'"
                                      ).fetchone()
    assert (f"approval {approval_id} waits for a person (Refund 249.00?): "
            f"https://console.example.com/approvals/{approval_id}/") in waited.stdout


def test_startrun_refuses_bad_json_unknown_agents_and_bad_input_writing_nothing(sqlite_path):
    for args, message in [(("hello", "--input", "[1,"), "--input is not valid JSON"),
                          (("nobody",), "unknown agent 'nobody'"),
                          (("hello", "--input", '"' + "y" * 200 + '"'), "larger than")]:
        done = _manage(sqlite_path, "startrun", *args, RUNTIME_MAX_PAYLOAD_BYTES="100")
        assert done.returncode == 1 and message in done.stderr, (args[:1], done.stderr[-300:])
    assert _count(sqlite_path, "runtime_run") == 0 and _count(sqlite_path, "runtime_event") == 0


def test_runagent_resume_is_refused_while_the_lease_is_live(sqlite_path):
    queued = _manage(sqlite_path, "startrun", "hello", "--input", '{"name": "Ada"}')
    assert queued.returncode == 0
    with sqlite3.connect(sqlite_path) as conn:  # as a live worker elsewhere would leave it
        conn.execute("UPDATE runtime_run SET status='running', lease_owner='w@elsewhere:1:x', "
                     "lease_epoch=1, lease_expires_at=datetime('now', '+1 hour')")
    refused = _manage(sqlite_path, "runagent", "--resume", "1")
    assert refused.returncode == 1 and "is leased by w@elsewhere:1:x" in refused.stderr
    both = _manage(sqlite_path, "runagent", "hello", "--resume", "1")
    assert both.returncode == 1 and "not both" in both.stderr
