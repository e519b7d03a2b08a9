"""What an agent's ``reconcile(view)`` sees and may answer after its run was interrupted."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ReconcileView:
    """The interrupted run as recorded, and the request whose outcome is unknown."""

    run: Any  # runtime.models.Run
    steps: list[Any]  # runtime.models.Step, in order
    events: list[Any]  # runtime.models.Event, in order
    step: Any  # the interrupted step
    tool: str
    arguments: dict[str, Any]
    effect: str
    idempotency_key: str
    attempt: int
    dispatched: bool  # step.tool_dispatched was recorded for this attempt
    # Why this attempt's call may still take effect after the reconcile looks ("" if it
    # cannot): its worker lost the lease without being proved dead. A ``Continue`` then goes
    # to a person (an approval of kind ``reconcile``) instead of re-running at once.
    may_still_land: str = ""


@dataclass(frozen=True)
class Continue:
    """The consumer vouches the request may run again: re-run it on the same step (or, while
    the interrupted call may still land, ask a person first; see ``may_still_land``)."""


@dataclass(frozen=True)
class Complete:
    """The consumer found the call's outcome: record ``result`` and continue the run."""

    result: Any


@dataclass(frozen=True)
class Wait:
    """Put the question to a person: an approval of kind ``reconcile`` with this text."""

    title: str
    detail: str = ""


@dataclass(frozen=True)
class Conflict:
    """The run cannot go on: it fails ``reconcile_conflict``."""

    reason: str


ReconcileOutcome = Continue | Complete | Wait | Conflict
