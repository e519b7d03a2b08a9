"""DBOS's side of the peers table: workflows of N no-op steps, one at a time (or ``--inflight
K``: started K at a time with ``DBOS.start_workflow``, each wave awaited), on a fresh
SQLite system database (WAL, ``synchronous=FULL`` set on every connection it opens). Run it in
a venv of its own (``pip install dbos``); it prints one JSON line."""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import tempfile
import time
from pathlib import Path
from typing import Any

import sqlalchemy
from dbos import DBOS


@sqlalchemy.event.listens_for(sqlalchemy.engine.Engine, "connect")
def _full_sync(connection: Any, record: Any) -> None:
    if isinstance(connection, sqlite3.Connection):
        connection.execute("PRAGMA journal_mode = WAL")
        connection.execute("PRAGMA synchronous = FULL")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--inflight", type=int, default=1)
    parser.add_argument("--postgres", default="",
                        help="a PostgreSQL server URL: a fresh system database there "
                        "(dropped after) instead of a SQLite file")
    args = parser.parse_args()
    name = f"peers_dbos_{os.getpid()}"
    with tempfile.TemporaryDirectory() as directory:
        url = (f"{args.postgres.rsplit('/', 1)[0]}/{name}" if args.postgres
               else f"sqlite:///{Path(directory) / 'dbos.sqlite3'}")
        DBOS(config={"name": "peers", "system_database_url": url})

        @DBOS.step()
        def noop(i: int) -> int:
            return i

        @DBOS.workflow()
        def run(steps: int) -> int:
            return sum(noop(i) for i in range(steps))

        DBOS.launch()
        run(args.steps)  # warm-up
        began = time.perf_counter()
        if args.inflight == 1:
            for _ in range(args.runs):
                assert run(args.steps) == sum(range(args.steps))
        else:
            for start in range(0, args.runs, args.inflight):
                handles = [DBOS.start_workflow(run, args.steps)
                           for _ in range(min(args.inflight, args.runs - start))]
                assert all(h.get_result() == sum(range(args.steps)) for h in handles)
        seconds = time.perf_counter() - began
        DBOS.destroy()
    if args.postgres:
        import psycopg  # noqa: PLC0415 - DBOS's own dependency

        with psycopg.connect(args.postgres, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    print(json.dumps({"system": "dbos", "runs": args.runs, "inflight": args.inflight,
                      "steps": args.runs * args.steps,
                      "seconds": seconds, "steps_per_s": args.runs * args.steps / seconds}))


if __name__ == "__main__":
    main()
