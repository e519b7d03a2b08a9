"""Whether the database is behind the world: the newest signed checkpoint in
``RUNTIME_CHECKPOINT_DIR`` names chain heads the database no longer has.

A checkpoint records every run's head; events are never removed (except by ``prune``'s own
path, whose runs are finished), so a head that is gone means the database was rolled back:
restored from a backup taken before the checkpoint. Workers refuse to start on it until
``manage.py restore --acknowledge`` fences it; the fence records the newest checkpoint it
acknowledged, and only a newer one is compared again.
"""

from __future__ import annotations

import os
from datetime import datetime
from pathlib import Path
from typing import Any

from runtime.audit.checkpoint import checkpoint_load, checkpoint_verify
from runtime.canonical import parse_time
from runtime.conf import setting
from runtime.errors import CheckpointRefused, DatabaseBehind
from runtime.models import Restoration

SUFFIX = ".checkpoint.json"


def checkpoint_dir() -> Path | None:
    configured = str(setting("CHECKPOINT_DIR") or "")
    return Path(configured) if configured else None


def newest_checkpoint(directory: Path) -> tuple[Path, dict[str, Any]] | None:
    """The newest readable checkpoint in ``directory`` (by the time it records); a file that is
    not one (or signed with another key) raises ``CheckpointRefused``."""
    best: tuple[datetime, Path, dict[str, Any]] | None = None
    try:
        names = sorted(os.listdir(directory))
    except FileNotFoundError:
        return None
    for name in names:
        if not name.endswith(SUFFIX):
            continue
        doc = checkpoint_load(directory / name)
        at = parse_time(doc.get("at"))
        if at is not None and (best is None or at > best[0]):
            best = (at, directory / name, doc)
    return None if best is None else (best[1], best[2])


def acknowledged_until() -> datetime | None:
    """The newest checkpoint the last restore of this database acknowledged, if any."""
    return (Restoration.objects.order_by("-pk").values_list("checkpoint_at", flat=True)
            .first())


def database_behind_check() -> None:
    """Raise ``DatabaseBehind`` when the newest checkpoint is ahead of this database and no
    restore acknowledged it; nothing to compare (no directory, no checkpoint) passes."""
    directory = checkpoint_dir()
    if directory is None:
        return
    found = newest_checkpoint(directory)
    if found is None:
        return
    path, doc = found
    at = parse_time(doc.get("at"))
    seen = acknowledged_until()
    if at is not None and seen is not None and at <= seen:
        return
    problems = list(checkpoint_verify(doc))
    if problems:
        raise DatabaseBehind(str(path), problems)


def newest_checkpoint_time() -> datetime | None:
    """The time of the newest checkpoint in the directory (what a restore acknowledges)."""
    directory = checkpoint_dir()
    if directory is None:
        return None
    try:
        found = newest_checkpoint(directory)
    except CheckpointRefused:
        return None
    return None if found is None else parse_time(found[1].get("at"))
