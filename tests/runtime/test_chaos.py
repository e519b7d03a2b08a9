"""``manage.py chaos``: a short seeded soak in the suite (the long one is for people)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from runtime import start
from runtime.agents.agent import registry
from runtime.models import TERMINAL_RUN_STATUSES, Run
from runtime.testkit.agents import AGENTS
from tests.procs import ROOT


def chaos(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "manage.py", "chaos", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


def figure(out: str, label: str) -> int:
    found = re.search(rf"^{re.escape(label)}\s+(\d+)", out, re.MULTILINE)
    assert found, f"{label!r} missing from:\n{out}"
    return int(found.group(1))


@pytest.mark.slow
@pytest.mark.engines
def test_a_short_seeded_soak_kills_workers_and_every_invariant_holds(database, tmp_path):
    """On SQLite the soak makes its own file in --dir; on PostgreSQL it fills this test's
    fresh database, which this process then reads."""
    on_pg = ("--database-url", database.url) if database.is_postgres else ()
    done = chaos("--workers", "2", "--runs", "24", "--seconds", "20", "--seed", "11",
                 "--dir", str(tmp_path / "soak"), *on_pg)
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert "chaos: every invariant held" in out
    assert figure(out, "workers SIGKILLed at random moments") >= 1
    assert figure(out, "runs") == 24
    assert figure(out, "duplicates without approval") == 0
    assert figure(out, "invariant violations") == 0
    assert figure(out, '"database is locked" in worker logs') == 0
    assert (tmp_path / "soak" / "ledger.jsonl").exists()  # --dir keeps the evidence
    if database.is_sqlite:
        assert (tmp_path / "soak" / "chaos.sqlite3").exists()
    else:  # the evidence is in the database itself, every run ended
        assert Run.objects.count() == 24
        assert not Run.objects.exclude(status__in=TERMINAL_RUN_STATUSES).exists()


@pytest.mark.engines("postgres")
def test_a_soak_refuses_a_database_that_holds_runs(database, tmp_path):
    with registry.override(*AGENTS):
        start("read", {})
    done = chaos("--runs", "1", "--dir", str(tmp_path / "soak"), "--database-url", database.url)
    assert done.returncode == 1 and "already holds runs" in done.stderr
    assert Run.objects.count() == 1


def test_bad_arguments_are_refused_before_anything_starts(tmp_path):
    done = chaos("--workers", "0", "--dir", str(tmp_path / "soak"))
    assert done.returncode == 1 and "--workers must be at least 1" in done.stderr
    assert not (tmp_path / "soak").exists()
    done = chaos("--database-url", f"sqlite:///{tmp_path / 'x.sqlite3'}",
                 "--dir", str(tmp_path / "soak"))
    assert done.returncode == 1 and "takes a PostgreSQL URL" in done.stderr
    assert not (tmp_path / "soak").exists()
