"""The approval rows a plan writes, in the caller's transaction, and ``approval_written``: the
signal through which a feature adds rows of its own to that same transaction (the
notifications' outbox does), so storage need not know it."""

from __future__ import annotations

from django.db.models import Q
from django.dispatch import Signal

from runtime.models import Approval, ApprovalStatus
from runtime.storage.base import Refused
from runtime.storage.plan import Plan

# Sent inside the transaction that writes an approval: once it is created (``status``
# "pending") and for every move (``status`` the one it moves to). Keyword arguments:
# ``approval_id``, ``status``, ``at`` (the commit's time). A receiver that raises fails the
# commit: nothing of it is written.
approval_written = Signal()


def write_approvals_in_tx(plan: Plan) -> None:
    """The plan's approval rows (moves first: a new approval of a step needs the old one
    moved), each announced to ``approval_written``'s receivers inside the transaction."""
    move_approvals(plan)
    if plan.approval_create is not None:
        draft = plan.approval_create
        draft.payload["approval_id"] = Approval.objects.create(**draft.fields).pk
        approval_written.send(Plan, approval_id=draft.payload["approval_id"],
                              status=ApprovalStatus.PENDING, at=plan.at)
    for move in plan.approval_moves:
        status = move.fields.get("status")
        if status:
            approval_written.send(Plan, approval_id=move.pk, status=status, at=plan.at)


def move_approvals(plan: Plan) -> None:
    """The plan's approval compare-and-sets, in the caller's transaction (rare: a pause, a
    consumption, a decision; through the ORM on both engines)."""
    for move in plan.approval_moves:
        found = Approval.objects.filter(pk=move.pk, status=move.from_status)
        if move.open_at is not None:
            found = found.filter(Q(expires_at__isnull=True) | Q(expires_at__gt=move.open_at))
        if move.expired_by is not None:
            found = found.filter(expires_at__lte=move.expired_by)
        moved = found.update(**move.fields)
        if move.required and moved != 1:
            raise Refused(f"approval {move.pk} is no longer {move.from_status}", move.pk)
