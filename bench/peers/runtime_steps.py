"""This project's side of the peers table: runs of N no-op steps (N - 1 tool calls and the
final answer), one run at a time through ``runtime.resume`` in process, on a fresh SQLite file
(WAL, ``synchronous=FULL``, as always). Run it with the project's venv from the repository's
root; it prints one JSON line."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        os.environ["DATABASE_URL"] = f"sqlite:///{Path(directory) / 'runtime.sqlite3'}"
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
        sys.path.insert(0, str(ROOT))
        import django  # noqa: PLC0415 - Django is set up for the temporary database first
        django.setup()
        from django.core.management import call_command  # noqa: PLC0415

        import runtime  # noqa: PLC0415
        from runtime.agents.agent import registry  # noqa: PLC0415

        call_command("migrate", verbosity=0, interactive=False)

        @runtime.tool(effect="read_only")
        def noop(n: int) -> dict:
            """Do nothing."""
            return {"n": n}

        script = [runtime.ToolCall("noop", {"n": i}) for i in range(args.steps - 1)]
        agent = runtime.Agent("peers", runtime.ScriptedLLM(
            [*script, runtime.FinalAnswer("done")]), [noop])
        with registry.override(agent):
            runtime.resume(runtime.start("peers", {}).pk)  # warm-up
            began = time.perf_counter()
            for _ in range(args.runs):
                assert runtime.resume(runtime.start("peers", {}).pk).status == "succeeded"
            seconds = time.perf_counter() - began
    print(json.dumps({"system": "agent-runtime (runtime.resume)", "runs": args.runs,
                      "steps": args.runs * args.steps, "seconds": seconds,
                      "steps_per_s": args.runs * args.steps / seconds}))


if __name__ == "__main__":
    main()
