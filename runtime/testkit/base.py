"""What both crash kits share: the outside world's ledger, the crash bookkeeping, the operator
and the invariant check."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import datetime

from ..models import Approval
from .invariants import Report, check_invariants
from .ledger import Ledger
from .operator import Decision, decide, operate
from .reached import Reached


class Kit:
    ledger: Ledger
    reached: Reached

    def decide(self, approval_id: int, decision: Decision, by: str = "kit-operator") -> Approval:
        """Play the operator on one approval (in this process, through the runtime's API)."""
        return decide(approval_id, decision, by)

    def operate(self, choose: Callable[[Approval], Decision | None],
                by: str = "kit-operator") -> list[tuple[Approval, Decision]]:
        """Decide every pending approval with ``choose`` (None leaves it pending)."""
        return operate(choose, by)

    def check(self, runs: Iterable[int] | None = None) -> Report:
        """All six invariants, counting side effects from this kit's ledger."""
        return check_invariants(executions=self.ledger.executions(), reached=self.reached,
                                runs=runs, now=self.now())

    def now(self) -> datetime | None:
        """The time leases are judged by (None: the wall clock)."""
        return None
