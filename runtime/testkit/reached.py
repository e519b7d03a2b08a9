"""Which requested crashes happened: a crash that was asked for and never reached fails the
test, because a test that never crashed proves nothing about crashing."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runtime.crashpoints import Arm, CrashPoint


@dataclass(frozen=True)
class Crash:
    """A crash to cause: at ``point``, optionally only at step ``step_index``, on the
    ``occurrence``-th time that point (and step) is reached in the process (1 = first)."""

    point: CrashPoint
    step_index: int | None = None
    occurrence: int = 1

    def arm(self) -> Arm:
        return Arm(CrashPoint(self.point), self.step_index, self.occurrence)

    def as_json(self) -> dict[str, Any]:
        return {"point": str(self.point), "step_index": self.step_index,
                "occurrence": self.occurrence}

    def matches(self, point: str, step_index: int | None) -> bool:
        return point == str(self.point) and (self.step_index is None
                                             or self.step_index == step_index)


@dataclass(frozen=True)
class Missing:
    point: str
    run_id: int | None
    step_index: int | None
    detail: str = ""


@dataclass
class Reached:
    """Requested crashes and the crashes that were reached, per run."""

    requested: list[tuple[int | None, Crash, str]] = field(default_factory=list)
    hits: list[tuple[int | None, str, int | None]] = field(default_factory=list)
    details: list[tuple[str, dict[str, Any]]] = field(default_factory=list)  # (point, detail)

    def expect(self, run_id: int | None, crash: Crash, detail: str = "") -> None:
        self.requested.append((run_id, crash, detail))

    def hit(self, run_id: int | None, point: str, step_index: int | None) -> None:
        self.hits.append((run_id, str(point), step_index))

    def load(self, path: Path) -> int:
        """Add the hits a killed process wrote to its reached file; returns how many."""
        if not Path(path).exists():
            return 0
        lines = [json.loads(line) for line in Path(path).read_text().splitlines() if line]
        for rec in lines:
            self.hit(rec.get("run_id"), rec["point"], rec.get("step_index"))
            if rec.get("detail"):
                self.details.append((rec["point"], rec["detail"]))
        return len(lines)

    def was_hit(self, run_id: int | None, crash: Crash) -> bool:
        return any((run_id is None or r == run_id) and crash.matches(p, s)
                   for r, p, s in self.hits)

    def missing(self) -> list[Missing]:
        """Requested crashes without a hit of their own (each hit satisfies one request)."""
        unused = list(self.hits)
        out = []
        for run_id, c, detail in self.requested:
            hit = next((h for h in unused if (run_id is None or h[0] == run_id)
                        and c.matches(h[1], h[2])), None)
            if hit is None:
                out.append(Missing(str(c.point), run_id, c.step_index, detail))
            else:
                unused.remove(hit)
        return out
