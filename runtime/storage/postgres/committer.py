"""The PostgreSQL committer: a plan is one statement of data-modifying CTEs, sent on Django's
own psycopg connection in autocommit, so a commit costs one round trip.

The run's compare-and-set is the first CTE; every other write reads from it (``FROM r`` or
``EXISTS (SELECT 1 FROM r)``), so when the fence refuses, nothing at all is written. Leases are
judged by ``clock_timestamp()`` inside that statement: the server's clock, at the moment the
fence is evaluated (after any row lock it waited for), never a time read earlier. A plan that
moves approvals (rare: a pause, a consumption) runs in a transaction with them instead.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from django.db import DEFAULT_DB_ALIAS, connections, transaction
from django.db.models import CharField, DateTimeField, Func, TextField, Value

from runtime import crashpoints
from runtime.crashpoints import CrashPoint
from runtime.models import Event, Step
from runtime.storage.approval_rows import write_approvals_in_tx
from runtime.storage.base import Committed, Refused, commit_each, database_time, fill
from runtime.storage.events import build_events
from runtime.storage.guards import standing_check_in_tx
from runtime.storage.leases import lease_live_sql
from runtime.storage.plan import Plan
from runtime.storage.postgres.background import PostgresWorkerStorage
from runtime.storage.postgres.listen import CHANNEL
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


class PostgresDialect(Dialect):
    vendor = "postgresql"

    def __init__(self, db_clock: bool) -> None:
        super().__init__(db_clock)
        self.now_sql = "clock_timestamp()" if db_clock else "%s"

    def ph(self, kind: str) -> str:
        return "%s::jsonb" if kind == "json" else "%s"

    def now_plus(self) -> str:
        return "clock_timestamp() + %s * interval '1 second'" if self.db_clock else "%s"

    def decimal_add(self, column: str) -> str:
        return f'"{column}" = "{column}" + %s::numeric'


def _casts(model: Any, names: list[str]) -> list[str]:
    """Each column's type, for the placeholders of an INSERT ... SELECT (no target to infer
    from, so every value says what it is). Text goes as ``text``: an explicit cast to
    ``varchar(n)`` would cut a value silently, where the column's own check refuses it."""
    db = connections[DEFAULT_DB_ALIAS]
    fields = {f.attname: f for f in model._meta.concrete_fields}
    return ["%s::text" if isinstance(fields[n], CharField | TextField)
            else f"%s::{fields[n].cast_db_type(db)}" for n in names]


class PostgresEngine:
    vendor = "postgresql"
    locks_rows = True
    groups_commits = False  # each commit on a pooled connection of its own

    def commit(self, plan: Plan, clock: Any) -> Committed:
        db = connections[DEFAULT_DB_ALIAS]
        # (armed: the in-transaction crash point needs a transaction)
        if plan.in_orm or db.in_atomic_block or crashpoints.is_armed():
            with transaction.atomic():
                return self.apply_in_tx(plan, clock)
        return self._execute(db, plan, clock)

    def commit_many(self, plans: list[Plan], clock: Any) -> list[Committed | BaseException]:
        """Each plan in a commit of its own (PostgreSQL groups commits in its WAL writer);
        each plan's result, or ``Refused``."""
        return commit_each(self, plans, clock)

    def apply_in_tx(self, plan: Plan, clock: Any) -> Committed:
        standing_check_in_tx(plan, lock=True)
        write_approvals_in_tx(plan)
        committed = self._execute(connections[DEFAULT_DB_ALIAS], plan, clock)
        crashpoints.reached(CrashPoint.IN_TRANSACTION, run_id=plan.run_id,
                            step_index=plan.last_step_index())
        return committed

    @contextmanager
    def transaction(self) -> Iterator[None]:
        with transaction.atomic():
            yield

    def one_write(self) -> AbstractContextManager[None]:
        return nullcontext()

    def _execute(self, db: Any, plan: Plan, clock: Any) -> Committed:
        d = PostgresDialect(database_time(clock))
        rows, seq, head = build_events(plan.run_id, plan.fence.seq, plan.head, plan.events,
                                       plan.actor, plan.at)
        run = run_update(d, plan, seq, head)
        updates = [(s, step_update(d, s, f)) for s, f in plan.step_updates.values()]
        key = ("cte", run.sql, len(plan.step_inserts), tuple(u.sql for _, u in updates),
               len(rows))
        sql = cached(d, key, lambda: _statement(run.sql, len(plan.step_inserts),
                                                [u.sql for _, u in updates], len(rows)))
        params = list(run.params)
        for step in plan.step_inserts:
            params += step_insert_params(d, step)
        for step, stmt in updates:
            params += [*stmt.params[:-1], step.pk]
        params += event_params(d, rows)
        if not d.db_clock:
            params = fill(params, clock.now(), lambda at: at, run.marks)
        found = run_sql(db, sql, params).fetchone()
        if found[0] != 1:
            raise Refused()
        for step, pk in zip(plan.step_inserts, found[2:], strict=True):
            step.pk = pk
            step._state.adding, step._state.db = False, db.alias
        expires = found[1].astimezone(UTC) if plan.take else None
        return Committed(rows, seq, head, expires)

    def renew(self, leases: list[Any], seconds: float, clock: Any) -> dict[tuple, datetime]:
        """Extend every lease still held and unexpired, in one statement; the renewed ones."""
        db = connections[DEFAULT_DB_ALIAS]
        ids = [lease.run_id for lease in leases]
        epochs = [lease.epoch for lease in leases]
        owners = [lease.owner for lease in leases]
        match = ('AND ("id", "lease_epoch", "lease_owner") IN '
                 '(SELECT * FROM unnest(%s::bigint[], %s::bigint[], %s::text[])) '
                 'RETURNING "id", "lease_epoch", "lease_owner", "lease_expires_at"')
        if database_time(clock):
            sql = ('UPDATE "runtime_run" SET "lease_expires_at" = clock_timestamp() + '
                   '%s * interval \'1 second\' WHERE "status" = \'running\' AND '
                   f'{lease_live_sql("clock_timestamp()")} {match}')
            params: list[Any] = [seconds, ids, epochs, owners]
        else:
            now = clock.now()
            sql = ('UPDATE "runtime_run" SET "lease_expires_at" = %s WHERE "status" = '
                   f'\'running\' AND {lease_live_sql("%s")} {match}')
            params = [now + timedelta(seconds=seconds), now, ids, epochs, owners]
        found = run_sql(db, sql, params).fetchall()
        return {(run_id, epoch, owner): at.astimezone(UTC)
                for run_id, epoch, owner, at in found}

    def select(self, sql: str, params: list[Any]) -> list[tuple]:
        """The rows of a read the runtime built (``%s`` placeholders)."""
        with connections[DEFAULT_DB_ALIAS].cursor() as cursor:
            cursor.execute(sql, params)
            return cursor.fetchall()

    def now_expression(self, clock: Any) -> Any:
        if database_time(clock):
            return Func(function="clock_timestamp", output_field=DateTimeField())
        return Value(clock.now(), DateTimeField())

    def dialect(self, clock: Any) -> PostgresDialect:
        return PostgresDialect(database_time(clock))

    def notify_ready(self) -> None:
        """Wake idle workers (``LISTEN runtime_ready``): called after the commit that made a
        run ready, so a woken worker finds it."""
        db = connections[DEFAULT_DB_ALIAS]
        db.ensure_connection()
        with db.wrap_database_errors:
            db.connection.execute(f"NOTIFY {CHANNEL}")

    def worker_storage(self, threads: int) -> PostgresWorkerStorage:
        return PostgresWorkerStorage(threads)


def run_sql(db: Any, sql: str, params: list[Any]) -> Any:
    """Execute on Django's psycopg connection with server-side binding, prepared: the
    runtime's statements repeat with new values, so the server plans each shape once."""
    db.ensure_connection()
    conn = db.connection
    if conn.prepare_threshold is None and "prepare_threshold" not in db.settings_dict["OPTIONS"]:
        # Django turns preparing off for connection poolers; only these server-bound
        # statements prepare (the ORM binds on the client). OPTIONS["prepare_threshold"]
        # set to None keeps it off (PgBouncer in transaction mode before 1.21).
        conn.prepare_threshold = 0
    with db.wrap_database_errors:
        cursor = psycopg.Cursor(conn)
        cursor.execute(sql, params, prepare=conn.prepare_threshold is not None)
        return cursor


def _statement(run_sql: str, inserts: int, updates: list[str], events: int) -> str:
    """The plan as one statement: the fenced run update, then the writes that depend on it."""
    parts = [f"r AS ({run_sql} RETURNING \"id\", \"lease_expires_at\")"]
    step_cols = ", ".join(f'"{STEP_COLUMNS[n][0]}"' for n in STEP_INSERT)
    step_vals = ", ".join(_casts(Step, STEP_INSERT))
    for i in range(inserts):
        parts.append(f'si{i} AS (INSERT INTO "runtime_step" ({step_cols}) SELECT {step_vals} '
                     f'FROM r RETURNING "id")')
    for i, sql in enumerate(updates):
        parts.append(f"su{i} AS ({sql} AND EXISTS (SELECT 1 FROM r))")
    row = "(" + ", ".join(_casts(Event, list(EVENT_COLUMNS))) + ")"
    parts.append(f'ev AS (INSERT INTO "runtime_event" ({", ".join(EVENT_COLUMNS)}) SELECT v.* '
                 f'FROM r, (VALUES {", ".join([row] * events)}) AS v)')
    picks = ["(SELECT count(*) FROM r)", "(SELECT \"lease_expires_at\" FROM r)"]
    picks += [f'(SELECT "id" FROM si{i})' for i in range(inserts)]
    return f"WITH {', '.join(parts)} SELECT {', '.join(picks)}"
