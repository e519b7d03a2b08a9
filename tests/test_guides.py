"""The guides' examples, run: the Pydantic AI guide's agent (and how little it adds to the
agent it starts from) and the MCP guide's servers, with a model that answers from a script
(no network) and ``tests/mcp_server.py`` as the MCP server."""

from __future__ import annotations

import difflib
import re
import sys
import types
from pathlib import Path

import pytest
from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import FunctionModel

from runtime import resume, start
from runtime.agents.agent import registry
from runtime.models import Step

ROOT = Path(__file__).resolve().parents[1]
GUIDES = ROOT / "docs" / "guides"


def blocks(page: str) -> dict[str, str]:
    """The page's python blocks, by their title."""
    text = (GUIDES / page).read_text()
    return {m.group(1): m.group(2) for m in re.finditer(
        r'```python title="([^"]+)"\n(.*?)```', text, re.S)}


def load(name: str, source: str) -> types.ModuleType:
    module = types.ModuleType(name)
    exec(compile(source, f"<{name}>", "exec"), module.__dict__)  # the guide's own code
    return module


def test_the_pydantic_ai_guide_adds_at_most_15_lines(monkeypatch):
    code = blocks("pydantic-ai.md")
    before, after = code["refunds/agent.py, before"], code["refunds/agent.py, after"]
    changed = [line for line in difflib.ndiff(before.splitlines(), after.splitlines())
               if line.startswith("+ ") and line[2:].strip()]
    assert 0 < len(changed) <= 15, changed
    monkeypatch.setenv("OPENAI_API_KEY", "sk-guide")  # the model is built, never asked
    load("refunds_before", before)  # the agent it starts from is real code too


@pytest.mark.engines
def test_the_pydantic_ai_guides_agent_runs_under_the_runtime(database, clock, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-guide")
    guide = load("refunds_guide", blocks("pydantic-ai.md")["refunds/agent.py, after"])

    def model(messages, info) -> ModelResponse:
        asked = sum(1 for m in messages if isinstance(m, ModelResponse))
        if asked == 0:
            return ModelResponse(parts=[ToolCallPart("lookup_order", {"order": "A-17"})])
        if asked == 1:
            return ModelResponse(parts=[ToolCallPart("refund", {"order": "A-17",
                                                                 "cents": 1250})])
        return ModelResponse(parts=[TextPart("Refunded 12.50 for A-17.")])

    with registry.override(guide.refunds), guide.support.override(model=FunctionModel(model)):
        run = resume(start("refunds", "Refund order A-17", clock=clock).pk, clock=clock)
    assert run.status == "succeeded" and run.output == "Refunded 12.50 for A-17."
    steps = list(Step.objects.filter(run=run).order_by("index"))
    assert [(s.tool, s.effect) for s in steps] == [("lookup_order", "read_only"),
                                                   ("refund", "side_effect")]
    refunded = guide.REFUNDS
    assert refunded == [{"order": "A-17", "cents": 1250,
                         "idempotency_key": steps[1].idempotency_key}]


def test_the_mcp_guides_servers(monkeypatch, tmp_path):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-guide")
    source = blocks("mcp.md")["desk/agents.py"].replace(
        '[sys.executable, "orders_server.py"]',
        repr([sys.executable, str(ROOT / "tests" / "mcp_server.py")]))
    monkeypatch.setenv("RUNTIME_TEST_DIR", str(tmp_path))
    guide = load("desk_guide", source)
    effects = {name: t.effect for name, t in guide.desk.tools.items()}
    assert effects["cancel_order"] == "side_effect"
    assert effects["find_order"] == "side_effect"  # annotated read-only, server not trusted
    assert guide.support.name == "support"
