"""Playing the operator in tests: approve one re-run, reject, or resolve with a result."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from runtime.approvals import decisions as approvals
from runtime.models import Approval, ApprovalKind, ApprovalStatus


@dataclass(frozen=True)
class Decision:
    """What a person decides on an approval."""

    action: str  # "approve" | "reject" | "resolve"
    result: Any = None
    note: str = ""

    def __post_init__(self) -> None:
        if self.action not in ("approve", "reject", "resolve"):
            raise ValueError(f"unknown decision {self.action!r}")

    def applies_to(self, approval: Approval) -> bool:
        """Resolve needs an interrupted step; a policy approval is approved or rejected."""
        return self.action != "resolve" or approval.kind != ApprovalKind.POLICY


APPROVE = Decision("approve", note="run it once more")
REJECT = Decision("reject", note="rejected by the test operator")


def resolve_with(result: Any) -> Decision:
    return Decision("resolve", result=result, note="checked outside: it happened")


def decide(approval_id: int, decision: Decision, by: str = "kit-operator") -> Approval:
    if decision.action == "approve":
        return approvals.approve(approval_id, by, decision.note)
    if decision.action == "reject":
        return approvals.reject(approval_id, by, decision.note or "rejected")
    return approvals.resolve(approval_id, by, decision.result, decision.note)


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
