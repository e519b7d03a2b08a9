"""The disk's ceiling: synced commits per second with plain sqlite3, nothing else.

Same directory (so the same filesystem and disk) and the same PRAGMAs as the runtime's database:
WAL, synchronous=FULL, BEGIN IMMEDIATE, one small-row INSERT per transaction.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def scratch(path: Path) -> Iterator[sqlite3.Connection]:
    """A plain sqlite3 connection to ``path`` with the runtime's PRAGMAs (WAL,
    synchronous=FULL, foreign keys); the file and its WAL are removed afterwards."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("PRAGMA foreign_keys=ON")
        yield conn
    finally:
        conn.close()
        for suffix in ("", "-wal", "-shm"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)


def ceiling(directory: Path, seconds: float) -> float:
    """Commits per second sustained for ``seconds`` on a scratch file in ``directory``."""
    with scratch(directory / "ceiling.sqlite3") as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS t (id INTEGER PRIMARY KEY, v TEXT NOT NULL)")
        n, start = 0, time.perf_counter()
        while True:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("INSERT INTO t (v) VALUES (?)", ("step.tool_finished",))
            conn.execute("COMMIT")
            n += 1
            elapsed = time.perf_counter() - start
            if elapsed >= seconds:
                return n / elapsed
