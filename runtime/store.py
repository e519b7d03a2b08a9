"""Writes to the runtime's tables. Each function is one transaction holding a state change and
its audit events; claims and lease writes are compare-and-set UPDATEs checked by row count.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections, transaction
from django.db.models import DecimalField, F, JSONField, Value
from django.db.models.expressions import CombinedExpression

from . import crashpoints
from .audit import (
    EventRow,
    EventSpec,
    build_events,
    db_datetime,
    insert_events,
    log_events,
    prepare_events,
)
from .backends.sqlite3.base import DatabaseWrapper as QueuedSQLite
from .canonical import check_payload
from .crashpoints import CrashPoint
from .errors import LeaseLost, RunLeased, RunNotFound, RunNotResumable
from .models import IN_FLIGHT_STEP_STATUSES, Run, RunStatus, Step, StepStatus


@dataclass(eq=False)
class Lease:
    """This process's hold on one run: owner and epoch fence every write it makes.

    ``seq``/``head`` mirror the run's audit chain head, so appends need no read first.
    """

    run_id: int
    owner: str
    epoch: int
    expires_at: datetime
    seq: int
    head: str
    lost: bool = False  # set by the heartbeat when a renewal finds the lease gone


class _CasFailed(Exception):
    pass


def _last_step_index(specs: Sequence[EventSpec]) -> int | None:
    return next((s.step_index for s in reversed(specs) if s.step_index is not None), None)


def lease_commit(
    lease: Lease,
    specs: Sequence[EventSpec],
    *,
    now: datetime,
    run_fields: dict[str, Any] | None = None,
    writes: Callable[[], None] | None = None,
    require_unexpired: bool = False,
    late_payloads: bool = False,
    plain_sql: bool = False,
) -> list[EventRow]:
    """Commit a state change and its events, only while ``lease`` still holds the run.

    ``require_unexpired`` adds the wall-clock check that a tool start or an LLM request needs.
    Raises ``LeaseLost`` (nothing written) when the compare-and-set finds another owner, a newer
    epoch, a moved chain head or, if required, an expired lease.

    The events are chained and every statement is prepared before the transaction begins, so
    the write lock is held for the statements and the flush only; ``late_payloads`` says that
    ``writes`` put generated ids into the payloads, so the events are built after them.
    ``plain_sql`` says ``writes`` are only prepared statements (no ORM saves, whose signals
    may use ``atomic()`` or ``on_commit()``), so the lean ``write_transaction()`` may carry them.
    """
    unexpired_at = now if require_unexpired else None
    prepared = None if late_payloads else _prepare(lease, specs, now, run_fields, unexpired_at)
    try:
        with write_transaction(lean=plain_sql or writes is None):
            if writes is not None:
                writes()
            if prepared is None:
                prepared = _prepare(lease, specs, now, run_fields, unexpired_at)
            rows, seq, head, update, insert = prepared
            if update() != 1:
                raise _CasFailed
            insert()
            crashpoints.reached(CrashPoint.IN_TRANSACTION, run_id=lease.run_id,
                                step_index=_last_step_index(specs))
    except Exception as exc:
        lost = _lease_lost(lease, now, require_unexpired)
        if lost is not None:
            raise lost from None
        if isinstance(exc, _CasFailed):
            raise AssertionError(f"run {lease.run_id}: lease write refused, lease intact") from None
        raise
    lease.seq, lease.head = seq, head
    log_events(rows)
    return rows


def write_transaction(*, lean: bool = True) -> Any:
    """``transaction.atomic()``; if ``lean`` (nothing inside saves through the ORM), on the
    runtime's SQLite backend outside any atomic block, its leaner ``write_transaction()``
    (the same BEGIN IMMEDIATE, COMMIT and rollback)."""
    db = connections[DEFAULT_DB_ALIAS]
    if lean and isinstance(db, QueuedSQLite) and not db.in_atomic_block:
        return db.write_transaction()
    return transaction.atomic()


def _prepare(lease: Lease, specs: Sequence[EventSpec], now: datetime,
             run_fields: dict[str, Any] | None, unexpired_at: datetime | None) -> tuple:
    """(rows, seq, head, run update, event insert): the commit's chain and statements."""
    rows, seq, head = build_events(lease.run_id, lease.seq, lease.head, specs, lease.owner, now)
    fields = {"event_seq": seq, "event_hash": head, "updated_at": now, **(run_fields or {})}
    return rows, seq, head, _lease_update(lease, fields, unexpired_at), prepare_events(rows)


# The loop's compare-and-set, written as SQL once per shape of change: building the same UPDATE
# through the ORM on every commit cost more CPU than the commit's own flush.
_run_update_sql: dict[tuple, str] = {}


def _lease_update(lease: Lease, fields: dict[str, Any],
                  unexpired_at: datetime | None) -> Callable[[], int]:
    """The UPDATE of the run where owner, epoch and chain head still match (and, if given, the
    lease is unexpired at ``unexpired_at``), prepared; run it for the row count that says
    whether the lease held."""
    db = connections[DEFAULT_DB_ALIAS]
    shape, params = _set_params(db, fields) if db.vendor == "sqlite" else (None, [])
    if shape is None:  # not SQLite, or an expression the fast path does not write: the ORM
        cond: dict[str, Any] = {"pk": lease.run_id, "lease_owner": lease.owner,
                                "lease_epoch": lease.epoch, "event_seq": lease.seq}
        if unexpired_at is not None:
            cond["lease_expires_at__gt"] = unexpired_at
        return lambda: Run.objects.filter(**cond).update(**fields)
    key = (shape, unexpired_at is not None)
    sql = _run_update_sql.get(key)
    if sql is None:
        sql = _run_update_sql[key] = _update_sql(shape, unexpired_at is not None)
    params += [lease.run_id, lease.owner, lease.epoch, lease.seq]
    if unexpired_at is not None:
        params.append(db_datetime(db, unexpired_at))
    return lambda: execute(db, sql, params).rowcount


def execute(db: Any, sql: str, params: Sequence[Any]) -> Any:
    """Run one prepared statement on ``db`` (the connection it was prepared for, this
    thread's); returns the sqlite3 cursor."""
    db.ensure_connection()
    with db.wrap_database_errors:
        return db.connection.execute(sql, params)


_RUN_FIELDS = {f.name: f for f in Run._meta.concrete_fields}


def _set_params(db: Any, fields: dict[str, Any]) -> tuple[tuple | None, list[Any]]:
    """(shape, parameters) of a SET clause: plain values, or ``F(same field) + value``."""
    shape, params = [], []
    for name, value in fields.items():
        field = _RUN_FIELDS[name]
        if isinstance(value, CombinedExpression):
            lhs, rhs = value.lhs, value.rhs
            if not (value.connector == "+" and isinstance(lhs, F) and lhs.name == name
                    and isinstance(rhs, Value) and not hasattr(rhs.value, "resolve_expression")):
                return None, []
            decimal = isinstance(field, DecimalField)
            shape.append((field.column, "decimal+" if decimal else "+"))
            params.append(str(rhs.value) if decimal else rhs.value)
        elif hasattr(value, "resolve_expression"):
            return None, []
        elif isinstance(value, datetime):
            shape.append((field.column, "="))
            params.append(db_datetime(db, value))
        else:
            shape.append((field.column, "="))
            params.append(field.get_db_prep_save(value, db))
    return tuple(shape), params


def _update_sql(shape: tuple, unexpired: bool) -> str:
    sets = []
    for column, op in shape:
        if op == "=":
            sets.append(f'"{column}" = ?')
        elif op == "+":
            sets.append(f'"{column}" = ("{column}" + ?)')
        else:  # what the ORM writes for a DecimalField sum on SQLite
            sets.append(f'"{column}" = CAST(("{column}" + CAST(? AS NUMERIC)) AS NUMERIC)')
    where = '"id" = ? AND "lease_owner" = ? AND "lease_epoch" = ? AND "event_seq" = ?'
    if unexpired:
        where += ' AND "lease_expires_at" > ?'
    return f'UPDATE "runtime_run" SET {", ".join(sets)} WHERE {where}'


def _lease_lost(lease: Lease, now: datetime, require_unexpired: bool) -> LeaseLost | None:
    """Why a lease write failed, or None if the lease is in fact intact."""
    row = Run.objects.filter(pk=lease.run_id).values(
        "lease_owner", "lease_epoch", "lease_expires_at", "event_seq"
    ).first()
    if row is None:
        err = LeaseLost(lease.run_id, lease.owner, "the run no longer exists")
    elif row["lease_owner"] != lease.owner or row["lease_epoch"] != lease.epoch:
        holder = row["lease_owner"] or "nobody"
        err = LeaseLost(lease.run_id, lease.owner,
                        f"lease lost: now held by {holder} (epoch {row['lease_epoch']})")
    elif row["event_seq"] != lease.seq:
        err = LeaseLost(lease.run_id, lease.owner, "the run was changed by someone else")
    elif require_unexpired and (row["lease_expires_at"] is None or row["lease_expires_at"] <= now):
        err = LeaseLost(lease.run_id, lease.owner,
                        f"lease expired at {row['lease_expires_at']} (now {now})",
                        expired_but_held=True)
    else:
        return None
    lease.lost = True
    return err


def run_create(
    agent: str, input: Any, *, created_by: str = "", now: datetime, actor: str = ""
) -> Run:
    """Insert a queued run with its ``run.created`` event. The caller checked the agent."""
    data = check_payload("run input", input)
    with transaction.atomic():
        # JSON null is a valid input: stored as JSON, not as SQL NULL (which the column refuses).
        stored = Value(None, JSONField()) if data is None else data
        run = Run.objects.create(agent=agent, input=stored, status=RunStatus.QUEUED,
                                 created_by=created_by, created_at=now, updated_at=now)
        run.input = data
        spec = EventSpec("run.created", {"agent": agent, "input": data, "created_by": created_by})
        rows, seq, head = build_events(run.pk, 0, "", [spec], actor or created_by or "system", now)
        insert_events(rows)
        Run.objects.filter(pk=run.pk).update(event_seq=seq, event_hash=head)
    run.event_seq, run.event_hash = seq, head
    log_events(rows)
    return run


@dataclass
class Acquired:
    """The outcome of ``run_acquire``: the lease, the run as claimed, and what happened."""

    lease: Lease
    run: Run
    taken_over: bool
    resumed: bool
    interrupted_step: int | None


def run_acquire(
    run_id: int,
    owner: str,
    *,
    lease_seconds: float,
    now: datetime,
    owner_is_dead: Callable[[Run], bool] | None = None,
) -> Acquired:
    """Take the run's lease: claim a queued run, or take over one whose lease has expired.

    One conditional UPDATE decides; a live lease held by anyone raises ``RunLeased`` and
    changes nothing. ``owner_is_dead`` lets a worker take over at once from an owner it has
    proved dead (same host, pid gone) instead of waiting out the lease.
    """
    try:
        run = Run.objects.get(pk=run_id)
    except (Run.DoesNotExist, ValueError, TypeError):
        raise RunNotFound(run_id) from None
    expires = now + timedelta(seconds=lease_seconds)
    if run.status == RunStatus.QUEUED:
        return _claim(run, owner, now, expires)
    if run.status == RunStatus.RUNNING:
        live = run.lease_expires_at is not None and run.lease_expires_at > now
        if live and not (owner_is_dead and owner_is_dead(run)):
            raise RunLeased(run.pk, run.lease_owner, run.lease_expires_at)
        return _take_over(run, owner, now, expires, force=live)
    raise RunNotResumable(run.pk, run.status)


def _claim(run: Run, owner: str, now: datetime, expires: datetime) -> Acquired:
    resumed = run.lease_epoch > 0
    epoch = run.lease_epoch + 1
    specs = [
        EventSpec("lease.taken",
                  {"owner": owner, "epoch": epoch, "expires_at": expires.isoformat()}),
        EventSpec("run.resumed" if resumed else "run.started", {"owner": owner}),
    ]
    rows, seq, head = build_events(run.pk, run.event_seq, run.event_hash, specs, owner, now)
    db = connections[DEFAULT_DB_ALIAS]
    if db.vendor == "sqlite":  # the statement the ORM builds, written once
        params = [RunStatus.RUNNING, owner, epoch, db_datetime(db, expires), seq, head,
                  db_datetime(db, now), run.pk, RunStatus.QUEUED, run.lease_epoch, run.event_seq]

        def claim() -> int:
            return execute(db, _CLAIM_SQL, params).rowcount
    else:
        def claim() -> int:
            return Run.objects.filter(
                pk=run.pk, status=RunStatus.QUEUED, lease_epoch=run.lease_epoch,
                event_seq=run.event_seq,
            ).update(status=RunStatus.RUNNING, lease_owner=owner, lease_epoch=epoch,
                     lease_expires_at=expires, event_seq=seq, event_hash=head, updated_at=now)
    insert = prepare_events(rows)
    with write_transaction():
        updated = claim()
        if updated == 1:
            insert()
            crashpoints.reached(CrashPoint.IN_TRANSACTION, run_id=run.pk, step_index=None)
    if updated != 1:
        raise _lost_race(run.pk, now)
    log_events(rows)
    _apply(run, RunStatus.RUNNING, owner, epoch, expires, seq, head)
    return Acquired(Lease(run.pk, owner, epoch, expires, seq, head), run, False, resumed, None)


_CLAIM_SQL = ('UPDATE "runtime_run" SET "status" = ?, "lease_owner" = ?, "lease_epoch" = ?, '
              '"lease_expires_at" = ?, "event_seq" = ?, "event_hash" = ?, "updated_at" = ? '
              'WHERE "id" = ? AND "status" = ? AND "lease_epoch" = ? AND "event_seq" = ?')


def _take_over(run: Run, owner: str, now: datetime, expires: datetime, force: bool) -> Acquired:
    epoch = run.lease_epoch + 1
    step = (Step.objects.filter(run_id=run.pk, status__in=IN_FLIGHT_STEP_STATUSES)
            .order_by("-index").first())
    specs = [
        EventSpec("lease.taken_over", {
            "owner": owner, "epoch": epoch, "expires_at": expires.isoformat(),
            "previous_owner": run.lease_owner, "previous_epoch": run.lease_epoch,
            "previous_expires_at": _iso_or_none(run.lease_expires_at),
            "reason": "owner proved dead" if force else "lease expired",
        }),
        EventSpec("run.resumed", {"owner": owner, "after": "takeover"}),
    ]
    if step is not None:
        specs.append(EventSpec("step.interrupted", {
            "was": step.status, "tool": step.tool, "effect": step.effect,
            "attempt": step.attempt, "dispatched": step.dispatched_attempt == step.attempt
            and step.attempt > 0, "previous_owner": run.lease_owner,
        }, step.index))
    rows, seq, head = build_events(run.pk, run.event_seq, run.event_hash, specs, owner, now)
    cond: dict[str, Any] = {"pk": run.pk, "status": RunStatus.RUNNING,
                            "lease_epoch": run.lease_epoch, "event_seq": run.event_seq}
    if not force:
        cond["lease_expires_at__lte"] = now
    with transaction.atomic():
        updated = Run.objects.filter(**cond).update(
            lease_owner=owner, lease_epoch=epoch, lease_expires_at=expires,
            event_seq=seq, event_hash=head, updated_at=now)
        if updated == 1:
            if step is not None:
                Step.objects.filter(pk=step.pk).update(status=StepStatus.INTERRUPTED)
            insert_events(rows)
            crashpoints.reached(CrashPoint.IN_TRANSACTION, run_id=run.pk,
                                step_index=step.index if step is not None else None)
    if updated != 1:
        raise _lost_race(run.pk, now)
    log_events(rows)
    _apply(run, RunStatus.RUNNING, owner, epoch, expires, seq, head)
    return Acquired(Lease(run.pk, owner, epoch, expires, seq, head), run, True, True,
                    step.index if step is not None else None)


def _apply(run: Run, status: str, owner: str, epoch: int, expires: datetime, seq: int,
           head: str) -> None:
    run.status, run.lease_owner, run.lease_epoch = status, owner, epoch
    run.lease_expires_at, run.event_seq, run.event_hash = expires, seq, head


def _lost_race(run_id: int, now: datetime) -> Exception:
    """Someone else changed the run between our read and our conditional UPDATE."""
    run = Run.objects.get(pk=run_id)
    if run.status == RunStatus.RUNNING:
        return RunLeased(run.pk, run.lease_owner, run.lease_expires_at)
    return RunNotResumable(run.pk, run.status)


def run_append_in_tx(
    run: Run,
    specs: Sequence[EventSpec],
    *,
    actor: str,
    now: datetime,
    expect_status: Sequence[str],
    run_fields: dict[str, Any] | None = None,
) -> list[EventRow] | None:
    """Append events to a run nobody holds (an operator's decision), inside the caller's
    transaction. Returns None, writing nothing, if the run moved on since it was read."""
    rows, seq, head = build_events(run.pk, run.event_seq, run.event_hash, specs, actor, now)
    updated = Run.objects.filter(
        pk=run.pk, status__in=list(expect_status), event_seq=run.event_seq
    ).update(event_seq=seq, event_hash=head, updated_at=now, **(run_fields or {}))
    if updated != 1:
        return None
    insert_events(rows)
    run.event_seq, run.event_hash = seq, head
    transaction.on_commit(lambda: log_events(rows))
    return rows


def _iso_or_none(at: datetime | None) -> str | None:
    return at.isoformat() if at is not None else None


def run_release(lease: Lease, *, now: datetime, reason: str) -> bool:
    """Hand a run back to the queue from outside its loop (a stopping worker past its grace
    period). A step still in flight is marked interrupted in the same transaction, so whoever
    claims the run next applies the interruption contract to it. False if the lease was gone."""
    step = (Step.objects.filter(run_id=lease.run_id, status__in=IN_FLIGHT_STEP_STATUSES)
            .order_by("-index").first())
    specs = []
    if step is not None:
        specs.append(EventSpec("step.interrupted", {
            "was": step.status, "tool": step.tool, "effect": step.effect,
            "attempt": step.attempt, "reason": reason}, step.index))
    specs += [EventSpec("run.released", {"reason": reason}),
              EventSpec("lease.released", {"owner": lease.owner, "epoch": lease.epoch})]

    def writes() -> None:
        if step is not None:
            Step.objects.filter(pk=step.pk, status=step.status).update(
                status=StepStatus.INTERRUPTED)

    try:
        lease_commit(lease, specs, now=now, writes=writes, run_fields={
            "status": RunStatus.QUEUED, "lease_owner": "", "lease_expires_at": None})
    except LeaseLost:
        return False
    return True


# Step rows written by the loop, as SQL: the driver's per-commit step changes through these
# cost a fraction of building the same statements through the ORM.
_STEP_FIELDS = {f.name: f for f in Step._meta.concrete_fields}
_step_sql: dict[tuple[str, ...], str] = {}


def step_write(step: Step, fields: dict[str, Any]) -> Callable[[], None]:
    """The UPDATE of one step row with ``fields``, prepared: run it in the caller's
    transaction."""
    db = connections[DEFAULT_DB_ALIAS]
    if db.vendor != "sqlite":
        return lambda: Step.objects.filter(pk=step.pk).update(**fields)
    names = tuple(fields)
    sql = _step_sql.get(names)
    if sql is None:
        sets = ", ".join(f'"{_STEP_FIELDS[n].column}" = ?' for n in names)
        sql = _step_sql[names] = f'UPDATE "runtime_step" SET {sets} WHERE "id" = ?'
    params = [_step_value(db, n, v) for n, v in fields.items()]
    return lambda: execute(db, sql, [*params, step.pk])  # the id as it is then, not now


def step_insert(step: Step) -> Callable[[], None]:
    """The INSERT of a new step row, prepared: run it in the caller's transaction and
    ``step`` gets its id."""
    db = connections[DEFAULT_DB_ALIAS]
    if db.vendor != "sqlite":
        return lambda: step.save(force_insert=True)
    sql = _step_sql.get(("+insert",))
    if sql is None:
        cols = ", ".join(f'"{f.column}"' for f in _STEP_INSERT_FIELDS)
        marks = ", ".join("?" * len(_STEP_INSERT_FIELDS))
        sql = _step_sql[("+insert",)] = f'INSERT INTO "runtime_step" ({cols}) VALUES ({marks})'
    params = [_step_value(db, f.name, getattr(step, f.attname)) for f in _STEP_INSERT_FIELDS]

    def insert() -> None:
        step.pk = execute(db, sql, params).lastrowid
        step._state.adding, step._state.db = False, db.alias

    return insert


_STEP_INSERT_FIELDS = [f for f in Step._meta.concrete_fields if not f.primary_key]


# Plain values (text, numbers, booleans, ids) go to SQLite as they are; JSON is written as the
# JSON field writes it on SQLite (json.dumps, SQL NULL for None) and datetimes as the backend
# adapts them. Anything else takes the field's own conversion.
_PLAIN = (str, int, float, bool, type(None))


def _step_value(db: Any, name: str, value: Any) -> Any:
    if isinstance(value, datetime):
        return db_datetime(db, value)
    if name in _STEP_JSON:
        return None if value is None else json.dumps(value)
    if type(value) in _PLAIN:
        return value
    return _STEP_FIELDS[name].get_db_prep_save(value, db)


_STEP_JSON = frozenset(n for n, f in _STEP_FIELDS.items() if isinstance(f, JSONField))
