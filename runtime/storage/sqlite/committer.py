"""The SQLite committer: a plan's statements prepared before the write lock, run between a lean
``BEGIN IMMEDIATE`` and ``COMMIT``, with the lease judged by the clock read inside it. The plans
of a process's runs in flight are written in groups, one transaction and one sync for all that
are waiting (``runtime.storage.sqlite.group``)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any, cast

from django.db import DEFAULT_DB_ALIAS, connections, transaction
from django.db.models import DateTimeField, Value

from runtime import crashpoints
from runtime.crashpoints import CrashPoint
from runtime.storage.approval_rows import write_approvals_in_tx
from runtime.storage.base import Committed, Refused, commit_each, fill
from runtime.storage.events import build_events
from runtime.storage.guards import standing_check_in_tx
from runtime.storage.leases import lease_live_sql
from runtime.storage.plan import Plan
from runtime.storage.sql import (
    EVENT_COLUMNS,
    STEP_COLUMNS,
    STEP_INSERT,
    Dialect,
    cached,
    event_params,
    run_update,
    step_insert_params,
    step_update,
)
from runtime.storage.sqlite.background import SqliteWorkerStorage
from runtime.storage.sqlite.base import DatabaseWrapper as QueuedSQLite
from runtime.storage.sqlite.base import absolute
from runtime.storage.sqlite.group import Ticket, group_committer


class SqliteDialect(Dialect):
    vendor = "sqlite"

    def __init__(self, db: Any) -> None:
        super().__init__(db_clock=False)
        self.db = db

    def decimal_add(self, column: str) -> str:  # what the ORM writes for a DecimalField sum
        return f'"{column}" = CAST(("{column}" + CAST(%s AS NUMERIC)) AS NUMERIC)'

    def time(self, at: datetime) -> Any:
        return db_datetime(self.db, at)

    def finish(self, sql: str) -> str:
        return sql.replace("%s", "?")


_adapted: list[Any] = [None, None]  # the last datetime adapted and its text


def db_datetime(db: Any, at: datetime | None) -> str | None:
    """``at`` as the SQLite backend stores it; the last one is remembered (a commit writes the
    same time into every event and the run row)."""
    if at is None:
        return None
    last, text = _adapted
    if at is not last:
        if at.tzinfo is UTC and db.timezone is UTC:  # what the backend does, without its steps
            text = str(at.replace(tzinfo=None))
        else:
            text = db.ops.adapt_datetimefield_value(at)
        _adapted[:] = [at, text]
    return text


def execute(db: Any, sql: str, params: Any) -> Any:
    """Run one prepared statement on ``db`` (this thread's connection); the sqlite3 cursor."""
    if db.connection is None:
        db.ensure_connection()
    with db.wrap_database_errors:
        return db.connection.execute(sql, params)


def groups(db: Any) -> bool:
    """Whether ``db``'s commits may join a group: the runtime's backend on a file, outside
    any atomic block (a commit inside one is the caller's transaction)."""
    return (isinstance(db, QueuedSQLite) and not db.in_atomic_block
            and not db.is_in_memory_db())


class _GroupTx:
    """A group's write transaction on this thread's connection: statements, and the events of
    a pass written by one INSERT at its end (``runtime.storage.sqlite.group``)."""

    def __init__(self, db: Any) -> None:
        self.db, self.deferring = db, False
        self.rows: list[list[Any]] = []  # each plan's event parameters, 8 per row

    def execute(self, sql: str) -> Any:
        return execute(self.db, sql, ())

    def defer(self, params: list[Any]) -> None:
        self.rows.append(params)

    def flush(self) -> None:
        params = [p for plan in self.rows for p in plan]
        self.rows = []
        for start in range(0, len(params), EVENTS_PER_INSERT * 8):
            chunk = params[start:start + EVENTS_PER_INSERT * 8]
            execute(self.db, _events_insert(self.db, len(chunk) // 8), chunk)

    def discard(self) -> None:
        self.rows = []


EVENTS_PER_INSERT = 500  # 4,000 parameters: well inside SQLite's limit of 32,766


def _events_insert(db: Any, n: int) -> str:
    return cached(SqliteDialect(db), ("events", n), lambda: (
        f'INSERT INTO "runtime_event" ({", ".join(EVENT_COLUMNS)}) VALUES '
        + ",".join(["(" + ",".join(["%s"] * 8) + ")"] * n)))


@contextmanager
def _group_transaction() -> Iterator[_GroupTx]:
    """A group's write transaction on this thread's connection."""
    db = cast(QueuedSQLite, connections[DEFAULT_DB_ALIAS])  # only where groups() holds
    with db.write_transaction():
        yield _GroupTx(db)


def write_transaction(*, lean: bool = True) -> Any:
    """``transaction.atomic()``; if ``lean`` (nothing inside saves through the ORM), on the
    runtime's SQLite backend outside any atomic block, its leaner ``write_transaction()``
    (the same BEGIN IMMEDIATE, COMMIT and rollback)."""
    db = connections[DEFAULT_DB_ALIAS]
    if lean and isinstance(db, QueuedSQLite) and not db.in_atomic_block:
        return db.write_transaction()
    return transaction.atomic()


class SqliteEngine:
    vendor = "sqlite"
    locks_rows = False  # one writer: a claim reads outside the lock, its fence decides
    groups_commits = True  # a worker's runs in flight commit together (one sync)

    def commit(self, plan: Plan, clock: Any) -> Committed:
        db = connections[DEFAULT_DB_ALIAS]
        prepared = None if plan.approval_create else self._prepare(db, plan)
        lean = not plan.in_orm
        if lean and groups(db):  # applied on the leader's thread, with its connection
            committer = group_committer(absolute(db.settings_dict["NAME"]))
            return committer.commit(Ticket(plan, partial(self._apply_here, plan, clock,
                                                         prepared)), _group_transaction)
        with write_transaction(lean=lean):
            return self._apply(db, plan, clock, prepared)

    def commit_many(self, plans: list[Plan], clock: Any) -> list[Committed | BaseException]:
        """Every plan in the group being formed (a savepoint each when one fails, one sync),
        with whatever the process's runs commit meanwhile; each plan's result or error
        (``Refused`` where its fence no longer holds)."""
        db = connections[DEFAULT_DB_ALIAS]
        if not groups(db) or any(p.in_orm for p in plans):
            return commit_each(self, plans, clock)  # inside the caller's transaction
        tickets = [Ticket(plan, partial(self._apply_here, plan, clock, self._prepare(db, plan)))
                   for plan in plans]
        group_committer(absolute(db.settings_dict["NAME"])).commit_all(
            tickets, _group_transaction)
        return [t.error if t.error is not None else t.value for t in tickets]

    def _apply_here(self, plan: Plan, clock: Any, prepared: tuple | None,
                    tx: _GroupTx) -> Committed:
        return self._apply(tx.db, plan, clock, prepared, tx)  # the leader's connection

    def apply_in_tx(self, plan: Plan, clock: Any) -> Committed:
        db = connections[DEFAULT_DB_ALIAS]
        return self._apply(db, plan, clock, None)

    @contextmanager
    def transaction(self) -> Iterator[None]:
        with write_transaction(lean=True):
            yield

    one_write = transaction

    def _prepare(self, db: Any, plan: Plan) -> tuple:
        """The commit's chain and every statement with its parameters, built before the lock."""
        d = SqliteDialect(db)
        rows, seq, head = build_events(plan.run_id, plan.fence.seq, plan.head, plan.events,
                                       plan.actor, plan.at)
        run = run_update(d, plan, seq, head)
        inserts = [(s, step_insert_params(d, s)) for s in plan.step_inserts]
        updates = [(s, step_update(d, s, f)) for s, f in plan.step_updates.values()]
        events = _events_insert(db, len(rows))
        return d, rows, seq, head, run, inserts, updates, events, event_params(d, rows)

    def _apply(self, db: Any, plan: Plan, clock: Any, prepared: tuple | None,
               tx: _GroupTx | None = None) -> Committed:
        now = clock.now()  # inside the transaction: a time read before the lock is stale
        if plan.standing is not None:
            standing_check_in_tx(plan, lock=False)  # the write lock keeps every writer out
        if plan.approval_create is not None or plan.approval_moves:
            write_approvals_in_tx(plan)
        if prepared is None:
            prepared = self._prepare(db, plan)
        d, rows, seq, head, run, inserts, updates, events, event_values = prepared
        if execute(db, run.sql, fill(run.params, now, d.time, run.marks)).rowcount != 1:
            raise Refused()
        if inserts:
            sql = cached(d, ("step+",), lambda: (
                f'INSERT INTO "runtime_step" ({", ".join(_STEP_INSERT_COLUMNS)}) VALUES '
                f'({", ".join(["%s"] * len(STEP_INSERT))})'))
            for step, params in inserts:
                step.pk = execute(db, sql, params).lastrowid
                step._state.adding, step._state.db = False, db.alias
        for step, stmt in updates:
            execute(db, stmt.sql, [*stmt.params[:-1], step.pk])  # the id as it is now
        if tx is not None and tx.deferring:
            tx.defer(event_values)  # one INSERT for the group's events, at the end of its pass
        else:
            execute(db, events, event_values)
        crashpoints.reached(CrashPoint.IN_TRANSACTION, run_id=plan.run_id,
                            step_index=plan.last_step_index())
        expires = now + timedelta(seconds=plan.take.seconds) if plan.take else None
        return Committed(rows, seq, head, expires)

    def renew(self, leases: list[Any], seconds: float, clock: Any) -> dict[tuple, datetime]:
        """Extend every lease still held and unexpired, in one statement; the renewed ones."""
        db = connections[DEFAULT_DB_ALIAS]
        d = SqliteDialect(db)
        marks = ", ".join(["(?, ?, ?)"] * len(leases))
        sql = ('UPDATE "runtime_run" SET "lease_expires_at" = ? WHERE "status" = \'running\' '
               f'AND {lease_live_sql("?")} AND ("id", "lease_epoch", "lease_owner") IN '
               f'(VALUES {marks}) RETURNING "id", "lease_epoch", "lease_owner"')
        with write_transaction(lean=True):
            now = clock.now()
            expires = now + timedelta(seconds=seconds)
            params: list[Any] = [d.time(expires), d.time(now)]
            for lease in leases:
                params += [lease.run_id, lease.epoch, lease.owner]
            found = execute(db, sql, params).fetchall()
        return dict.fromkeys(map(tuple, found), expires)

    def select(self, sql: str, params: list[Any]) -> list[tuple]:
        """The rows of a read the runtime built (``%s`` placeholders), straight from the
        driver: a worker claims once or more per finished run."""
        db = connections[DEFAULT_DB_ALIAS]
        return execute(db, sql.replace("%s", "?"), params).fetchall()

    def now_expression(self, clock: Any) -> Any:
        return Value(clock.now(), DateTimeField())

    def dialect(self, clock: Any) -> SqliteDialect:
        return SqliteDialect(connections[DEFAULT_DB_ALIAS])

    def notify_ready(self) -> None:
        """Idle workers see other connections' commits in ``PRAGMA data_version``."""

    def worker_storage(self, threads: int) -> SqliteWorkerStorage:
        return SqliteWorkerStorage()


_STEP_INSERT_COLUMNS = [f'"{STEP_COLUMNS[n][0]}"' for n in STEP_INSERT]
