"""PostgreSQL over a network that can fail: connection options that bound how long any wait on
a dead link lasts.

Without them a worker whose host is cut off the database waits in TCP's retransmissions for
many minutes (``tcp_retries2``) on a statement that will never be answered, and after the link
heals it may wait a further backoff before noticing; an idle connection (the ``LISTEN`` one)
never notices at all; and a transaction whose client vanished between two statements keeps its
row locks on the server for as long as the server's keepalive allows (two hours by default),
where no other worker can take the run over. With them, every wait on the network is bounded by
``timeout`` seconds: the statement fails with a database error, the worker rides it out
(``runtime.worker.process``) and reconnects once the link is back, and the server ends the orphaned
transaction.

A worker takes its connections from a pool (:func:`with_pool`, ``RUNTIME_PG_POOL_SIZE``, 20
by default): with more threads than that, its runs give their connection back before they
wait on anything but the database (``runtime.leasing.lease``), so ``runworker --concurrency 256``
needs the few connections its runs use at one moment, not one per run (PostgreSQL's default
``max_connections`` is 100).

Plain data, no Django: settings modules call :func:`with_network_options` on a ``DATABASES``
entry (``RUNTIME_PG_NETWORK_TIMEOUT`` seconds; the variables are declared in ``runtime.conf``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from runtime import conf
from runtime.conf import BY_NAME, PG_NETWORK_TIMEOUTS, PG_POOL_MAX

DEFAULT_TIMEOUT: float = BY_NAME["RUNTIME_PG_NETWORK_TIMEOUT"].default
MIN_TIMEOUT, MAX_TIMEOUT = PG_NETWORK_TIMEOUTS
DEFAULT_POOL_SIZE: int = BY_NAME["RUNTIME_PG_POOL_SIZE"].default
MAX_POOL_SIZE = PG_POOL_MAX


def postgres_network_options(options: Mapping[str, Any] | None = None,
                             timeout: float = DEFAULT_TIMEOUT) -> dict[str, Any]:
    """``options`` (a ``DATABASES`` entry's ``OPTIONS``) with the network bounds added where it
    does not set them itself: a connect timeout, TCP keepalives that find a dead peer of an
    idle connection in about ``timeout`` seconds, ``tcp_user_timeout`` (data unacknowledged
    that long ends the connection) and, on the server, ``idle_in_transaction_session_timeout``
    and keepalives of its own."""
    if not MIN_TIMEOUT <= timeout <= MAX_TIMEOUT:
        raise ValueError(f"the PostgreSQL network timeout must be between {MIN_TIMEOUT:g} and "
                         f"{MAX_TIMEOUT:g} seconds, not {timeout:g}")
    merged = dict(options or {})
    seconds = int(timeout)
    idle, interval = max(1, seconds // 3), max(1, seconds // 6)
    for key, value in (("connect_timeout", max(2, seconds)), ("keepalives", 1),
                       ("keepalives_idle", idle), ("keepalives_interval", interval),
                       ("keepalives_count", 3), ("tcp_user_timeout", seconds * 1000)):
        merged.setdefault(key, value)
    server = merged.get("options", "")
    for name, text in (("idle_in_transaction_session_timeout", f"{seconds * 1000}"),
                       ("tcp_keepalives_idle", f"{idle}"),
                       ("tcp_keepalives_interval", f"{interval}"),
                       ("tcp_keepalives_count", "3")):
        if name not in server:
            server = f"{server} -c {name}={text}".strip()
    merged["options"] = server
    return merged


def network_timeout(environ: Mapping[str, str] = os.environ) -> float:
    """``RUNTIME_PG_NETWORK_TIMEOUT`` (seconds), or the default (``runtime.conf``)."""
    return float(conf.value("RUNTIME_PG_NETWORK_TIMEOUT", environ))


def with_network_options(config: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
    """A ``DATABASES`` entry with the network bounds in its ``OPTIONS`` if it is PostgreSQL
    (options already there win), unchanged otherwise."""
    if "postgresql" not in config.get("ENGINE", ""):
        return config
    chosen = network_timeout() if timeout is None else timeout
    return {**config, "OPTIONS": postgres_network_options(config.get("OPTIONS"), chosen)}


def pool_size(environ: Mapping[str, str] = os.environ) -> int:
    """``RUNTIME_PG_POOL_SIZE``: the most connections a worker process opens (0: no pool, a
    connection per thread; ``runtime.conf``)."""
    return int(conf.value("RUNTIME_PG_POOL_SIZE", environ))


def with_pool(config: dict[str, Any], size: int | None = None,
              timeout: float | None = None) -> dict[str, Any]:
    """A PostgreSQL ``DATABASES`` entry whose connections come from Django's pool of at most
    ``size`` (a thread waits up to ``timeout`` seconds for one, then gets a database error);
    unchanged if it is not PostgreSQL, sets ``pool`` itself, keeps connections open between
    requests (``CONN_MAX_AGE``, which a pool replaces), or ``size`` is 0."""
    if "postgresql" not in config.get("ENGINE", ""):
        return config
    size = pool_size() if size is None else size
    options = config.get("OPTIONS") or {}
    if size == 0 or "pool" in options or config.get("CONN_MAX_AGE", 0) != 0:
        return config
    wait = network_timeout() if timeout is None else timeout
    pool = {"min_size": 1, "max_size": size, "timeout": wait}
    return {**config, "OPTIONS": {**options, "pool": pool}}


def pool_capacity(config: dict[str, Any]) -> int | None:
    """The most connections a ``DATABASES`` entry's pool opens (``None``: no pool), by
    psycopg_pool's own defaults where the entry leaves them out (``max_size`` = ``min_size`` =
    4)."""
    pool = (config.get("OPTIONS") or {}).get("pool")
    if not pool:
        return None
    options = pool if isinstance(pool, dict) else {}
    return options.get("max_size") or options.get("min_size", 4)
