"""Every error the runtime raises, with typed attributes so callers need not parse messages."""

from __future__ import annotations

from datetime import datetime
from typing import Any


class AgentRuntimeError(Exception):
    """Base of the runtime's errors."""


class LeaseLost(AgentRuntimeError):
    """This process no longer holds the run's lease: it must stop before its next call."""

    def __init__(
        self, run_id: int, owner: str, reason: str = "lease lost", *, expired_but_held: bool = False
    ) -> None:
        self.run_id, self.owner, self.reason = run_id, owner, reason
        # True when only the wall-clock check failed: nobody else holds the run yet.
        self.expired_but_held = expired_but_held
        super().__init__(f"run {run_id}: {reason} (owner {owner})")


class RunLeased(AgentRuntimeError):
    """The run's lease is live and held by another owner; nothing was changed."""

    def __init__(self, run_id: int, holder: str, expires_at: datetime | None) -> None:
        self.run_id, self.holder, self.expires_at = run_id, holder, expires_at
        super().__init__(f"run {run_id} is leased by {holder} until {expires_at}")


class RunNotResumable(AgentRuntimeError):
    """The run is in a state that cannot be resumed (finished, or waiting on an operator)."""

    def __init__(self, run_id: int, status: str) -> None:
        self.run_id, self.status = run_id, status
        super().__init__(f"run {run_id} cannot be resumed: it is {status}")


class RunNotFound(AgentRuntimeError):
    """No run has this id."""

    def __init__(self, run_id: Any) -> None:
        self.run_id = run_id
        super().__init__(f"no run with id {run_id!r}")


class ApprovalConflict(AgentRuntimeError):
    """The approval was already decided, or its request no longer matches the step (stale).

    ``reason_code`` says which, so callers (the JSON API) need not parse ``reason``:
    ``decided`` (someone decided first), ``expired`` (its deadline passed), ``stale`` (the
    request it holds is not the one that would run) or ``retry`` (the run changed meanwhile;
    deciding again may succeed)."""

    REASON_CODES = ("decided", "expired", "stale", "retry")

    def __init__(
        self,
        approval_id: int,
        reason: str,
        *,
        status: str = "",
        decided_by: str = "",
        decided_at: datetime | None = None,
        reason_code: str = "decided",
    ) -> None:
        self.approval_id, self.reason, self.status = approval_id, reason, status
        self.decided_by, self.decided_at = decided_by, decided_at
        self.reason_code = reason_code
        super().__init__(reason)


class ReconcileConflict(AgentRuntimeError):
    """Reconciliation found the interrupted step cannot continue or wait: the run fails."""

    def __init__(self, run_id: int, step_index: int, reason: str) -> None:
        self.run_id, self.step_index, self.reason = run_id, step_index, reason
        super().__init__(f"run {run_id} step {step_index}: {reason}")


class PolicyDenied(AgentRuntimeError):
    """The agent's policy denied a request; the run fails ``policy_denied``."""

    def __init__(self, run_id: int, step_index: int, reason: str) -> None:
        self.run_id, self.step_index, self.reason = run_id, step_index, reason
        super().__init__(f"run {run_id} step {step_index}: policy denied: {reason}")


class BudgetExceeded(AgentRuntimeError):
    """A run went past one of its budget limits; the run fails ``budget_exceeded``."""

    def __init__(self, run_id: int, limit: str, value: Any, maximum: Any) -> None:
        self.run_id, self.limit, self.value, self.maximum = run_id, limit, value, maximum
        super().__init__(f"run {run_id}: {limit} {value} exceeds the budget of {maximum}")


class ToolNotRegistered(AgentRuntimeError):
    """The agent has no tool by this name."""

    def __init__(self, agent: str, tool: str) -> None:
        self.agent, self.tool = agent, tool
        super().__init__(f"agent {agent!r} has no tool {tool!r}")


class InvalidArguments(AgentRuntimeError):
    """Tool arguments (or a run's input) failed validation."""

    def __init__(self, tool: str, errors: str, fields: dict[str, str] | None = None) -> None:
        # ``fields``: each top-level argument named by an error, and what is wrong with it
        # ("" for the object as a whole), so a form can show each next to its field.
        self.tool, self.errors, self.fields = tool, errors, dict(fields or {})
        super().__init__(f"invalid arguments for {tool!r}: {errors}")


class InvalidPayload(AgentRuntimeError):
    """A value that must be stored is not JSON-serialisable or is larger than allowed."""

    def __init__(self, what: str, reason: str) -> None:
        self.what, self.reason = what, reason
        super().__init__(f"{what}: {reason}")


class UnknownAgent(AgentRuntimeError):
    """No agent with this name is registered (settings RUNTIME["AGENTS"])."""

    def __init__(self, name: str, known: list[str]) -> None:
        self.name, self.known = name, known
        super().__init__(f"unknown agent {name!r}; registered: {', '.join(known) or 'none'}")


class CallOutcomeUnknown(AgentRuntimeError):
    """A tool cannot tell whether its call took effect (its server went away mid-call)."""

    def __init__(self, tool: str, reason: str) -> None:
        self.tool, self.reason = tool, reason
        super().__init__(f"{tool}: whether the call took effect is unknown: {reason}")


class MCPServerDown(AgentRuntimeError):
    """An MCP server could not be reached; the call was never sent."""

    def __init__(self, server: str, reason: str) -> None:
        self.server, self.reason = server, reason
        super().__init__(f"MCP server {server} is down: {reason}")


class MCPToolError(AgentRuntimeError):
    """An MCP server answered a tool call with an error."""

    def __init__(self, server: str, tool: str, reason: str) -> None:
        self.server, self.tool, self.reason = server, tool, reason
        super().__init__(f"{tool} on MCP server {server} failed: {reason}")


class ReplayDiverged(AgentRuntimeError):
    """A resumed agent asked for something other than what its run recorded at this point."""

    def __init__(self, run_id: int, step_index: int | None, recorded: str, asked: str) -> None:
        self.run_id, self.step_index = run_id, step_index
        self.recorded, self.asked = recorded, asked
        super().__init__(f"run {run_id} step {step_index}: the agent asked for {asked} where "
                         f"the run recorded {recorded}; its code must make the same calls in "
                         "the same order when resumed")


class SimulatedCrash(BaseException):
    """Raised by an armed in-process crash point; BaseException so user code cannot swallow it."""

    def __init__(self, point: str, run_id: int | None, step_index: int | None) -> None:
        self.point, self.run_id, self.step_index = point, run_id, step_index
        super().__init__(f"simulated crash at {point} (run {run_id}, step {step_index})")


class InvalidDecision(AgentRuntimeError):
    """An operator's decision does not apply to this approval (e.g. resolve on a policy one)."""

    def __init__(self, approval_id: int, reason: str) -> None:
        self.approval_id, self.reason = approval_id, reason
        super().__init__(f"approval {approval_id}: {reason}")


class InvalidEdit(InvalidDecision):
    """Edited arguments of a policy approval were refused (by its tool's schema, or because
    its request may not be edited); ``fields`` names each argument at fault."""

    def __init__(self, approval_id: int, reason: str,
                 fields: dict[str, str] | None = None) -> None:
        self.fields = dict(fields or {})
        super().__init__(approval_id, reason)


class InvariantViolation(AssertionError):
    """The crash test kit found a broken invariant (design §11); the message names the evidence."""

    def __init__(self, violations: list[Any]) -> None:
        self.violations = list(violations)
        lines = "\n".join(f"  - {v}" for v in self.violations)
        super().__init__(f"{len(self.violations)} invariant violation(s):\n{lines}")


class CrashNotReached(AssertionError):
    """A crash the test asked for never happened, so the test did not test what it claims."""

    def __init__(self, point: str, run_id: int | None, step_index: int | None,
                 detail: str = "") -> None:
        self.point, self.run_id, self.step_index = point, run_id, step_index
        where = f" at step {step_index}" if step_index is not None else ""
        super().__init__(f"crash point {point}{where} of run {run_id} was never reached"
                         + (f": {detail}" if detail else ""))


class FourEyesViolation(AgentRuntimeError):
    """Four-eyes is on: the person who started a run may not approve or resolve its side effect."""

    def __init__(self, approval_id: int, run_id: int, user: str) -> None:
        self.approval_id, self.run_id, self.user = approval_id, run_id, user
        super().__init__(f"approval {approval_id}: {user} started run {run_id}, so someone else "
                         "must approve or resolve its side effect (four-eyes)")


class BatchRefused(AgentRuntimeError):
    """A batch of decisions was refused whole, nothing decided: ``refusals`` maps each refused
    approval's id to its typed error; none when the batch itself is wrong (``reason``)."""

    def __init__(self, reason: str, refusals: dict[int, AgentRuntimeError] | None = None) -> None:
        self.reason, self.refusals = reason, dict(refusals or {})
        named = "; ".join(f"{pk}: {exc}" for pk, exc in sorted(self.refusals.items()))
        super().__init__(f"{reason} ({named})" if named else reason)


class LLMError(AgentRuntimeError):
    """An LLM request failed; ``retryable`` says whether asking again may succeed."""

    def __init__(
        self,
        message: str,
        *,
        retryable: bool,
        retry_after: float | None = None,
        status: int | None = None,
    ) -> None:
        self.message, self.retryable = message, retryable
        self.retry_after, self.status = retry_after, status
        super().__init__(message)


class ProtocolMismatch(AgentRuntimeError):
    """The database speaks another runtime protocol than this code: it claims nothing."""

    def __init__(self, database: int | None, code: int) -> None:
        self.database, self.code = database, code
        if database is None:
            why = "the database carries no protocol version: run `manage.py migrate` first"
        elif database > code:
            why = (f"the database speaks protocol {database}, this worker only {code}: it is "
                   "older than the runtime that migrated the database; deploy the new version")
        else:
            why = (f"the database speaks protocol {database}, this worker {code}: run "
                   "`manage.py migrate` before starting workers of this version")
        super().__init__(f"refusing to claim runs: {why}")


class AuditKeyError(AgentRuntimeError):
    """The audit signing key (``RUNTIME_AUDIT_KEY``) is missing or too short to sign with."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"cannot sign or check audit checkpoints: {reason}")


class CheckpointRefused(AgentRuntimeError):
    """An audit checkpoint could not be written or read: not one, altered, or another key's."""

    def __init__(self, path: str, reason: str) -> None:
        self.path, self.reason = path, reason
        super().__init__(f"{path}: {reason}" if path else reason)


class AuthorizationWithdrawn(AgentRuntimeError):
    """A schedule's standing authorization was turned off as a start it allowed was committed:
    the start was not written, and a person is asked instead."""

    def __init__(self, run_id: int, step_index: int | None) -> None:
        self.run_id, self.step_index = run_id, step_index
        super().__init__(f"run {run_id} step {step_index}: the standing authorization was "
                         "withdrawn before the start was committed")


class RestoreRefused(AgentRuntimeError):
    """A backup could not be taken or restored, or a database not fenced; nothing was changed."""

    def __init__(self, path: str, reason: str) -> None:
        self.path, self.reason = path, reason
        super().__init__(f"{path}: {reason}" if path else reason)


class DatabaseBehind(AgentRuntimeError):
    """The database is behind a signed checkpoint newer than its last restore: it was restored
    by hand and not fenced, so its runs could repeat side effects."""

    def __init__(self, checkpoint: str, problems: list[str]) -> None:
        self.checkpoint, self.problems = checkpoint, problems
        super().__init__(
            f"the database is behind the audit checkpoint {checkpoint} ({problems[0]}"
            + (f", and {len(problems) - 1} more" if len(problems) > 1 else "") + "): it was "
            "restored from a backup without `manage.py restore`. Run `manage.py restore "
            "--acknowledge` to hold its unfinished runs for a person, then start the workers")


class PruneRefused(AgentRuntimeError):
    """A prune could not start or go on; every batch it committed before is whole and on record."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"prune refused: {reason}")


class ArchiveRefused(AgentRuntimeError):
    """An archive of pruned runs could not be written or read: missing, altered, or not one."""

    def __init__(self, path: str, reason: str) -> None:
        self.path, self.reason = path, reason
        super().__init__(f"{path}: {reason}" if path else reason)


class ExportRefused(AgentRuntimeError):
    """An audit export was refused before writing anything: ``field`` is the bad input."""

    def __init__(self, field: str, reason: str) -> None:
        self.field, self.reason = field, reason
        super().__init__(f"{field}: {reason}" if field else reason)


class InvalidSchedule(AgentRuntimeError):
    """A schedule's field is not acceptable (or it changed meanwhile); nothing was written."""

    def __init__(self, field: str, reason: str) -> None:
        self.field, self.reason = field, reason
        super().__init__(f"{field}: {reason}")


class ScheduleNotFound(AgentRuntimeError):
    """No schedule has this id (or it was removed)."""

    def __init__(self, schedule_id: Any) -> None:
        self.schedule_id = schedule_id
        super().__init__(f"no schedule with id {schedule_id!r}")


def one_line(exc: BaseException) -> str:
    """An error on one line of a log, at most 300 characters."""
    return " ".join(str(exc).split())[:300] or type(exc).__name__
