"""Policy decisions: may a decided request start now, must a person approve it, or never."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


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
    title: str
    detail: str = ""


@dataclass(frozen=True)
class Deny:
    reason: str


PolicyDecision = Allow | RequireApproval | Deny


def allow_all(request: Request, run: Any) -> PolicyDecision:
    """The default policy."""
    return Allow()
