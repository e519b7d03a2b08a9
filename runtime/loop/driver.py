"""The driver: takes a run's lease and executes it step by step, following the design's loop
(§5): recover what a takeover found, decide each step, run its tool, record the outcome.

The run's state and the transitions it commits live in ``runtime.loop.execution``; what a resumed
run does first in ``runtime.loop.recovery``; asking the LLM in ``runtime.loop.deciding``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from runtime import crashpoints
from runtime.agents.agent import get_agent
from runtime.agents.aio import pause
from runtime.agents.pydanticai import PydanticAIAgent
from runtime.agents.tools import ToolContext
from runtime.canonical import check_payload
from runtime.clock import SYSTEM_CLOCK, Clock
from runtime.conf import setting
from runtime.crashpoints import CrashPoint
from runtime.errors import CallOutcomeUnknown, InvalidPayload, LeaseLost, UnknownAgent
from runtime.leasing.claims import Acquired, acquired_crash_points, run_acquire
from runtime.leasing.heartbeat import LeaseKeeper, make_owner
from runtime.leasing.lease import Committer, lease_commit
from runtime.loop.deciding import decide
from runtime.loop.execution import AGENT_LOADED, Execution
from runtime.loop.recovery import interrupted, recover
from runtime.meters import STEP_SECONDS
from runtime.models import FailureCode, Run, Step, StepStatus
from runtime.storage.connections import connection_release


class Driver:
    """Acquires runs and executes them until they pause, end, or the lease is lost."""

    def __init__(
        self,
        owner: str | None = None,
        *,
        name: str = "runtime",
        lease_seconds: float | None = None,
        clock: Clock | None = None,
        keeper: LeaseKeeper | None = None,
        owner_is_dead: Any = None,
        sleep: Callable[[float], Any] | None = None,
        committer: Committer = lease_commit,
    ) -> None:
        self.owner = owner or make_owner(name)
        self.lease_seconds = float(lease_seconds or setting("LEASE_SECONDS"))
        self.clock = clock or SYSTEM_CLOCK
        self.keeper = keeper
        self.owner_is_dead = owner_is_dead
        # How a wait before an LLM retry passes time, in short slices (tests pass a fast one).
        self.sleep = sleep or pause
        self.committer = committer  # who executes the plans (``Execution.committer``)

    def drive(self, run_id: int) -> Run:
        """Take the run's lease (claim, or take over an expired one) and execute it.

        Returns the run once it is paused, finished or failed. Raises ``RunLeased`` if someone
        else holds a live lease, ``LeaseLost`` if this process lost it while executing.
        """
        return self.execute(self.acquire(run_id))

    def acquire(self, run_id: int) -> Acquired:
        """Take the run's lease in one transaction; nothing else is done yet."""
        acquired = run_acquire(run_id, self.owner, lease_seconds=self.lease_seconds,
                               clock=self.clock, owner_is_dead=self.owner_is_dead)
        acquired_crash_points(acquired)
        return acquired

    def execute(self, acquired: Acquired, should_stop: Callable[[], bool] | None = None,
                *, reload: bool = True) -> Run:
        """Execute an acquired run, heartbeating its lease, until it pauses or ends.

        ``should_stop`` is polled between steps; when it turns true the run is released
        (``run.released``, queued again) at the next point where nothing is in flight.
        Returns the run read back from the database, or with ``reload=False`` the claimed
        run object with only its status brought up to date (a worker needs no more).
        """
        keeper = self.keeper
        own_keeper = keeper is None
        if keeper is None:
            keeper = LeaseKeeper(self.lease_seconds, clock=self.clock).start()
        keeper.add(acquired.lease)
        try:
            execution = Execution(
                acquired.lease, acquired.run, None, clock=self.clock, should_stop=should_stop,
                first_claim=not (acquired.resumed or acquired.taken_over), sleep=self.sleep,
                committer=self.committer)
            run_loop(execution)
        finally:
            keeper.discard(acquired.lease)
            if own_keeper:
                keeper.stop()
        if not reload:
            acquired.run.status = execution.status
            return acquired.run
        return Run.objects.get(pk=acquired.run.pk)


def run_loop(ex: Execution) -> None:
    """Recover, then decide and run steps until the run pauses, ends or is released."""
    try:
        ex.agent = get_agent(ex.run.agent)
    except UnknownAgent as exc:
        plan = ex.plan()
        ex.fail(plan, FailureCode.ERROR, str(exc))
        ex.commit(plan)
        return
    if isinstance(ex.agent, PydanticAIAgent):  # it keeps its own loop; the record is ours
        from runtime.loop.pydanticai import run_pydantic_ai  # (Pydantic AI loads where used)

        run_pydantic_ai(ex)
        return
    step = recover(ex)
    while step is not None:
        if step.status == StepStatus.DECIDING:
            step = decide(ex, step)
        elif step.status == StepStatus.EXECUTING:
            step = run_tool(ex, step)
        else:  # pragma: no cover - a bug, not a state the loop can reach
            raise AssertionError(f"run {ex.run.pk} step {step.index} is {step.status}")


def run_tool(ex: Execution, step: Step) -> Step | None:
    """Call the step's tool, record its outcome and begin the next step, in one commit."""
    assert ex.agent is not None, AGENT_LOADED
    tool = ex.agent.tools[step.tool]
    kwargs = ex.validated.pop(step.index, None)
    if kwargs is None:  # decided by an earlier execution of the run
        kwargs = tool.validate(step.arguments)
    ctx = ToolContext(ex.run.pk, step.index, step.attempt, step.idempotency_key,
                      ex.agent.name, _on_dispatch=lambda: ex.record_dispatch(step))
    ex.check_lease()
    result, error = None, ""
    connection_release()  # the tool's wait holds no connection of the database's
    try:
        result = tool.invoke(ctx, kwargs)
    except LeaseLost:
        raise
    except CallOutcomeUnknown as exc:  # as if the process had died mid-call: the contract
        return interrupted(ex, step, exc.reason)  # decides
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
    crashpoints.reached(CrashPoint.AFTER_TOOL_EFFECT, run_id=ex.run.pk, step_index=step.index)
    if not error:
        try:
            result = check_payload(f"result of {tool.name}", result)
        except InvalidPayload as exc:
            result, error = None, str(exc)
    plan = ex.plan()
    STEP_SECONDS.observe(max(0.0, (plan.at - step.started_at).total_seconds()))
    ex.record_outcome(plan, step, result, error)
    try:
        return ex.begin_step(plan, step.index + 1)
    except LeaseLost as exc:
        if not exc.expired_but_held:
            raise
        # Expired but nobody took it: the result is still ours to record; start nothing.
        plan = ex.plan()
        ex.record_outcome(plan, step, result, error)
        ex.commit(plan)
        raise
