"""Run the peers side by side in one sitting: each system's script with its own Python, in
interleaved rounds (the machine's speed drifts within minutes), and print each system's median
steps/s and its ratio to this project's, the median of each round's ratio.

    python bench/peers/compare.py --runtime .venv/bin/python \\
        --langgraph /tmp/peers/bin/python --dbos /tmp/peers/bin/python --rounds 3 \\
        --inflight 1,16
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
from pathlib import Path

HERE = Path(__file__).resolve().parent


def measure(python: str, script: str, extra: list[str], runs: int, steps: int) -> dict:
    done = subprocess.run([python, str(HERE / script), "--runs", str(runs), "--steps",
                           str(steps), *extra], capture_output=True, text=True, check=True,
                          timeout=1800)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runtime", required=True, help="the project's venv's python")
    parser.add_argument("--langgraph", help="a python with langgraph-checkpoint-sqlite")
    parser.add_argument("--dbos", help="a python with dbos")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--postgres", default="",
                        help="a PostgreSQL server URL: this project and DBOS on fresh databases "
                        "there (LangGraph's SQLite saver is left out)")
    parser.add_argument("--inflight", default="1",
                        help="runs in flight, comma-separated levels (default 1; e.g. 1,16)")
    args = parser.parse_args()
    levels = [int(x) for x in args.inflight.split(",")]
    pg = ["--postgres", args.postgres] if args.postgres else []
    lines: list[tuple[str, str, list[str]]] = [("runtime", "runtime_steps.py", pg)]
    if args.langgraph and not args.postgres:
        lines += [("langgraph-sync", "langgraph_steps.py", ["--durability", "sync"]),
                  ("langgraph-async", "langgraph_steps.py", ["--durability", "async"])]
    if args.dbos:
        lines.append(("dbos", "dbos_steps.py", pg))
    python = {"runtime": args.runtime, "langgraph-sync": args.langgraph,
              "langgraph-async": args.langgraph, "dbos": args.dbos}
    rounds: list[dict[tuple[str, int], float]] = []
    for _ in range(args.rounds):
        found = {(name, n): measure(python[name], script, [*extra, "--inflight", str(n)],
                                    args.runs * (n if n > 1 else 1), args.steps)
                 ["steps_per_s"] for n in levels for name, script, extra in lines}
        # The disk's limit in the same round: plain sqlite3, one INSERT per synced commit.
        found["ceiling", 0] = measure(args.runtime, "runtime_steps.py", ["--ceiling", "3"], 1,
                                      1)["commits_per_s"]
        rounds.append(found)
    where = "PostgreSQL" if args.postgres else "SQLite WAL, synchronous=FULL"
    print(f"runs of {args.steps} no-op steps, {args.rounds} interleaved rounds "
          f"({where}); {args.runs} runs a round at one in flight, "
          f"{args.runs} x N at N in flight")
    for n in levels:
        print(f"{n} in flight")
        for name, _, _ in lines:
            median = statistics.median(r[name, n] for r in rounds)
            ratio = statistics.median(r["runtime", n] / r[name, n] for r in rounds)
            print(f"  {name:16} {median:8.0f} steps/s   agent-runtime / it: {ratio:.2f} x")
    ceiling = statistics.median(r["ceiling", 0] for r in rounds)
    print(f"the ceiling (plain sqlite3, one INSERT per synced commit): {ceiling:,.0f} "
          "commits/s; agent-runtime's steps/s against it: " + ", ".join(
              f"{statistics.median(r['runtime', n] / r['ceiling', 0] for r in rounds):.2f} x "
              f"at {n} in flight" for n in levels))
    peers = [name for name, _, _ in lines if name != "runtime"]
    if peers:
        best = statistics.median(max(r[name, n] for name in peers for n in levels)
                                 for r in rounds)
        for n in levels:
            ratio = statistics.median(r["runtime", n] / max(r[name, m] for name in peers
                                                             for m in levels) for r in rounds)
            print(f"agent-runtime at {n} in flight / the best peer figure at any level "
                  f"({best:.0f} steps/s): {ratio:.2f} x")


if __name__ == "__main__":
    main()
