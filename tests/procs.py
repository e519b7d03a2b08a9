"""Real worker processes for tests: started with their own environment, ended by their pid."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from runtime.testkit.databases import Database, database_url

ROOT = Path(__file__).resolve().parents[1]


class SpawnedWorker:
    """``manage.py runworker`` in a subprocess, its stderr kept in a file. ``db`` is a SQLite
    file (``Path``), a database URL, or a test's ``database``."""

    def __init__(self, db: Database, test_dir: Path, *args: str, env: dict | None = None,
                 tag: str = "worker") -> None:
        self.log_path = test_dir / f"{tag}-{time.monotonic_ns()}.log"
        full_env = {**os.environ, "DATABASE_URL": database_url(db),
                    "RUNTIME_AGENTS": "tests.agents.AGENTS", "RUNTIME_TEST_DIR": str(test_dir),
                    "PYTHONUNBUFFERED": "1", **(env or {})}
        self._log = open(self.log_path, "w")  # noqa: SIM115 - closed in wait()/kill()
        self.proc = subprocess.Popen(
            [sys.executable, "manage.py", "runworker", "-v", "1", *args], cwd=ROOT,
            env=full_env, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.pid = self.proc.pid

    def signal(self, sig: int) -> None:
        os.kill(self.pid, sig)

    def wait(self, timeout: float = 60) -> int:
        try:
            return self.proc.wait(timeout)
        finally:
            self._log.flush()

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.pid, signal.SIGKILL)
            self.proc.wait(10)

    def output(self) -> str:
        self._log.flush()
        return self.log_path.read_text()
