"""DBOS's side of the peers table: workflows of N no-op steps, one at a time, on a fresh
SQLite system database (WAL, ``synchronous=FULL`` set on every connection it opens). Run it in
a venv of its own (``pip install dbos``); it prints one JSON line."""

from __future__ import annotations

import argparse
import json
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
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        DBOS(config={"name": "peers", "system_database_url":
                     f"sqlite:///{Path(directory) / 'dbos.sqlite3'}"})

        @DBOS.step()
        def noop(i: int) -> int:
            return i

        @DBOS.workflow()
        def run(steps: int) -> int:
            return sum(noop(i) for i in range(steps))

        DBOS.launch()
        run(args.steps)  # warm-up
        began = time.perf_counter()
        for _ in range(args.runs):
            assert run(args.steps) == sum(range(args.steps))
        seconds = time.perf_counter() - began
        DBOS.destroy()
    print(json.dumps({"system": "dbos", "runs": args.runs, "steps": args.runs * args.steps,
                      "seconds": seconds, "steps_per_s": args.runs * args.steps / seconds}))


if __name__ == "__main__":
    main()
