"""Approvals of a Pydantic AI agent's calls in the real browser: a ``requires_approval`` tool's
policy approval, and an MCP tool's interrupted side effect, each saying where the tool's
effect came from. Screenshots land in ``test-output/screenshots/``."""

from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import connection
from playwright.sync_api import expect
from pydantic_ai import Agent as PydanticAgent
from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import FunctionModel

from runtime.agents.agent import registry
from runtime.agents.mcp import MCPServer
from runtime.agents.pydanticai import PydanticAIAgent
from runtime.loop.control import resume, start
from runtime.models import Approval
from tests import pai_agents
from tests.console.browser import PHONE, shot
from tests.console.test_browser_pages import no_sideways_scroll
from tests.procs import ROOT

pytestmark = pytest.mark.slow


def _dying_charge(messages, info) -> ModelResponse:
    if any(isinstance(m, ModelResponse) for m in messages):
        return ModelResponse(parts=[TextPart("done")])
    return ModelResponse(parts=[ToolCallPart("charge_then_die", {"cents": 1250})])


def test_approvals_of_pydantic_ai_and_mcp_calls_say_where_the_effect_came_from(
        sqlite_path, tmp_path, clock, people, log_in, monkeypatch):
    monkeypatch.setattr(pai_agents, "DIR", tmp_path)
    orders = MCPServer("orders", command=[sys.executable, str(ROOT / "tests/mcp_server.py")],
                       env={"RUNTIME_TEST_DIR": str(tmp_path)})
    mcp_agent = PydanticAIAgent(PydanticAgent(FunctionModel(_dying_charge), name="mcp-desk",
                                              toolsets=[orders.toolset()]))
    def run(agent: str, prompt: str):
        try:  # (on a thread of its own: the browser's driver keeps a loop running on this one)
            return resume(start(agent, prompt, clock=clock).pk, owner="w", clock=clock)
        finally:
            connection.close()

    with registry.override(pai_agents.build_gated(), mcp_agent), ThreadPoolExecutor(1) as pool:
        gated = pool.submit(run, "pai-gated", "wire it").result()
        died = pool.submit(run, "mcp-desk", "charge").result()
    policy = Approval.objects.get(run_id=gated.pk)
    interrupted = Approval.objects.get(run_id=died.pk)
    assert (policy.kind, interrupted.kind) == ("policy", "interrupted_side_effect")
    people("olga", "runtime.decide_approval")
    page = log_in("olga")
    page.goto(f"/approvals/{policy.pk}/")
    expect(page.get_by_test_id("effect-source")).to_have_text(
        "(no declaration: treated as a side effect)")
    expect(page.get_by_test_id("arguments")).to_contain_text('"cents": 900')
    shot(page, "approval-pydantic-ai-policy.png")
    page.goto(f"/approvals/{interrupted.pk}/")
    expect(page.get_by_test_id("effect-source")).to_have_text(
        "(not annotated read-only by server orders)")
    expect(page.locator("#decide-resolve summary")).to_contain_text(
        "It happened: record the result")
    shot(page, "approval-mcp-interrupted.png")
    phone = log_in("olga", PHONE)
    no_sideways_scroll(phone, f"/approvals/{interrupted.pk}/")
    shot(phone, "approval-mcp-interrupted-phone.png")
