"""The outside world's own record of calls, for tests: one fsynced JSON line per call in a file
the runtime does not own, so it survives SIGKILL and cannot be "corrected" by the runtime."""

from __future__ import annotations

import json
import os
import threading
from collections import Counter
from pathlib import Path
from typing import Any

from runtime.agents.tools import ToolContext


class Ledger:
    """Append-only call log. Side-effect counts in crash tests come from here."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self.path.touch()
        self._lock = threading.Lock()

    def record(self, name: str, **data: Any) -> None:
        line = json.dumps({"call": name, **data}, sort_keys=True) + "\n"
        with self._lock, open(self.path, "a") as fh:
            fh.write(line)
            fh.flush()
            os.fsync(fh.fileno())

    def record_call(self, name: str, ctx: ToolContext, **data: Any) -> None:
        """Record a tool call with what identifies it: run, step, attempt, idempotency key."""
        self.record(name, run=ctx.run_id, step=ctx.step_index, attempt=ctx.attempt,
                    key=ctx.idempotency_key, **data)

    def calls(self, name: str | None = None) -> list[dict[str, Any]]:
        rows = [json.loads(line) for line in self.path.read_text().splitlines() if line]
        return [r for r in rows if name is None or r["call"] == name]

    def count(self, name: str | None = None) -> int:
        return len(self.calls(name))

    def executions(self) -> Counter[tuple[int, int]]:
        """How often each (run id, step index) took effect, for ``check_invariants``."""
        return Counter((r["run"], r["step"]) for r in self.calls()
                       if "run" in r and "step" in r)

    def has_key(self, key: str) -> dict[str, Any] | None:
        """The first call recorded under an idempotency key (what a reconcile would check)."""
        return next((r for r in self.calls() if r.get("key") == key), None)
