"""The runtime's system checks, run by ``manage.py check`` and by every command before it starts
(``runworker``, ``migrate``, ``demo``, ...):

- ``runtime.W001``: a file or directory that must be private is open to the group or to other
  accounts: ``var/``, ``var/secret_key``, and each SQLite database with its ``-wal``, ``-shm``,
  ``-journal`` and ``.writer`` lock. The runtime creates them 0600/0700 but never changes the
  mode of one that exists (runtime/files.py); the hint gives the ``chmod`` that fixes it.
- ``runtime.E001``: a SQLite database is on a network file system; the backend would refuse to
  open it anyway, this says so before anything starts.
- ``runtime.E002``: ``settings.RUNTIME`` holds a key the runtime does not know, or a value it
  does not accept (``runtime.conf``).
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, register
from django.core.checks import Warning as CheckWarning

from runtime import conf
from runtime.host import files

# Django's SQLite backend, and the runtime's own (runtime.storage.sqlite), by their ENGINE.
SQLITE_ENGINES = ("sqlite3", "runtime.storage.sqlite")


def sqlite_databases(databases: Mapping[str, Mapping[str, Any]]) -> list[Path]:
    """The files of the SQLite databases among ``databases`` (settings.DATABASES's shape)."""
    paths = []
    for config in databases.values():
        if str(config.get("ENGINE", "")).endswith(SQLITE_ENGINES):
            path = files.database_path(config.get("NAME"))
            if path is not None:
                paths.append(path)
    return paths


def private_paths(databases: Mapping[str, Mapping[str, Any]],
                  var_dir: str | Path | None) -> list[Path]:
    """What must not be open to other accounts: ``var/``, its secret key, each SQLite database
    and its companion files (those that exist are checked)."""
    paths = []
    if var_dir:
        paths += [Path(var_dir), Path(var_dir) / "secret_key"]
    for database in sqlite_databases(databases):
        paths += files.sqlite_files(database)
    return list(dict.fromkeys(paths))


def loose_mode_warnings(paths: Iterable[Path]) -> list[CheckMessage]:
    warnings: list[CheckMessage] = []
    for path in paths:
        mode = files.loose_mode(path)
        if mode is None:
            continue
        who = " and ".join(w for w, bits in (("its group", 0o070), ("every other account",
                                                                      0o007)) if mode & bits)
        wanted = files.PRIVATE_DIR if path.is_dir() else files.PRIVATE_FILE
        warnings.append(CheckWarning(
            f"mode {mode:04o}: open to {who}; it should be {wanted:04o}.",
            hint=("Whoever can read the database or the secret key can take over the console "
                  "(its sessions, the signing key) and read every run. The runtime creates "
                  "these private but leaves an existing file's mode alone. Fix: "
                  f"chmod go-rwx {shlex.quote(str(path))}"),
            obj=str(path), id="runtime.W001"))
    return warnings


def network_filesystem_errors(databases: Mapping[str, Mapping[str, Any]],
                              **kwargs: Any) -> list[CheckMessage]:
    errors: list[CheckMessage] = []
    for path in sqlite_databases(databases):
        try:
            files.refuse_network_filesystem(path, **kwargs)
        except files.NetworkFilesystemError as exc:
            errors.append(Error(str(exc), obj=str(path), id="runtime.E001"))
    return errors


@register(Tags.security, "runtime")
def check_private_files(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    return loose_mode_warnings(private_paths(settings.DATABASES,
                                             getattr(settings, "VAR_DIR", None)))


@register("runtime")
def check_sqlite_filesystem(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    return network_filesystem_errors(settings.DATABASES)


@register("runtime")
def check_runtime_settings(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    return [Error(line, id="runtime.E002")
            for line in conf.runtime_problems(getattr(settings, "RUNTIME", {}))]
