"""One CPU for a worker process (``runworker --cpu``).

A worker's threads take turns on one interpreter lock, and each step hands it between them
many times (every SQLite call lets go of it, every commit wakes the threads whose plans it
carried). Handing it to a thread waiting on another CPU means waking that CPU and moving the
lock's cache lines across: measured on the 2-CPU VM with 16 runs in flight and no LLM wait, a
worker confined to one CPU did 1,410-1,440 steps/s against 985-1,030 left free (CPU per step
0.67 against 1.0 ms), and one run in flight gained 10%. A busy worker uses about one CPU
anyway, so confining it costs little; two workers confined to the *same* CPU would halve each
other, so ``auto`` takes a CPU no other worker of this host holds, by an exclusive ``flock``
on a file per CPU (the kernel drops it when the process dies), and stays unconfined when none
is free.

The lock files live in one directory per user under the system's temporary directory, so
workers in separate containers (separate ``/tmp``) cannot see each other's claims: give each
container its own CPUs (its CPU set) or name the CPU (``--cpu N``), or leave ``--cpu off``.
"""

from __future__ import annotations

import fcntl
import logging
import os
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from runtime.host import files

log = logging.getLogger("runtime.worker")


def lock_directory() -> Path:
    """Where this host's workers (of this user) claim their CPUs."""
    return Path(tempfile.gettempdir()) / f"agent-runtime-cpus-{os.getuid()}"


@dataclass
class Pinned:
    """The CPU a worker runs on, and the lock file descriptor that claims it (``auto``)."""

    cpu: int
    fd: int | None = None

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing drops the flock
            self.fd = None


def parse_cpu(text: str) -> str | int:
    """``--cpu``'s value: "auto", "off", or a CPU number this process may use; ValueError
    otherwise."""
    value = text.strip().lower()
    if value in ("auto", "off"):
        return value
    if not value.isdigit() or len(value) > 6:
        raise ValueError(f"--cpu takes auto, off or a CPU number, not {text[:40]!r}")
    return _allowed(int(value), os.sched_getaffinity(0))


def _allowed(cpu: int, allowed: set[int]) -> int:
    if cpu not in allowed:
        raise ValueError(f"--cpu {cpu}: not a CPU this process may use (it may use "
                         f"{', '.join(map(str, sorted(allowed)))})")
    return cpu


def cpu_claim(allowed: Iterable[int], directory: Path) -> Pinned | None:
    """The first of ``allowed`` that no other process holds, claimed by an exclusive flock
    on ``directory``/cpu-N kept open; None when every one is held."""
    files.private_dir(directory)
    for cpu in sorted(allowed):
        fd = files.open_private(directory / f"cpu-{cpu}")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        except BaseException:
            os.close(fd)
            raise
        return Pinned(cpu, fd)
    return None


def cpu_pin(choice: str | int, *, directory: Path | None = None) -> Pinned | None:
    """Confine the calling thread, and every thread it starts from now on, to one CPU; call
    it before the worker starts its threads. ``off``: nothing (None). ``auto``: a CPU no
    other worker of this host holds (None, unconfined, when all are held or only one is
    allowed). A number: that CPU, which must be among the allowed (ValueError otherwise)."""
    if choice == "off":
        return None
    allowed = os.sched_getaffinity(0)
    if isinstance(choice, int):
        pinned = Pinned(_allowed(choice, allowed))
    elif len(allowed) < 2:
        return None  # one CPU already
    else:
        found = cpu_claim(allowed, directory or lock_directory())
        if found is None:
            log.warning("every CPU is held by another worker: this one runs unconfined")
            return None
        pinned = found
    try:
        os.sched_setaffinity(0, {pinned.cpu})
    except BaseException:
        pinned.release()
        raise
    return pinned
