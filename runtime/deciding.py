"""Asking the LLM for a step's decision: the request, bounded retries with recorded backoff,
usage charged to the run, and the budget checked before anything is decided."""

from __future__ import annotations

import random
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db.models import F

from . import crashpoints
from .canonical import check_payload, dumps
from .crashpoints import CrashPoint
from .errors import LeaseLost, LLMError
from .llm import Decision, FinalAnswer, LLMResponse, ToolCall
from .models import FailureCode, Step, StepStatus

if TYPE_CHECKING:
    from .driver import Execution

# The longest a wait before an LLM retry goes without checking the lease and should_stop.
_WAIT_SLICE = 0.2


def decide(ex: Execution, step: Step) -> Step | None:
    tx = ex.tx()
    if ex.planned:
        decision = _decision_from_json(ex.planned.pop(0))
        tx.run_fields["planned"] = list(ex.planned)
        return ex.apply_decision(tx, step, decision)
    attempt = 1
    while True:
        if ex.lease.lost:
            raise LeaseLost(ex.lease.run_id, ex.lease.owner, "lease lost (heartbeat)")
        if ex.should_stop():  # the step stays deciding; whoever claims it next decides it
            ex.stop_here(tx)
            return None
        crashpoints.reached(CrashPoint.DURING_LLM_REQUEST, run_id=ex.run.pk,
                            step_index=step.index)
        try:
            response = ex.agent.llm.complete(ex.transcript, ex.agent.tool_specs)
            decisions = _checked_decisions(response)
            break
        except LeaseLost:
            raise
        except Exception as exc:
            if not llm_failed(ex, step, exc, attempt):
                return None
        attempt += 1
        tx = ex.tx()
    tx = ex.tx()
    usage = response.usage
    tx.event("llm.responded", {"tokens_in": usage.tokens_in, "tokens_out": usage.tokens_out,
                               "cost": str(usage.cost), "decisions": len(decisions)},
             step.index)
    tx.run_fields.update(tokens_in=F("tokens_in") + usage.tokens_in,
                         tokens_out=F("tokens_out") + usage.tokens_out,
                         cost=F("cost") + Decimal(usage.cost))
    ex.tokens += usage.tokens_in + usage.tokens_out
    ex.cost += Decimal(usage.cost)
    ex.planned = [_decision_to_json(d) for d in decisions[1:]]
    tx.run_fields["planned"] = list(ex.planned)
    over = over_budget(ex)
    if over:
        tx.step_update(step, status=StepStatus.FAILED, error=over, finished_at=tx.now)
        ex.fail(tx, FailureCode.BUDGET_EXCEEDED, over)
        ex.commit(tx)
        return None
    return ex.apply_decision(tx, step, decisions[0])

def llm_failed(ex: Execution, step: Step, exc: Exception, attempt: int) -> bool:
    """Record a failed LLM request; True once the same request may be sent again.

    A retryable ``LLMError`` gets up to ``llm.max_retries`` (else ``RUNTIME["LLM_RETRIES"]``,
    default 3) more attempts, each after its ``llm.failed`` is committed and a backoff has
    passed. A retry is the same request, not a new one: it is no new step, charges no
    usage and does not count toward ``Budget.max_llm_requests`` (the retry limit bounds
    it); its ``llm.requested`` carries the same request number and the attempt. Anything
    else, or the last allowed attempt failing, fails the step and the run (``error``).
    """
    retryable = isinstance(exc, LLMError) and exc.retryable
    message = str(exc) if isinstance(exc, LLMError) else f"{type(exc).__name__}: {exc}"
    payload: dict[str, Any] = {"error": message, "attempt": attempt, "retryable": retryable}
    if isinstance(exc, LLMError) and exc.status is not None:
        payload["status"] = exc.status
    tx = ex.tx()
    if not retryable or attempt > _llm_retries(ex.agent.llm):
        tx.event("llm.failed", payload, step.index)
        tx.step_update(step, status=StepStatus.FAILED, error=message, finished_at=tx.now)
        ex.fail(tx, FailureCode.ERROR, f"LLM request failed: {message}")
        ex.commit(tx)
        return False
    delay = _retry_delay(attempt, exc.retry_after)
    tx.event("llm.failed", {**payload, "retry_in": delay}, step.index)
    ex.commit(tx)
    if not wait_before_retry(ex, delay):
        ex.stop_here(ex.tx())
        return False
    tx = ex.tx()
    tx.event("llm.requested", {"request": ex.llm_requests, "attempt": attempt + 1},
             step.index)
    ex.commit(tx)  # gated: the retry goes out only under a live, unexpired lease
    return True

def wait_before_retry(ex: Execution, seconds: float) -> bool:
    """Let ``seconds`` pass in short slices; False as soon as this process must stop.

    Raises ``LeaseLost`` when the heartbeat finds the lease gone, so nothing is sent.
    """
    remaining = seconds
    while True:
        if ex.lease.lost:
            raise LeaseLost(ex.lease.run_id, ex.lease.owner, "lease lost (heartbeat)")
        if ex.should_stop():
            return False
        if remaining <= 0:
            return True
        chunk = min(remaining, _WAIT_SLICE)
        ex.driver.sleep(chunk)
        remaining -= chunk

def over_budget(ex: Execution) -> str:
    budget = ex.agent.budget
    if budget.max_tokens is not None and ex.tokens > budget.max_tokens:
        return f"{ex.tokens} tokens exceed the budget of {budget.max_tokens}"
    if budget.max_cost is not None and ex.cost > Decimal(budget.max_cost):
        return f"cost {ex.cost} exceeds the budget of {budget.max_cost}"
    return ""


def _llm_retries(llm: Any) -> int:
    limit = getattr(llm, "max_retries", None)
    return int(settings.RUNTIME.get("LLM_RETRIES", 3) if limit is None else limit)


def _retry_delay(attempt: int, retry_after: float | None) -> float:
    """Seconds before retry ``attempt + 1``: the server's ``Retry-After`` if it gave one, else
    exponential backoff with jitter; never more than ``RUNTIME["LLM_RETRY_MAX_SECONDS"]``."""
    cap = float(settings.RUNTIME.get("LLM_RETRY_MAX_SECONDS", 30))
    if retry_after is None:
        base = float(settings.RUNTIME.get("LLM_RETRY_BASE_SECONDS", 1))
        delay = base * 2 ** (attempt - 1) * random.uniform(0.5, 1.0)
    else:
        delay = retry_after
    return round(min(max(delay, 0.0), cap), 3)


def _checked_decisions(response: Any) -> list[Decision]:
    if not isinstance(response, LLMResponse):
        raise TypeError(f"the LLM returned {type(response).__name__}, not an LLMResponse")
    decisions = list(response.decisions)
    if not decisions:
        raise ValueError("the LLM returned no decision")
    for d in decisions:
        if not isinstance(d, ToolCall | FinalAnswer):
            raise TypeError(f"the LLM returned {d!r}, not a ToolCall or FinalAnswer")
        if isinstance(d, ToolCall):
            if not isinstance(d.arguments, dict):
                raise TypeError(f"the LLM gave {d.tool!r} arguments that are not an object")
            dumps(d.arguments)  # raises for values JSON cannot hold
    return decisions


def _decision_to_json(d: Decision) -> dict[str, Any]:
    if isinstance(d, FinalAnswer):
        return {"final": check_payload("final answer", d.output)}
    return {"tool": d.tool, "arguments": d.arguments}


def _decision_from_json(data: dict[str, Any]) -> Decision:
    if "final" in data:
        return FinalAnswer(data["final"])
    return ToolCall(data["tool"], data.get("arguments") or {})
