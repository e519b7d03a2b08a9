"""Which database a kit's processes open: a SQLite file or a database URL, given the way the
caller has it, and whether it is the one this process's default connection uses (the kit reads
and decides in this process, so both must be the same database)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import dj_database_url


@runtime_checkable
class HasURL(Protocol):
    url: str


Database = Path | str | HasURL


def database_url(db: Database) -> str:
    """``DATABASE_URL`` for ``db``: a ``Path`` or a plain path string is a SQLite file; a
    string with a scheme (``postgres://...``, ``sqlite:///...``) is a URL already; anything
    else must carry its URL in a ``url`` attribute."""
    if isinstance(db, HasURL):
        return db.url
    if isinstance(db, str) and "://" in db:
        return db
    return f"sqlite:///{Path(db).resolve()}"


def _identity(config: Mapping[str, Any]) -> tuple[str, str, str, str]:
    engine = str(config.get("ENGINE", ""))
    name = str(config.get("NAME") or "")
    if "sqlite" in engine:
        return ("sqlite", str(Path(name).resolve()) if name else "", "", "")
    family = "postgresql" if "postgres" in engine else engine
    return (family, name, str(config.get("HOST") or "localhost"), str(config.get("PORT") or ""))


def same_database(url: str, config: Mapping[str, Any]) -> bool:
    """True if ``url`` names the database ``config`` (a ``DATABASES`` entry) connects to."""

    mine, theirs = _identity(dj_database_url.parse(url)), _identity(config)
    if mine[0] != theirs[0] or mine[1] != theirs[1]:
        return False
    # a port left out means the default one: compare ports only where both are given
    return mine[2] == theirs[2] and (not mine[3] or not theirs[3] or mine[3] == theirs[3])


def describe(config: Mapping[str, Any]) -> str:
    family, name, host, port = _identity(config)
    return name if family == "sqlite" else f"{family} database {name!r} on {host}:{port}"
