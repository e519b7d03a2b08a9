"""``manage.py chaos``: a short seeded soak in the suite (the long one is for people)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.procs import ROOT


def chaos(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "manage.py", "chaos", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


def figure(out: str, label: str) -> int:
    found = re.search(rf"^{re.escape(label)}\s+(\d+)", out, re.MULTILINE)
    assert found, f"{label!r} missing from:\n{out}"
    return int(found.group(1))


@pytest.mark.slow
def test_a_short_seeded_soak_kills_workers_and_every_invariant_holds(tmp_path):
    done = chaos("--workers", "2", "--runs", "24", "--seconds", "20", "--seed", "11",
                 "--dir", str(tmp_path / "soak"))
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert "chaos: every invariant held" in out
    assert figure(out, "workers SIGKILLed at random moments") >= 1
    assert figure(out, "runs") == 24
    assert figure(out, "duplicates without approval") == 0
    assert figure(out, "invariant violations") == 0
    assert figure(out, '"database is locked" in worker logs') == 0
    assert (tmp_path / "soak" / "chaos.sqlite3").exists()  # --dir keeps the evidence


def test_bad_arguments_are_refused_before_anything_starts(tmp_path):
    done = chaos("--workers", "0", "--dir", str(tmp_path / "soak"))
    assert done.returncode == 1 and "--workers must be at least 1" in done.stderr
    assert not (tmp_path / "soak").exists()
