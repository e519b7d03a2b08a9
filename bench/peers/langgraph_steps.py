"""LangGraph's side of the peers table: runs of N no-op steps, one run at a time (or
``--inflight K`` runs at once on K threads sharing the one saver), each step checkpointed by
``SqliteSaver`` on a fresh SQLite file in WAL mode with ``synchronous=FULL``.
Run it in a venv of its own (``pip install langgraph langgraph-checkpoint-sqlite``); it prints
one JSON line."""

from __future__ import annotations

import argparse
import json
import sqlite3
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypedDict

from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import END, START, StateGraph


class State(TypedDict):
    n: int


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--durability", choices=("sync", "async"), default="sync")
    parser.add_argument("--inflight", type=int, default=1)
    args = parser.parse_args()

    def step(state: State) -> State:
        return {"n": state["n"] + 1}

    def more(state: State) -> str:
        return "step" if state["n"] < args.steps else END

    graph = StateGraph(State)
    graph.add_node("step", step)
    graph.add_edge(START, "step")
    graph.add_conditional_edges("step", more)
    with tempfile.TemporaryDirectory() as directory:
        conn = sqlite3.connect(Path(directory) / "langgraph.sqlite3", check_same_thread=False)
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = FULL")
        app = graph.compile(checkpointer=SqliteSaver(conn))
        app.invoke({"n": 0}, {"configurable": {"thread_id": "warm-up"}},
                   durability=args.durability)
        def one(i: int) -> None:
            out = app.invoke({"n": 0}, {"configurable": {"thread_id": str(i)}},
                             durability=args.durability)
            assert out["n"] == args.steps

        began = time.perf_counter()
        if args.inflight == 1:
            for i in range(args.runs):
                one(i)
        else:
            with ThreadPoolExecutor(args.inflight) as pool:
                list(pool.map(one, range(args.runs)))
        seconds = time.perf_counter() - began
        conn.close()
    print(json.dumps({"system": f"langgraph ({args.durability})", "runs": args.runs,
                      "inflight": args.inflight,
                      "steps": args.runs * args.steps, "seconds": seconds,
                      "steps_per_s": args.runs * args.steps / seconds}))


if __name__ == "__main__":
    main()
