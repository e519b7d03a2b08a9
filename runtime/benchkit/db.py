"""The bench's own database: a fresh SQLite file under ``var/``, never the user's.

Same filesystem as the project's database (so the same disk's flush cost), same PRAGMAs (the
connection options come from settings), migrated, and removed afterwards unless kept.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from django.conf import settings
from django.core.management import call_command
from django.db import connections


def point_default_at(path: Path | str) -> None:
    connections.close_all()
    settings.DATABASES["default"]["NAME"] = str(path)


@contextmanager
def bench_database(keep: bool = False) -> Iterator[Path]:
    """Point Django's default connection at a fresh migrated file in ``var/bench-<pid>/``."""
    default = settings.DATABASES["default"]
    if connections["default"].vendor != "sqlite":
        raise RuntimeError("the bench measures SQLite; DATABASE_URL points elsewhere")
    var = Path(getattr(settings, "VAR_DIR", Path(settings.BASE_DIR) / "var"))
    directory = var / f"bench-{os.getpid()}"
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    path = directory / "bench.sqlite3"
    original = default["NAME"]
    point_default_at(path)
    try:
        call_command("migrate", verbosity=0, interactive=False)
        yield path
    finally:
        connections.close_all()
        settings.DATABASES["default"]["NAME"] = original
        if not keep:
            shutil.rmtree(directory, ignore_errors=True)


def subprocess_env(path: Path) -> dict[str, str]:
    """Environment for a worker subprocess on the bench database with the bench agents."""
    agents = [p for p in os.environ.get("RUNTIME_AGENTS", "").split(",") if p]
    agents.append("runtime.benchkit.agents.AGENTS")
    return {**os.environ, "DATABASE_URL": f"sqlite:///{path}", "RUNTIME_AGENTS": ",".join(agents),
            "PYTHONUNBUFFERED": "1"}
