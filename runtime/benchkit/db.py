"""The bench's own database: a fresh SQLite file under ``var/``, never the user's.

Same filesystem as the project's database (so the same disk's flush cost), same PRAGMAs (the
connection options come from settings), migrated, and removed afterwards unless kept.
"""

from __future__ import annotations

import contextlib
import copy
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.contenttypes.models import ContentType
from django.core.management import call_command
from django.db import DEFAULT_DB_ALIAS, connections

from runtime.storage import protocol


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


def subprocess_env(db: Path | str) -> dict[str, str]:
    """Environment for a worker subprocess on the bench database (a SQLite file, or a URL)
    with the bench agents."""
    agents = [p for p in os.environ.get("RUNTIME_AGENTS", "").split(",") if p]
    agents.append("runtime.benchkit.agents.AGENTS")
    url = db if isinstance(db, str) and "://" in db else f"sqlite:///{db}"
    return {**os.environ, "DATABASE_URL": url, "RUNTIME_AGENTS": ",".join(agents),
            "PYTHONUNBUFFERED": "1"}


def use_database(config: dict[str, Any]) -> None:
    """Point Django's default connection at ``config``, on this thread and on every thread that
    opens a connection afterwards. The dict is replaced in place because the connection handler
    holds it; this thread's wrapper is dropped because its class belongs to the old engine."""
    connections.close_all()
    db = connections[DEFAULT_DB_ALIAS]
    if DEFAULT_DB_ALIAS in getattr(type(db), "_connection_pools", {}):
        # Django keeps a pool per alias, not per database: it goes with it. (PostgreSQL's
        # close_pool, Django 5.1, is not in django-stubs.)
        db.close_pool()  # type: ignore[attr-defined]
    with contextlib.suppress(AttributeError):  # no wrapper made on this thread yet
        del connections[DEFAULT_DB_ALIAS]
    conf = settings.DATABASES[DEFAULT_DB_ALIAS]
    conf.clear()
    conf.update(copy.deepcopy(config))
    connections.configure_settings({DEFAULT_DB_ALIAS: conf})  # Django's defaults, in place

    ContentType.objects.clear_cache()  # ids differ between databases migrated apart
    protocol.forget()


def sqlite_config(path: Path) -> dict[str, Any]:
    """Settings for a SQLite file opened as the runtime opens its own (its backend, the
    project's PRAGMAs from ``settings.SQLITE_OPTIONS``)."""
    return {"ENGINE": "runtime.storage.sqlite", "NAME": str(path),
            "OPTIONS": dict(getattr(settings, "SQLITE_OPTIONS", {}))}
