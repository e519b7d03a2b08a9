"""What a PostgreSQL worker process runs beside its runs: its connection pool, lent between
its threads (``pool``), and a ``LISTEN`` that wakes it when a run becomes ready (``listen``)
(``storage.base.WorkerStorage``)."""

from __future__ import annotations

from runtime.storage.postgres.listen import ReadyListener
from runtime.storage.postgres.pool import connection_pool_start


class ListenWatch(ReadyListener):
    """Notifications on the worker's listening connection (``runtime_ready``)."""

    poll_seconds = 1.0  # while the listening connection is down

    def mark(self) -> None:
        """A notification waits on the socket: nothing to note before a claim."""

    def news(self, *, readable: bool, woken: bool, wanted: bool) -> bool:
        # Drained whenever readable, wanted or not: else the socket stays readable.
        return readable and self.drain() and wanted


class PostgresWorkerStorage:
    """A worker's pool (for ``threads`` threads) and its listening connection."""

    def __init__(self, threads: int) -> None:
        self.threads = threads
        self.watch = ListenWatch()

    def start(self) -> None:
        connection_pool_start(self.threads)

    def stop(self) -> str:
        self.watch.close()
        return ""
