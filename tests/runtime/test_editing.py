"""Editing a proposed call before allowing it (policy approvals only): the run executes the
edited request, the audit keeps proposed, edit and effective, and an interrupted call (which
may have happened as proposed) or a tool or agent that forbids it offers no edit. What the
tool did comes from the outside ledger, never from the runtime's record."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack

import pytest

from runtime import (
    Agent,
    Allow,
    Deny,
    FinalAnswer,
    RequireApproval,
    ScriptedLLM,
    ToolCall,
    ToolContext,
    resume,
    start,
    tool,
)
from runtime.agents.agent import registry
from runtime.agents.llm import Transcript
from runtime.approvals.decisions import approval_decide, approve, reject
from runtime.audit.chain import verify
from runtime.canonical import request_digest
from runtime.crashpoints import CrashPoint
from runtime.errors import InvalidEdit
from runtime.models import Approval, Run, Step
from runtime.selectors import approval_edit, approval_edit_schema, approval_editable
from runtime.selectors.approvals import pending
from tests.kit import (
    Ledger,
    broken,
    crash_then_take_over,
    events,
    kinds_after,
    make_agent,
    make_tools,
    snapshot,
    verifyaudit,
)

pytestmark = pytest.mark.engines


def _policy(request, run):
    """Charges over 1000 are never allowed; every other charge asks a person first."""
    if request.tool != "charge":
        return Allow()
    if request.arguments.get("amount", 0) > 1000:
        return Deny("charges over 1000 are not allowed")
    return RequireApproval("Charge a card?", f"{request.arguments}")


class Watching:
    """A scripted model that keeps every transcript it was shown."""

    def __init__(self, amount: int = 900) -> None:
        self.seen: list[list[tuple[str, dict, object]]] = []
        self.amount = amount

    def __call__(self, transcript: Transcript):
        self.seen.append([(e.tool, dict(e.arguments), e.result) for e in transcript.entries])
        if not transcript.entries:
            return ToolCall("charge", {"amount": self.amount})
        return FinalAnswer({"last": transcript.entries[-1].result})


def _paused(agents: ExitStack, name: str, ledger: Ledger,
            clock) -> tuple[Run, Approval, Watching]:
    """A run of a new agent ``name`` (registered until the test ends) paused by its policy
    before charging 900."""
    model = Watching()
    agents.enter_context(registry.override(
        Agent(name, ScriptedLLM(model), make_tools(ledger), policy=_policy)))
    run = start(name, {}, clock=clock)
    run = resume(run.pk, clock=clock, lease_seconds=1)
    assert run.status == "waiting"
    (approval,) = pending()
    assert approval.kind == "policy" and approval.arguments == {"amount": 900}
    return run, approval, model


@pytest.fixture
def agents() -> Iterator[ExitStack]:
    """Agents a test registers, until it ends."""
    with ExitStack() as stack:
        yield stack


def test_an_edited_call_runs_with_the_effective_arguments(database, agents, tmp_path, clock):
    ledger = Ledger(tmp_path / "ledger")
    run, approval, model = _paused(agents, "ed", ledger, clock)
    proposed = approval.digest
    assert approval_editable(approval, "olga")
    assert approval_edit_schema(approval)["properties"]["amount"]["type"] == "integer"

    decided = approval_decide(approval.pk, "approve", "olga", "too much: 90 is the price",
                              arguments={"amount": 90}, now=clock.now())
    effective = request_digest("charge", {"amount": 90}, "side_effect")
    assert decided.status == "approved" and decided.edited_by == "olga"
    assert decided.arguments == {"amount": 900} and decided.digest == proposed  # as proposed
    assert decided.effective_arguments == {"amount": 90}
    assert decided.effective_digest == effective
    assert Step.objects.get(run_id=run.pk, index=1).arguments == {"amount": 90}
    assert ledger.count("charge") == 0  # a decision alone runs nothing

    run = resume(run.pk, clock=clock, lease_seconds=1)
    assert run.status == "succeeded" and run.output == {"last": {"charged": 90}}
    assert [c["amount"] for c in ledger.calls("charge")] == [90]  # the edit, never the proposal
    # The model's next request showed the call as it ran, with its result.
    assert model.seen[-1] == [("charge", {"amount": 90}, {"charged": 90})]

    (edited,) = events(run, "approval.edited")
    assert edited.actor == "olga" and edited.step_index == 1
    assert edited.payload == {
        "approval_id": approval.pk, "edited_by": "olga", "proposed_digest": proposed,
        "effective_digest": effective, "arguments": {"amount": 90},
        "changes": [{"field": "amount", "from": 900, "to": 90}]}
    (granted,) = events(run, "approval.granted")
    assert granted.seq == edited.seq + 1 and granted.payload["effective_digest"] == effective
    assert kinds_after(run, "approval.granted")[2:4] == ["approval.consumed",
                                                         "step.tool_started"]
    shown = approval_edit(Approval.objects.get(pk=approval.pk))
    assert shown is not None and shown["by"] == "olga"
    assert shown["changes"] == [{"field": "amount", "was": True, "from": 900, "now": True,
                                 "to": 90}]
    assert verify(run.pk).ok
    assert "problem" not in verifyaudit("--run", str(run.pk))


def test_replay_catches_an_effective_request_changed_behind_the_audit(database, agents,
                                                                      tmp_path, clock):
    ledger = Ledger(tmp_path / "ledger")
    run, approval, _model = _paused(agents, "tamper", ledger, clock)
    approval_decide(approval.pk, "approve", "olga", arguments={"amount": 90}, now=clock.now())
    Approval.objects.filter(pk=approval.pk).update(effective_arguments={"amount": 9000})
    assert "effective_arguments" in broken("--run", str(run.pk))


def test_the_policy_judges_the_edited_call_again(database, agents, tmp_path, clock):
    ledger = Ledger(tmp_path / "ledger")
    run, approval, _model = _paused(agents, "again", ledger, clock)
    approval_decide(approval.pk, "approve", "olga", arguments={"amount": 5000}, now=clock.now())
    run = resume(run.pk, clock=clock, lease_seconds=1)
    assert run.status == "failed" and run.failure_code == "policy_denied"
    assert ledger.count("charge") == 0
    assert Approval.objects.get(pk=approval.pk).status == "cancelled"
    assert verify(run.pk).ok


@pytest.mark.parametrize("arguments, field", [
    ({"amount": "lots"}, "amount"),  # not an integer
    ({}, "amount"),  # required
    ({"amount": 5, "currency": "EUR"}, "currency"),  # not an argument of the tool
])
def test_a_schema_invalid_edit_is_refused_and_changes_nothing(database, agents, tmp_path,
                                                              clock, arguments, field):
    ledger = Ledger(tmp_path / "ledger")
    run, approval, _model = _paused(agents, "bad", ledger, clock)
    before = snapshot(run.pk)
    with pytest.raises(InvalidEdit) as info:
        approval_decide(approval.pk, "approve", "olga", arguments=arguments, now=clock.now())
    assert list(info.value.fields) == [field] and info.value.fields[field]
    assert "schema" in info.value.reason
    assert snapshot(run.pk) == before


@pytest.mark.parametrize("arguments", [["not", "an", "object"], {"amount": "x" * 2_000_000}])
def test_edits_that_are_not_an_object_or_too_large_are_refused(database, agents, tmp_path,
                                                               clock, arguments):
    ledger = Ledger(tmp_path / "ledger")
    run, approval, _model = _paused(agents, "big", ledger, clock)
    before = snapshot(run.pk)
    with pytest.raises(InvalidEdit):
        approval_decide(approval.pk, "approve", "olga", arguments=arguments, now=clock.now())
    assert snapshot(run.pk) == before


def test_an_edit_goes_with_an_approval_only(database, agents, tmp_path, clock):
    ledger = Ledger(tmp_path / "ledger")
    run, approval, _model = _paused(agents, "rej", ledger, clock)
    before = snapshot(run.pk)
    with pytest.raises(InvalidEdit, match="with an approval only"):
        approval_decide(approval.pk, "reject", "olga", "no", arguments={"amount": 1},
                        now=clock.now())
    assert snapshot(run.pk) == before
    reject(approval.pk, "olga", "no", now=clock.now())  # the same rejection, unedited


def test_arguments_equal_to_the_proposed_ones_are_a_plain_allow(database, agents, tmp_path,
                                                                clock):
    ledger = Ledger(tmp_path / "ledger")
    run, approval, _model = _paused(agents, "same", ledger, clock)
    decided = approval_decide(approval.pk, "approve", "olga", arguments={"amount": 900},
                              now=clock.now())
    assert decided.edited_by == "" and decided.effective_arguments is None
    assert events(run, "approval.edited") == []
    assert "effective_digest" not in events(run, "approval.granted")[0].payload
    run = resume(run.pk, clock=clock, lease_seconds=1)
    assert [c["amount"] for c in ledger.calls("charge")] == [900]


def test_an_interrupted_side_effect_offers_no_edit(database, agents, tmp_path, clock, crash):
    ledger = Ledger(tmp_path / "ledger")
    agent = make_agent("intr", [ToolCall("charge", {"amount": 5}), FinalAnswer("done")], ledger)
    with registry.override(agent):
        run = start("intr", {}, clock=clock)
        run = crash_then_take_over(run.pk, clock, crash, CrashPoint.AFTER_TOOL_EFFECT, 1)
    (approval,) = pending()
    assert approval.kind == "interrupted_side_effect"
    with registry.override(agent):
        assert not approval_editable(approval, "olga")
        assert approval_edit_schema(approval) is None
        before = snapshot(run.pk)
        with pytest.raises(InvalidEdit, match="may already have happened as proposed"):
            approval_decide(approval.pk, "approve", "olga", arguments={"amount": 1},
                            now=clock.now())
        assert snapshot(run.pk) == before
    assert ledger.count("charge") == 1


def _refusing_tool(ledger: Ledger):
    @tool(effect="side_effect", editable=False)
    def charge(ctx: ToolContext, amount: int) -> dict:
        """Charge a card; its amount comes from the agent alone."""
        ledger.record_call("charge", ctx, amount=amount)
        return {"charged": amount}

    return charge


@pytest.mark.parametrize("who", ["tool", "agent"])
def test_a_tool_or_an_agent_can_forbid_editing(database, agents, tmp_path, clock, who):
    ledger = Ledger(tmp_path / "ledger")
    name = f"no-edit-{who}"
    tools = make_tools(ledger)
    if who == "tool":
        tools = [t for t in tools if t.name != "charge"] + [_refusing_tool(ledger)]
    model = Watching()
    agent = Agent(name, ScriptedLLM(model), tools, policy=_policy, editable=who != "agent")
    with registry.override(agent):
        run = resume(start(name, {}, clock=clock).pk, clock=clock, lease_seconds=1)
        (approval,) = pending()
        assert not approval_editable(approval, "olga")
        before = snapshot(run.pk)
        with pytest.raises(InvalidEdit, match=f"{who} .* does not allow"):
            approval_decide(approval.pk, "approve", "olga", arguments={"amount": 1},
                            now=clock.now())
        assert snapshot(run.pk) == before
        approve(approval.pk, "olga", now=clock.now())  # allowing as proposed still works
        run = resume(run.pk, clock=clock, lease_seconds=1)
    assert [c["amount"] for c in ledger.calls("charge")] == [900]


def test_a_pydantic_ai_agent_forbids_editing():
    from pydantic_ai import Agent as PydanticAgent
    from pydantic_ai.models.test import TestModel

    from runtime.agents.pydanticai import PydanticAIAgent

    assert PydanticAIAgent(PydanticAgent(TestModel(), name="pai")).editable is False
