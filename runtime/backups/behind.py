"""Whether the database is behind the world: the newest signed checkpoint in
``RUNTIME_CHECKPOINT_DIR`` names chain heads the database no longer has.

A checkpoint records every run's head; events are never removed (except by ``prune``'s own
path, whose runs are finished), so a head that is gone means the database was rolled back:
restored from a backup taken before the checkpoint. Workers refuse to start on it until
``manage.py restore --acknowledge`` fences it; the fence records the newest checkpoint it
acknowledged, and only a newer one is compared again.
"""

from __future__ import annotations

import logging
import os
from datetime import datetime
from pathlib import Path
from typing import Any

from runtime.audit.checkpoint import checkpoint_load, checkpoint_verify
from runtime.canonical import parse_time
from runtime.conf import setting
from runtime.errors import AuditKeyError, CheckpointRefused, DatabaseBehind
from runtime.models import Restoration

SUFFIX = ".checkpoint.json"
TRIED = 5  # the newest files opened at most, each read whole and its signature checked

log = logging.getLogger("runtime.worker")


def checkpoint_dir() -> Path | None:
    configured = str(setting("CHECKPOINT_DIR") or "")
    return Path(configured) if configured else None


def newest_checkpoint(directory: Path) -> tuple[Path, dict[str, Any]] | None:
    """The newest readable checkpoint in ``directory``: its files named so that they sort by
    time (``backup`` and the documented cron line use ISO times), only the newest few opened.
    A file that is not one, or signed with another key, is logged and passed over."""
    try:
        names = sorted((n for n in os.listdir(directory) if n.endswith(SUFFIX)), reverse=True)
    except FileNotFoundError:
        return None
    for name in names[:TRIED]:
        try:
            return directory / name, checkpoint_load(directory / name)
        except CheckpointRefused as exc:
            log.warning("checkpoint %s passed over: %s", name, exc.reason)
    return None


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
    except AuditKeyError:  # no key here: nothing can be read, nothing acknowledged
        return None
    return None if found is None else parse_time(found[1].get("at"))
