"""``runworker --cpu``: one CPU per worker process, claimed so two workers never share one."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import threading

import pytest
from django.core.management import CommandError, call_command

from runtime.host.cpu import cpu_claim, cpu_pin, parse_cpu


def test_cpu_values_are_auto_off_or_a_number_and_anything_else_is_refused():
    cpu = max(os.sched_getaffinity(0))
    assert (parse_cpu("auto"), parse_cpu(" OFF "), parse_cpu(str(cpu))) == ("auto", "off", cpu)
    for bad in ("", "-1", "1.5", "x", "1,2", "9" * 20):
        with pytest.raises(ValueError, match="--cpu takes auto, off or a CPU number"):
            parse_cpu(bad)


def test_each_claim_takes_a_cpu_no_other_holds_and_a_release_frees_it(tmp_path):
    first = cpu_claim([1, 0], tmp_path)
    second = cpu_claim([1, 0], tmp_path)
    assert (first.cpu, second.cpu) == (0, 1)
    assert cpu_claim([0, 1], tmp_path) is None  # both held
    first.release()
    again = cpu_claim([0, 1], tmp_path)
    assert again.cpu == 0
    assert oct(os.stat(tmp_path / "cpu-0").st_mode & 0o777) == "0o600"
    again.release()
    second.release()


def test_a_cpu_held_by_another_process_is_skipped_and_freed_when_it_dies(tmp_path):
    tmp_path.joinpath("cpu-0").touch(mode=0o600)
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDWR); "
         "fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); sys.stdin.read()",
         str(tmp_path / "cpu-0")], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        other = cpu_claim([0, 1], tmp_path)
        assert other.cpu == 1
        other.release()
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(10)
    freed = cpu_claim([0, 1], tmp_path)
    assert freed.cpu == 0
    fd = os.open(tmp_path / "cpu-0", os.O_RDWR)
    try:
        with pytest.raises(BlockingIOError):  # the claim holds it now
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(fd)
        freed.release()


def _in_thread(fn):
    """Run ``fn`` on a thread of its own (pinning changes the calling thread only)."""
    out: dict = {}

    def body():
        try:
            out["value"] = fn()
        except BaseException as exc:  # handed to the test
            out["error"] = exc

    t = threading.Thread(target=body)
    t.start()
    t.join(30)
    if "error" in out:
        raise out["error"]
    return out["value"]


def test_pinning_confines_the_thread_and_the_threads_it_starts_to_the_cpu(tmp_path):
    allowed = os.sched_getaffinity(0)
    target = max(allowed)

    def pin_then_look():
        pinned = cpu_pin(target, directory=tmp_path)
        child: dict = {}
        t = threading.Thread(target=lambda: child.update(mask=os.sched_getaffinity(0)))
        t.start()
        t.join(10)
        return pinned.cpu, os.sched_getaffinity(0), child["mask"]

    assert _in_thread(pin_then_look) == (target, {target}, {target})
    assert os.sched_getaffinity(0) == allowed  # this thread untouched
    assert _in_thread(lambda: cpu_pin("off", directory=tmp_path)) is None


def test_auto_takes_a_free_cpu_or_stays_unconfined_when_none_is(tmp_path):
    allowed = os.sched_getaffinity(0)
    assert len(allowed) >= 2, "the machine has one CPU: nothing for auto to choose"
    held = [cpu_claim(allowed, tmp_path) for _ in allowed]
    try:
        assert _in_thread(lambda: (cpu_pin("auto", directory=tmp_path),
                                   os.sched_getaffinity(0))) == (None, allowed)
        held.pop().release()
        pinned, mask = _in_thread(lambda: (cpu_pin("auto", directory=tmp_path),
                                           os.sched_getaffinity(0)))
        assert mask == {pinned.cpu}
        pinned.release()
    finally:
        for h in held:
            h.release()


def test_runworker_refuses_a_bad_cpu_before_doing_anything():
    with pytest.raises(CommandError, match="--cpu takes auto, off or a CPU number"):
        call_command("runworker", "--burst", "--cpu", "two")
    with pytest.raises(CommandError, match="not a CPU this process may use"):
        call_command("runworker", "--burst", "--cpu", str(max(os.sched_getaffinity(0)) + 1))
