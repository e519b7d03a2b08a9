"""Writing the data set's rows fast: bulk inserts that bypass the ORM (millions of rows would
take hours through it), one loader per database engine with the same small interface
(``engine``, ``path``, ``dt``, ``write``, ``close``, ``size_bytes``)."""

from __future__ import annotations

import sqlite3
from datetime import datetime
from pathlib import Path
from typing import Any

from django.db.models import BooleanField, DecimalField, JSONField, Model

from runtime.canonical import dumps
from runtime.models import Approval, Event, Run, RunCreation, Step, Worker


def _default(field: Any) -> Any:
    """A column's value when a row leaves it out, as the database stores it."""
    if field.primary_key:
        return None
    value = field.get_default()
    if isinstance(field, JSONField):
        return None if value is None else dumps(value)
    if isinstance(field, BooleanField):
        return int(bool(value))
    if isinstance(field, DecimalField):
        return str(value)
    return value


class Table:
    """A model's INSERT, as ``scale._builder`` makes it: its concrete columns in order, the
    field's default for a column a row leaves out, explicit ids; rows are dicts of attnames
    holding what the column stores."""

    def __init__(self, model: type[Model]) -> None:
        fields = model._meta.concrete_fields
        self.name = model._meta.db_table
        self.columns = [f.column for f in fields]
        self.keys = [f.attname for f in fields]
        self.defaults = [_default(f) for f in fields]

    def row(self, values: dict[str, Any]) -> tuple:
        return tuple([values.get(k, d) for k, d in zip(self.keys, self.defaults, strict=True)])


class SqliteLoader:
    """Big transactions of ``executemany`` on a plain sqlite3 connection to the bench file."""

    engine = "sqlite"

    def __init__(self, path: Path) -> None:
        self.path = path
        self.conn = sqlite3.connect(path, isolation_level=None)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("PRAGMA cache_size=-262144")  # 256 MiB for this connection

    @staticmethod
    def dt(value: datetime | None) -> str | None:
        """As Django's SQLite backend stores it: naive UTC text (every value here is UTC)."""
        return None if value is None else str(value.replace(tzinfo=None))

    def write(self, rows: dict[Table, list[tuple]]) -> None:
        self.conn.execute("BEGIN IMMEDIATE")
        for table, batch in rows.items():
            if batch:
                cols = ", ".join(f'"{c}"' for c in table.columns)
                marks = ", ".join("?" * len(table.columns))
                self.conn.executemany(f'INSERT INTO "{table.name}" ({cols}) VALUES ({marks})',
                                      batch)
        self.conn.execute("COMMIT")

    def close(self) -> None:
        self.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        self.conn.close()

    def size_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.path.parent.glob(self.path.name + "*"))


class PostgresLoader:
    """``COPY`` on a psycopg connection to the bench database; afterwards the sequences are
    moved past the explicit ids and the tables analyzed (autovacuum would have by then)."""

    engine = "postgresql"

    def __init__(self, url: str) -> None:
        import psycopg

        self.path = url.rsplit("/", 1)[-1]
        self.conn = psycopg.connect(url)
        self.bytes = 0

    @staticmethod
    def dt(value: datetime | None) -> str | None:
        return None if value is None else value.isoformat(" ")

    def write(self, rows: dict[Table, list[tuple]]) -> None:
        with self.conn.cursor() as cur:
            for table, batch in rows.items():
                if batch:
                    cols = ", ".join(f'"{c}"' for c in table.columns)
                    with cur.copy(f'COPY "{table.name}" ({cols}) FROM STDIN') as copy:
                        for row in batch:
                            copy.write_row(row)
        self.conn.commit()

    def close(self) -> None:
        with self.conn.cursor() as cur:
            for model in (Run, Step, Approval, Event, RunCreation, Worker):
                table = model._meta.db_table
                cur.execute(f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), "
                            f'(SELECT COALESCE(MAX(id), 1) FROM "{table}"))')
        self.conn.commit()
        self.conn.autocommit = True
        self.conn.execute("ANALYZE")
        row = self.conn.execute("SELECT pg_database_size(current_database())").fetchone()
        assert row is not None, "a SELECT without FROM gives one row"
        self.bytes = row[0]
        self.conn.close()

    def size_bytes(self) -> int:
        return self.bytes
