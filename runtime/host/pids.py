"""Facts about processes on this host, for same-host instant takeover of a dead owner's runs.

A lease owner is provably dead when it ran on this host, in this boot, and its pid is gone,
a zombie, or now belongs to a process that started at a different time.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
from functools import cache
from pathlib import Path


@cache
def boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def hostname() -> str:
    return socket.gethostname()


def process_start(pid: int) -> int | None:
    """Start time of ``pid`` in clock ticks since boot; None if no live process has it."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (OSError, ValueError):
        return None
    fields = stat[stat.rindex(")") + 2:].split()
    if fields[0] in ("Z", "X"):  # exited, not yet reaped: it will never write again
        return None
    return int(fields[19])


def own_process_start() -> int | None:
    return process_start(os.getpid())


def parse_owner(owner: str) -> tuple[str, int] | None:
    """(host, pid) from an owner id ``name@host:pid:random``; None if it is not one."""
    try:
        _, rest = owner.rsplit("@", 1)
        host, pid, _random = rest.rsplit(":", 2)
        return host, int(pid)
    except ValueError:
        return None


def owner_provably_dead(owner: str, *, boot: str, proc_start: int | None) -> bool:
    """True only with proof: same host and boot, and the owner's process no longer exists."""
    parsed = parse_owner(owner)
    if parsed is None or proc_start is None or not boot:
        return False
    host, pid = parsed
    if host != hostname() or boot != boot_id():
        return False
    if pid == os.getpid():
        return False  # this very process: its own threads are not dead
    return process_start(pid) != proc_start


def die_with_parent() -> None:
    """For ``subprocess.Popen(preexec_fn=...)``: the child gets SIGTERM when the process that
    started it dies, even by SIGKILL (Linux ``PR_SET_PDEATHSIG``), so a supervisor that is
    killed leaves no workers behind. Elsewhere it does nothing."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
