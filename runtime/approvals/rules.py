"""The rules of deciding, written once: which decisions exist, which apply to an approval, and who
may make them."""

from __future__ import annotations

from datetime import datetime

from django.conf import settings

from runtime.canonical import request_digest
from runtime.models import (
    Approval,
    ApprovalKind,
    ApprovalStatus,
    Effect,
)

RESOLVABLE = (ApprovalKind.INTERRUPTED_SIDE_EFFECT, ApprovalKind.RECONCILE)


def approval_request_intact(approval: Approval) -> bool:
    """Whether the request an approval holds (and a page shows) is the one its digest names.
    If someone edited the stored arguments, a person would decide on one request while the
    digest, and the step it is checked against, let another one run."""
    return approval.digest == request_digest(approval.tool, approval.arguments, approval.effect)


def four_eyes() -> bool:
    """Whether the person who started a run is barred from letting its side effects through."""
    return bool(settings.RUNTIME.get("FOUR_EYES", False))


def four_eyes_blocks(approval: Approval, by: str) -> bool:
    """True when four-eyes bars ``by`` from approving or resolving ``approval`` (rejecting
    stays open to everyone: stopping a run is always safe)."""
    return (four_eyes() and approval.effect == Effect.SIDE_EFFECT
            and bool(approval.run.created_by) and approval.run.created_by == by)


def approval_past_deadline(approval: Approval, now: datetime) -> bool:
    """Whether ``approval`` waits past its deadline: every decision on it is refused as too
    late, and the next expiry sweep ends it ``expired``."""
    return (approval.status == ApprovalStatus.PENDING and approval.expires_at is not None
            and approval.expires_at <= now)
