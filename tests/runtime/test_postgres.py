"""The runtime on PostgreSQL, the path for more than one machine: migrations with the audit
log's append-only triggers, the loop through the ORM (the SQLite fast paths fall back), a
worker, a killed worker's side effect put to a person, and ``verifyaudit`` — real processes
against a throwaway database on the local server (``RUNTIME_TEST_POSTGRES`` to point
elsewhere). PostgreSQL is mandatory: without a server these tests fail, never skip.

The database here is created empty and migrated by ``manage.py migrate`` in a subprocess (the
deploy path), unlike the contract tests' databases copied from a migrated template."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator

import psycopg
import pytest

from tests.engines import create_database, drop_database, postgres_url, unique_name
from tests.procs import ROOT

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def pg_url(pg_admin: psycopg.Connection) -> Iterator[str]:
    """An empty database migrated by ``manage.py migrate``; the session's server connection
    fails every test here when there is no server."""
    name = unique_name("deploy")
    create_database(pg_admin, name)
    url = postgres_url(name)
    try:
        done = manage(url, None, "migrate", "-v", "0")
        assert done.returncode == 0, done.stderr
        yield url
    finally:
        drop_database(pg_admin, name)


def manage(url: str, test_dir, *args: str, crash: list | None = None,
           timeout: float = 60) -> subprocess.CompletedProcess:
    env = {**os.environ, "DATABASE_URL": url, "RUNTIME_AGENTS": "tests.agents.AGENTS",
           "RUNTIME_TEST_DIR": str(test_dir or ROOT)}
    if crash:
        env["RUNTIME_CRASH_POINTS"] = json.dumps(crash)
    return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def rows(url: str, sql: str, *params) -> list[tuple]:
    with psycopg.connect(url) as conn:
        return conn.execute(sql, params).fetchall()


def test_runs_workers_and_the_audit_log_on_postgres(pg_url, tmp_path):
    hello = manage(pg_url, tmp_path, "runagent", "hello", "--input", '{"name": "Ada"}')
    assert hello.returncode == 0, hello.stderr
    assert "Hello, Ada!" in hello.stdout
    queued = manage(pg_url, tmp_path, "startrun", "steps5")
    assert queued.returncode == 0, queued.stderr
    worker = manage(pg_url, tmp_path, "runworker", "--burst", "--concurrency", "2")
    assert worker.returncode == 0, worker.stderr
    assert rows(pg_url, "SELECT agent, status FROM runtime_run ORDER BY id") == [
        ("hello", "succeeded"), ("steps5", "succeeded")]
    assert rows(pg_url, "SELECT count(*) FROM runtime_step WHERE run_id = 2")[0][0] == 6
    assert manage(pg_url, tmp_path, "verifyaudit").returncode == 0
    with pytest.raises(psycopg.errors.RaiseException, match="append-only"):
        rows(pg_url, "UPDATE runtime_event SET actor = 'someone' WHERE id = 1")
    # Migration 0006 dropped the run_id indexes the unique (run, seq)/(run, index) cover.
    indexes = {name for (name,) in rows(
        pg_url, "SELECT indexname FROM pg_indexes WHERE tablename IN "
        "('runtime_event', 'runtime_step')")}
    assert not {"runtime_event_run_id_d25e86d3", "runtime_step_run_id_7d62677f"} & indexes
    assert {"event_run_seq_unique", "step_run_index_unique"} <= indexes


def test_a_killed_workers_side_effect_waits_for_a_person_on_postgres(pg_url, tmp_path):
    queued = manage(pg_url, tmp_path, "startrun", "slowpay")
    run_id = int(queued.stdout.split()[1])
    killed = manage(pg_url, tmp_path, "runworker", "--burst", "--lease-seconds", "30",
                    crash=[{"point": "after_tool_started"}])
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    heir = manage(pg_url, tmp_path, "runworker", "--burst")  # same host: takes over at once
    assert heir.returncode == 0, heir.stderr
    assert rows(pg_url, "SELECT status FROM runtime_run WHERE id = %s", run_id) == [("waiting",)]
    assert rows(pg_url, "SELECT kind, status FROM runtime_approval WHERE run_id = %s",
                run_id) == [("interrupted_side_effect", "pending")]
    reason = rows(pg_url, "SELECT payload->>'reason' FROM runtime_event WHERE run_id = %s "
                  "AND kind = 'lease.taken_over'", run_id)
    assert reason == [("owner proved dead",)]
    assert not (tmp_path / "ledger.jsonl").exists() or "slow_charge" not in (
        tmp_path / "ledger.jsonl").read_text()
    assert manage(pg_url, tmp_path, "verifyaudit").returncode == 0


SKEWED_TAKEOVER = """
import datetime as real, os, django
os.environ["DJANGO_SETTINGS_MODULE"] = "console.settings"
django.setup()
from runtime import clock
class Skewed(real.datetime):  # this machine's clock runs two hours fast
    @classmethod
    def now(cls, tz=None):
        return real.datetime.now(tz) + real.timedelta(hours=2)
clock.datetime = Skewed
from runtime.errors import RunLeased
from runtime.leasing.claims import run_acquire
try:
    run_acquire({run_id}, "skewed@elsewhere:1:x", lease_seconds=30)
    print("taken over")
except RunLeased:
    print("refused")
"""


def test_a_worker_whose_clock_runs_fast_cannot_take_over_a_live_lease(pg_url, tmp_path):
    queued = manage(pg_url, tmp_path, "startrun", "slowpay")
    run_id = int(queued.stdout.split()[1])
    with psycopg.connect(pg_url) as conn:  # a live lease, by the database server's clock
        conn.execute("UPDATE runtime_run SET status = 'running', lease_owner = 'w@a:1:x', "
                     "lease_epoch = 1, lease_expires_at = clock_timestamp() + interval "
                     "'30 seconds' WHERE id = %s", (run_id,))
    env = {**os.environ, "DATABASE_URL": pg_url, "RUNTIME_AGENTS": "tests.agents.AGENTS"}
    done = subprocess.run([sys.executable, "-c", SKEWED_TAKEOVER.format(run_id=run_id)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "refused", done.stdout + done.stderr
    assert rows(pg_url, "SELECT lease_owner FROM runtime_run WHERE id = %s",
                run_id) == [("w@a:1:x",)]
