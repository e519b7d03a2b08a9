"""runtime.testkit.partition: the partition soak (``manage.py chaos --hosts``), in a short
seeded form; ``make partition-soak`` runs the long one."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from runtime.testkit.partition import FAULTS
from tests.procs import ROOT

# Real processes on hosts of their own (network namespaces, a PostgreSQL server each):
# slow, and one machine-wide resource, so they never run beside each other.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("machine")]


def test_a_short_seeded_partition_soak_injects_every_fault_and_every_invariant_holds(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "chaos", "--hosts", "3", "--runs", "120",
         "--seconds", "60", "--seed", "3", "--tool-seconds", "0.5", "--dir",
         str(tmp_path / "soak")],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "partition soak: every invariant held" in out
    faults = dict((k, int(v)) for k, v in re.findall(
        r"([a-z-]+) (\d+)", out.split("faults injected")[1]
        .splitlines()[0]))
    assert set(faults) == set(FAULTS), out  # each kind is dealt once before any repeats
    assert re.search(r"duplicates without approval\s+0\n", out)
    assert re.search(r"invariant violations\s+0\n", out)
    taken = re.search(r"takeovers\s+(.+)\n", out)[1]
    assert sum(int(n) for n in re.findall(r"(\d+)", taken)) > 0, taken  # leases were taken
    side = int(re.search(r"side-effect executions counted outside\s+(\d+)", out)[1])
    assert side > 0


def test_partition_soak_arguments_are_refused_before_anything_starts():
    for args, says in ((["--faults", "flood"], "--faults takes some of"),
                       (["--hosts", "1"], "--hosts must be at least 2")):
        proc = subprocess.run([sys.executable, str(ROOT / "manage.py"), "chaos", "--hosts", "3",
                               *args], cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert proc.returncode != 0 and says in proc.stderr, proc.stderr
