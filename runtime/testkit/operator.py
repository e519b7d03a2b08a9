"""Playing the operator in tests: approve one re-run, reject, or resolve with a result."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from runtime.approvals import rules
from runtime.approvals.decisions import approval_decide
from runtime.models import Approval, ApprovalStatus


@dataclass(frozen=True)
class Decision:
    """What a person decides on an approval."""

    action: rules.Decision  # "approve" | "resolve" | "reject"
    result: Any = None
    note: str = ""

    def __post_init__(self) -> None:
        if self.action not in set(rules.Decision):
            raise ValueError(f"unknown decision {self.action!r}")

    def applies_to(self, approval: Approval) -> bool:
        """Resolve needs an interrupted step; a policy approval is approved or rejected."""
        return self.action != rules.Decision.RESOLVE or rules.approval_resolvable(approval)


APPROVE = Decision(rules.Decision.APPROVE, note="run it once more")
REJECT = Decision(rules.Decision.REJECT, note="rejected by the test operator")


def resolve_with(result: Any) -> Decision:
    return Decision(rules.Decision.RESOLVE, result=result, note="checked outside: it happened")


def decide(approval_id: int, decision: Decision, by: str = "kit-operator") -> Approval:
    note = decision.note or ("rejected" if decision.action == rules.Decision.REJECT else "")
    return approval_decide(approval_id, decision.action, by, note, result=decision.result)


def operate(choose: Callable[[Approval], Decision | None],
            by: str = "kit-operator") -> list[tuple[Approval, Decision]]:
    """Decide every pending approval, oldest first, with ``choose`` (None leaves it pending)."""
    done = []
    for approval in Approval.objects.filter(status=ApprovalStatus.PENDING).select_related(
            "step").order_by("pk"):
        decision = choose(approval)
        if decision is not None:
            done.append((decide(approval.pk, decision, by), decision))
    return done
