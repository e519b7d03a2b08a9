"""Policy decisions: may a decided request start now, must a person approve it, or never."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from runtime.conf import setting


@dataclass(frozen=True)
class Request:
    """The decided request a policy judges (and an approval is bound to)."""

    tool: str
    arguments: dict[str, Any]
    effect: str
    step_index: int


@dataclass(frozen=True)
class Allow:
    pass


@dataclass(frozen=True)
class RequireApproval:
    """A person must approve the request; with ``expires_in`` (seconds or a timedelta) the
    approval ends ``expired`` if nobody decides in time, and the run fails."""

    title: str
    detail: str = ""
    expires_in: float | timedelta | None = None

    def __post_init__(self) -> None:
        seconds = expiry_seconds(self.expires_in)
        if seconds is not None and seconds <= 0:
            raise ValueError(f"expires_in must be positive, not {self.expires_in!r}")


def expiry_seconds(value: float | timedelta | None) -> float | None:
    return value.total_seconds() if isinstance(value, timedelta) else (
        None if value is None else float(value))


@dataclass(frozen=True)
class Deny:
    reason: str


PolicyDecision = Allow | RequireApproval | Deny


def allow_all(request: Request, run: Any) -> PolicyDecision:
    """The default policy."""
    return Allow()


def default_expiry_seconds(agent: str) -> float | None:
    """The deadline an interrupted-side-effect or reconcile approval gets for ``agent``:
    settings ``RUNTIME["APPROVAL_EXPIRES_SECONDS"]``, a mapping of agent name (or ``"*"`` for
    all) to seconds; none by default (such approvals wait for a person)."""

    table = setting("APPROVAL_EXPIRES_SECONDS") or {}
    seconds = table.get(agent, table.get("*"))
    return None if seconds is None else float(seconds)
