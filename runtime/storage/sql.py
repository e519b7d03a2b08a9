"""The statements a plan becomes, written once for both engines.

Each statement is built once per shape of change (which columns, which fence) and cached; a
commit only computes its parameters. Values are adapted by the engine's ``Dialect``; the time a
fence or a lease expiry is judged by is a marker (``NOW``) the committer fills inside the
transaction, or, on PostgreSQL with the system clock, the server's ``clock_timestamp()``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import DateTimeField, DecimalField, JSONField

from runtime.models import Run, RunStatus, Step
from runtime.storage.events import EventRow
from runtime.storage.leases import lease_gone_sql, lease_live_sql
from runtime.storage.plan import Add, Fence, Plan, TakeLease


class _Now:
    """A parameter standing for the statement's time, filled by the committer."""

    def __repr__(self) -> str:
        return "NOW"


NOW = _Now()


@dataclass(frozen=True)
class NowPlus:
    """A parameter standing for the statement's time plus ``seconds`` (a lease's expiry)."""

    seconds: float


def _kinds(model: Any) -> dict[str, tuple[str, str]]:
    """field name -> (column, kind) where kind is json, datetime, decimal or plain."""
    out = {}
    for f in model._meta.concrete_fields:
        kind = ("json" if isinstance(f, JSONField) else "datetime" if isinstance(f, DateTimeField)
                else "decimal" if isinstance(f, DecimalField) else "plain")
        out[f.name] = (f.column, kind)
        if f.attname != f.name:
            out[f.attname] = (f.column, kind)
    return out


RUN_COLUMNS = _kinds(Run)
RUN_KINDS = {name: kind for name, (_column, kind) in RUN_COLUMNS.items()}
_TAIL = (("event_seq", "="), ("event_hash", "="), ("updated_at", "="))
STEP_COLUMNS = _kinds(Step)
STEP_INSERT = [f.attname for f in Step._meta.concrete_fields if not f.primary_key]
EVENT_COLUMNS = ("run_id", "step_index", "seq", "kind", "payload", "actor", "at", "hash")


class Dialect:
    """How one engine writes placeholders and values."""

    vendor = ""
    now_sql = "%s"  # what NOW is in SQL when the committer binds it

    def __init__(self, db_clock: bool) -> None:
        self.db_clock = db_clock

    def ph(self, kind: str) -> str:
        """A placeholder for a value of ``kind``."""
        return "%s"

    def now(self) -> str:
        return self.now_sql

    def now_plus(self) -> str:
        return "%s"

    def decimal_add(self, column: str) -> str:
        return f'"{column}" = "{column}" + {self.ph("decimal")}'

    def value(self, kind: str, value: Any) -> Any:
        if kind == "json":
            return None if value is None else json.dumps(value)
        if kind == "decimal" and value is not None:
            return str(value)
        return value

    def time(self, at: datetime) -> Any:
        return at

    def finish(self, sql: str) -> str:
        """The statement as this engine's driver takes it (placeholders)."""
        return sql


@dataclass
class Statement:
    sql: str
    params: list[Any]
    marks: tuple[int, ...] = ()  # where NOW and NowPlus are in params


_cache: dict[tuple, str] = {}


def cached(d: Dialect, key: tuple, build: Any) -> str:
    """The statement for ``key``, built once and finished for the engine's placeholders."""
    sql = _cache.get(key)
    if sql is None:
        sql = _cache[key] = d.finish(build())
    return sql


def run_update(d: Dialect, plan: Plan, seq: int, head: str) -> Statement:
    """The run row's compare-and-set: the plan's changes where its fence still holds."""
    shape: list[tuple[str, str]] = []
    params: list[Any] = []
    for name, value in plan.run.items():
        kind = RUN_KINDS[name]
        if type(value) is Add:
            shape.append((name, "+"))
            value = value.n
        else:
            shape.append((name, "="))
        params.append(value if kind == "plain" or value is None else adapt(d, kind, value))
    # Every commit moves the chain head and the row's time (``_TAIL``).
    params += (seq, head, d.time(plan.at))
    shape += _TAIL
    take: TakeLease | None = plan.take
    marks: list[int] = []
    if take is not None:
        params += [take.owner, take.epoch]
        if not d.db_clock:
            marks.append(len(params))
        params += [take.seconds] if d.db_clock else [NowPlus(take.seconds)]
    f: Fence = plan.fence
    params += [plan.run_id, f.seq]
    if f.owner is not None:
        params.append(f.owner)
    if f.epoch is not None:
        params.append(f.epoch)
    params += list(f.status)
    if (f.unexpired or f.expired) and not d.db_clock:
        marks.append(len(params))
        params.append(NOW)
    key = ("run", d.vendor, d.db_clock, tuple(shape), take is not None, f.owner is not None,
           f.epoch is not None, len(f.status), f.unexpired, f.expired)
    return Statement(cached(d, key, lambda: _run_update_sql(d, shape, take is not None, f)),
                     params, tuple(marks))


def _run_update_sql(d: Dialect, shape: list[tuple[str, str]], take: bool, f: Fence) -> str:
    sets = []
    for name, op in shape:
        column, kind = RUN_COLUMNS[name]
        if op == "+":
            sets.append(d.decimal_add(column) if kind == "decimal"
                        else f'"{column}" = "{column}" + {d.ph(kind)}')
        else:
            sets.append(f'"{column}" = {d.ph(kind)}')
    if take:
        sets += ['"lease_owner" = %s', '"lease_epoch" = %s',
                 f'"lease_expires_at" = {d.now_plus()}']
    where = ['"id" = %s', '"event_seq" = %s']
    if f.owner is not None:
        where.append('"lease_owner" = %s')
    if f.epoch is not None:
        where.append('"lease_epoch" = %s')
    if f.status:
        where.append(f'"status" IN ({", ".join(["%s"] * len(f.status))})')
    if f.unexpired:
        where.append(lease_live_sql(d.now()))
    if f.expired:
        where.append(lease_gone_sql(d.now(), held=True))  # a takeover: the run is running
    return f'UPDATE "runtime_run" SET {", ".join(sets)} WHERE {" AND ".join(where)}'


RUN_SELECT = ", ".join(f'"{f.column}"' for f in Run._meta.concrete_fields)


def claim_candidates(d: Dialect, now: datetime, *, gone: bool, limit: int,
                     agents: Sequence[str] = (), dead_owners: Sequence[str] = (),
                     exclude: Sequence[int] = (), lock: bool = False) -> Statement:
    """Where a claim looks, oldest first: runs whose lease is gone (expired, or its owner
    proved dead; their steps wait) if ``gone``, else queued runs. Each run comes with
    ``expired``: whether its lease is gone by the statement's time. Read along the run
    table's (status, ...) indexes whatever the number of finished runs; ``lock`` (PostgreSQL)
    takes the rows, skipping those another worker holds."""
    at = [] if d.db_clock else [d.time(now)]
    params: list[Any] = [*at, RunStatus.RUNNING if gone else RunStatus.QUEUED]
    where = '"status" = %s'
    if gone:
        where += f" AND ({lease_gone_sql(d.now(), held=True)}"  # running runs only
        params += at
        if dead_owners:
            where += f' OR "lease_owner" IN ({", ".join(["%s"] * len(dead_owners))})'
            params += list(dead_owners)
        where += ")"
    if agents:
        where += f' AND "agent" IN ({", ".join(["%s"] * len(agents))})'
        params += list(agents)
    if exclude:
        where += f' AND "id" NOT IN ({", ".join(["%s"] * len(exclude))})'
        params += list(exclude)
    locking = " FOR UPDATE SKIP LOCKED" if lock else ""
    sql = (f'SELECT {RUN_SELECT}, {lease_gone_sql(d.now())} AS "expired" FROM "runtime_run" '
           f'WHERE {where} ORDER BY "id" LIMIT {int(limit)}{locking}')
    return Statement(sql, params)


def adapt(d: Dialect, kind: str, value: Any) -> Any:
    """A column's value as the engine takes it (a plain one, or NULL, as it is)."""
    if kind == "plain" or value is None:
        return value
    return d.time(value) if kind == "datetime" else d.value(kind, value)


_STEP_INSERT_KINDS = [(name, STEP_COLUMNS[name][1]) for name in STEP_INSERT]


def step_insert_params(d: Dialect, step: Step) -> list[Any]:
    return [adapt(d, kind, getattr(step, name)) for name, kind in _STEP_INSERT_KINDS]


def step_update(d: Dialect, step: Step, fields: dict[str, Any]) -> Statement:
    names = tuple(fields)
    params = [adapt(d, STEP_COLUMNS[name][1], value) for name, value in fields.items()]
    sql = cached(d, ("step", d.vendor, names), lambda: 'UPDATE "runtime_step" SET ' + ", ".join(
        f'"{STEP_COLUMNS[n][0]}" = {d.ph(STEP_COLUMNS[n][1])}' for n in names)
        + ' WHERE "id" = %s')
    return Statement(sql, [*params, step.pk])


def event_params(d: Dialect, rows: Sequence[EventRow]) -> list[Any]:
    params: list[Any] = []
    for r in rows:
        params += (r.run_id, r.step_index, r.seq, r.kind, r.payload_text, r.actor, d.time(r.at),
                   r.hash)
    return params
