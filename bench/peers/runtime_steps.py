"""This project's side of the peers table: runs of N no-op steps (N - 1 tool calls and the
final answer) on a fresh SQLite file (WAL, ``synchronous=FULL``, as always): one run at a time
through ``runtime.resume`` in process, or with ``--inflight K`` a worker (``runworker``'s engine,
in process, ``--loop`` its kind) holding K runs in flight. Run it with the project's venv from
the repository's root; it prints one JSON line."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


@contextmanager
def fresh_database(server: str) -> Iterator[str]:
    """A new database on the PostgreSQL ``server`` (its URL; dropped after), or "" for none."""
    if not server:
        yield ""
        return
    import psycopg  # noqa: PLC0415 - only for a PostgreSQL measurement

    name = f"peers_runtime_{os.getpid()}"
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    try:
        yield f"{server.rsplit('/', 1)[0]}/{name}"
    finally:
        from django.db import connections  # noqa: PLC0415 - Django is set up by then

        connections.close_all()
        with psycopg.connect(server, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--inflight", type=int, default=1)
    parser.add_argument("--loop", choices=("asyncio", "threads"), default="asyncio")
    parser.add_argument("--postgres", default="",
                        help="a PostgreSQL server URL: measure on a fresh database there "
                        "(created, then dropped) instead of a SQLite file")
    parser.add_argument("--ceiling", type=float, default=0.0,
                        help="instead: plain sqlite3's synced commits/s for this many seconds")
    args = parser.parse_args()
    if args.ceiling:
        sys.path.insert(0, str(ROOT))
        from runtime.benchkit.ceiling import ceiling  # noqa: PLC0415 - stdlib only

        with tempfile.TemporaryDirectory() as directory:
            commits = ceiling(Path(directory), args.ceiling)
        print(json.dumps({"system": "plain sqlite3, one INSERT per synced commit",
                          "commits_per_s": commits, "steps_per_s": commits}))
        return
    with tempfile.TemporaryDirectory() as directory, fresh_database(args.postgres) as url:
        os.environ["DATABASE_URL"] = url or f"sqlite:///{Path(directory) / 'runtime.sqlite3'}"
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
        sys.path.insert(0, str(ROOT))
        import django  # noqa: PLC0415 - Django is set up for the temporary database first
        django.setup()
        from django.core.management import call_command  # noqa: PLC0415

        import runtime  # noqa: PLC0415
        from runtime.agents.agent import registry  # noqa: PLC0415

        call_command("migrate", verbosity=0, interactive=False)

        import logging  # noqa: PLC0415

        from runtime.worker.process import WorkerProcess  # noqa: PLC0415

        logging.getLogger("runtime").setLevel(logging.WARNING)

        @runtime.tool(effect="read_only", blocks=False)
        def noop(n: int) -> dict:
            """Do nothing."""
            return {"n": n}

        script = [runtime.ToolCall("noop", {"n": i}) for i in range(args.steps - 1)]
        agent = runtime.Agent("peers", runtime.ScriptedLLM(
            [*script, runtime.FinalAnswer("done")]), [noop])
        with registry.override(agent):
            runtime.resume(runtime.start("peers", {}).pk)  # warm-up
            if args.inflight == 1:
                system = "agent-runtime (runtime.resume)"
                began = time.perf_counter()
                for _ in range(args.runs):
                    assert runtime.resume(runtime.start("peers", {}).pk).status == "succeeded"
                seconds = time.perf_counter() - began
            else:  # queued first, then one worker drains them, K in flight
                system = f"agent-runtime (worker, --loop {args.loop})"
                ids = [runtime.start("peers", {}).pk for _ in range(args.runs)]
                worker = WorkerProcess(concurrency=args.inflight, burst=True,
                                       poll_interval=0.05, loop=args.loop)
                began = time.perf_counter()
                assert worker.run() == 0
                seconds = time.perf_counter() - began
                assert worker.finished == len(ids)
    print(json.dumps({"system": system, "runs": args.runs, "inflight": args.inflight,
                      "steps": args.runs * args.steps, "seconds": seconds,
                      "steps_per_s": args.runs * args.steps / seconds}))


if __name__ == "__main__":
    main()
