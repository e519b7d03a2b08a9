"""A durable agent runtime: runs, steps and an audit log in one database, leases with
heartbeats, and a person deciding whenever a side effect's outcome is unknown.

The public API is small; everything here can be imported before Django's apps are ready.
"""

from typing import Any

from runtime.agents.agent import Agent, Budget
from runtime.agents.llm import (
    LLM,
    FinalAnswer,
    LLMResponse,
    ScriptedLLM,
    ToolCall,
    Transcript,
    Usage,
)
from runtime.agents.openai import AsyncOpenAIChat, OpenAIChat
from runtime.agents.policy import Allow, Deny, Request, RequireApproval
from runtime.agents.reconcile import Complete, Conflict, Continue, ReconcileView, Wait
from runtime.agents.tools import ToolContext, tool
from runtime.errors import (
    ApprovalConflict,
    BudgetExceeded,
    FourEyesViolation,
    InvalidArguments,
    InvalidDecision,
    InvalidPayload,
    LeaseLost,
    LLMError,
    PolicyDenied,
    ProtocolMismatch,
    ReconcileConflict,
    RunLeased,
    RunNotFound,
    RunNotResumable,
    ToolNotRegistered,
    UnknownAgent,
)

__all__ = [
    "LLM",
    "Agent",
    "Allow",
    "ApprovalConflict",
    "AsyncOpenAIChat",
    "Budget",
    "BudgetExceeded",
    "Complete",
    "Conflict",
    "Continue",
    "Deny",
    "FinalAnswer",
    "FourEyesViolation",
    "InvalidArguments",
    "InvalidDecision",
    "InvalidPayload",
    "LLMError",
    "LLMResponse",
    "LeaseLost",
    "OpenAIChat",
    "PolicyDenied",
    "ProtocolMismatch",
    "ReconcileConflict",
    "ReconcileView",
    "Request",
    "RequireApproval",
    "RunLeased",
    "RunNotFound",
    "RunNotResumable",
    "ScriptedLLM",
    "ToolCall",
    "ToolContext",
    "ToolNotRegistered",
    "Transcript",
    "UnknownAgent",
    "Usage",
    "Wait",
    "cancel",
    "resume",
    "start",
    "tool",
]


def start(agent_name: str, input: Any, created_by: str = "", **kw: Any) -> Any:
    """Create a queued run; see ``runtime.loop.control.start``."""
    from runtime.loop.control import start as _start

    return _start(agent_name, input, created_by, **kw)


def resume(run_id: int, owner: str | None = None, **kw: Any) -> Any:
    """Execute a run until it pauses or ends; see ``runtime.loop.control.resume``."""
    from runtime.loop.control import resume as _resume

    return _resume(run_id, owner, **kw)


def cancel(run_id: int, by: str, reason: str = "", **kw: Any) -> Any:
    """Cancel a queued or waiting run; see ``runtime.loop.control.cancel``."""
    from runtime.loop.control import cancel as _cancel

    return _cancel(run_id, by, reason, **kw)
