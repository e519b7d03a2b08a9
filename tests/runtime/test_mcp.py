"""Tools from a real MCP server process (``tests/mcp_server.py`` over stdio, started for each
call and ended with it): the effect each gets from its annotations, the trusted-server setting
and the operator's override; a server that is down is a failure the agent sees; a server that
dies mid-call leaves an interrupted call (read-only: made again; side effect: a person)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys

import pytest
from pydantic_ai import Agent as PydanticAgent
from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import FunctionModel

from runtime import Agent, FinalAnswer, ScriptedLLM, ToolCall, resume, start
from runtime.agents.agent import registry
from runtime.agents.aio import run_awaitable
from runtime.agents.mcp import MCPServer
from runtime.agents.pydanticai import PydanticAIAgent
from runtime.approvals.decisions import approve
from runtime.audit.chain import verify
from runtime.models import Step
from runtime.selectors.approvals import pending
from tests.kit import Ledger, events
from tests.procs import ROOT
from tests.waiting import wait_until

pytestmark = pytest.mark.engines


def orders(tmp_path, **kw) -> MCPServer:
    return MCPServer("orders", command=[sys.executable, str(ROOT / "tests" / "mcp_server.py")],
                     env={"RUNTIME_TEST_DIR": str(tmp_path)}, **kw)


def classes(server: MCPServer) -> dict[str, tuple[str, str]]:
    return {t.name: server.classify(t) for t in run_awaitable(server.alist_tools())}


def test_the_effect_comes_from_the_annotations_only_where_it_makes_a_tool_stricter(tmp_path):
    untrusted = classes(orders(tmp_path))
    assert untrusted == {
        "find_order": ("side_effect", "annotated read-only by server orders, which is not "
                                      "trusted: treated as a side effect"),
        "cancel_order": ("side_effect", "no annotations: treated as a side effect"),
        "wipe_orders": ("side_effect", "annotated read-only by server orders, which is not "
                                       "trusted: treated as a side effect"),
        "charge_then_die": ("side_effect", "not annotated read-only by server orders"),
        "count_then_die": ("side_effect", "annotated read-only by server orders, which is not "
                                          "trusted: treated as a side effect")}
    trusted = classes(orders(tmp_path, trusted=True,
                             effects={"wipe_orders": "side_effect",
                                      "cancel_order": "read_only"}))
    assert trusted["find_order"] == ("read_only", "annotated read-only by server orders")
    assert trusted["wipe_orders"] == ("side_effect", "set by configuration")
    assert trusted["cancel_order"] == ("read_only", "set by configuration")
    assert trusted["charge_then_die"][0] == "side_effect"


def test_a_native_agent_calls_mcp_tools_and_an_interrupted_side_effect_waits(database, clock,
                                                                            tmp_path):
    server = orders(tmp_path, trusted=True)
    script = [ToolCall("find_order", {"order": "A1"}), ToolCall("charge_then_die", {"cents": 5}),
              FinalAnswer("done")]
    with registry.override(Agent("mcp-native", ScriptedLLM(script), server.tools())):
        run = resume(start("mcp-native", {}, clock=clock).pk, clock=clock)
        assert run.status == "waiting"
        (held,) = pending().filter(run_id=run.pk)
        assert (held.kind, held.tool, held.effect) == (
            "interrupted_side_effect", "charge_then_die", "side_effect")
        ledger = Ledger(tmp_path / "ledger.jsonl")
        assert [c["call"] for c in ledger.calls()] == ["find_order", "charge_then_die"]
        steps = list(Step.objects.filter(run=run).order_by("index"))
        assert json.loads(steps[0].result) == {"order": "A1", "paid": 1250}  # its text
    assert verify(run.pk).ok


def test_a_read_only_mcp_call_whose_server_died_is_made_again(database, clock, tmp_path):
    (tmp_path / "die-once").touch()
    server = orders(tmp_path, trusted=True)
    script = [ToolCall("count_then_die", {"n": 3}), FinalAnswer("done")]
    with registry.override(Agent("mcp-read", ScriptedLLM(script), server.tools())):
        run = resume(start("mcp-read", {}, clock=clock).pk, clock=clock)
    assert run.status == "succeeded", run.failure_message
    assert Ledger(tmp_path / "ledger.jsonl").count("count_then_die") == 2
    (step,) = Step.objects.filter(run=run, tool="count_then_die")
    assert (step.attempt, step.result) == (2, {"result": "counted 3"})


def test_a_server_that_is_down_is_a_failure_the_agent_sees(database, clock, tmp_path):
    server = orders(tmp_path, trusted=True)
    tools = server.tools()
    server.command = [sys.executable, str(tmp_path / "no-such-server.py")]
    script = [ToolCall("find_order", {"order": "A1"}), FinalAnswer("gave up")]
    with registry.override(Agent("mcp-down", ScriptedLLM(script), tools)):
        run = resume(start("mcp-down", {}, clock=clock).pk, clock=clock)
    assert run.status == "succeeded"
    (step,) = Step.objects.filter(run=run, tool="find_order")
    assert step.status == "failed" and "MCP server orders is down" in step.error


def _mcp_model(messages, info) -> ModelResponse:
    made = sum(1 for m in messages if isinstance(m, ModelResponse))
    if made == 0:
        return ModelResponse(parts=[ToolCallPart("find_order", {"order": "A1"})])
    if made == 1:
        return ModelResponse(parts=[ToolCallPart("wipe_orders", {"customer": "ann"})])
    return ModelResponse(parts=[TextPart("done")])


def test_a_pydantic_ai_agent_uses_an_mcp_toolset_under_the_contract(database, clock, tmp_path):
    """The falsely read-only tool of an untrusted server is a side effect: with the policy
    asking for side effects, it waits for a person; the approval says where its effect came
    from."""
    from runtime import Allow, RequireApproval

    def policy(request, run):
        if request.effect == "side_effect":
            return RequireApproval(f"Allow {request.tool}?")
        return Allow()

    server = orders(tmp_path, effects={"find_order": "read_only"})
    agent = PydanticAgent(FunctionModel(_mcp_model), name="mcp-pai", toolsets=[server.toolset()])
    with registry.override(PydanticAIAgent(agent, policy=policy)):
        run = resume(start("mcp-pai", "go", clock=clock).pk, clock=clock)
        assert run.status == "waiting"
        (held,) = pending().filter(run_id=run.pk)
        assert (held.tool, held.effect) == ("wipe_orders", "side_effect")
        decided = {e.payload["tool"]: e.payload["effect_source"]
                   for e in events(run, "step.decided")}
        assert decided == {"find_order": "set by configuration",
                           "wipe_orders": "annotated read-only by server orders, which is not "
                                          "trusted: treated as a side effect"}
        approve(held.pk, by="olga")
        run = resume(run.pk, clock=clock)
    assert run.status == "succeeded", run.failure_message
    assert Ledger(tmp_path / "ledger.jsonl").count("wipe_orders") == 1


def test_a_server_over_streamable_http_and_the_same_server_gone(database, clock, tmp_path):
    """The same tools over streamable HTTP (a server process on 127.0.0.1, ended by its pid):
    a call reaches it with the run's idempotency key; once it is gone, the next call is a
    failure the agent sees ("down"), since nothing was sent."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(ROOT / "tests" / "mcp_server.py"), "--http",
                             str(port)], env={**os.environ, "RUNTIME_TEST_DIR": str(tmp_path)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: port_open(port), timeout=30, what="the MCP server's port")
        server = MCPServer("orders", url=f"http://127.0.0.1:{port}/mcp", trusted=True)
        tools = server.tools()
        assert {t.name: t.effect for t in tools}["find_order"] == "read_only"
        script = [ToolCall("find_order", {"order": "A1"}), ToolCall("find_order", {"order": "B2"}),
                  FinalAnswer("done")]
        gate = {"first": True}

        def after_first(transcript):  # the server goes away between the two calls
            if transcript.entries and gate.pop("first", False):
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(10)
            return ScriptedLLM(script).complete(transcript, []).decisions[0]

        with registry.override(Agent("mcp-http", ScriptedLLM(after_first), tools)):
            run = resume(start("mcp-http", {}, clock=clock).pk, clock=clock)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)
    assert run.status == "succeeded", run.failure_message
    first, second = Step.objects.filter(run=run).order_by("index")[:2]
    assert first.status == "succeeded" and second.status == "failed"
    assert "MCP server orders is down" in second.error
    (call,) = Ledger(tmp_path / "ledger.jsonl").calls("find_order")
    assert call["order"] == "A1"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_open(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0
