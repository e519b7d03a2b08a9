"""Agents and the registry that finds them by name (settings ``RUNTIME["AGENTS"]``)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from django.utils.module_loading import import_string

from runtime.agents.llm import LLM
from runtime.agents.policy import PolicyDecision, Request, allow_all
from runtime.agents.tools import Tool, ToolSpec
from runtime.conf import setting
from runtime.errors import ToolNotRegistered, UnknownAgent


@dataclass(frozen=True)
class Budget:
    """Limits a run may not pass; reaching one fails the run ``budget_exceeded``."""

    max_steps: int = 50
    max_llm_requests: int = 100
    max_tokens: int | None = None
    max_cost: Decimal | None = None


class Agent:
    """An LLM, its tools, and the rules for running them. ``editable=False`` forbids a person
    to change the arguments of any of its calls a policy holds before allowing it."""

    def __init__(
        self,
        name: str,
        llm: LLM,
        tools: Iterable[Tool],
        policy: Callable[[Request, Any], PolicyDecision] | None = None,
        reconcile: Callable[[Any], Any] | None = None,
        budget: Budget | None = None,
        editable: bool = True,
    ) -> None:
        self.name = name
        self.llm = llm
        self.tools: dict[str, Tool] = {}
        for t in tools:
            if not isinstance(t, Tool):
                raise TypeError(f"agent {name}: {t!r} is not a @tool")
            if t.name in self.tools:
                raise ValueError(f"agent {name}: two tools named {t.name!r}")
            self.tools[t.name] = t
        self.policy = policy or allow_all
        self.reconcile = reconcile
        self.budget = budget or Budget()
        self.editable = editable
        self.tool_specs: list[ToolSpec] = [t.spec() for t in self.tools.values()]

    def __repr__(self) -> str:
        return f"<Agent {self.name}>"

    def tool_for_step(self, step: Any) -> Tool | None:
        """The tool a recorded step calls, if it is still registered (recovery asks)."""
        return self.tools.get(step.tool)

    def tool(self, name: str) -> Tool:
        try:
            return self.tools[name]
        except KeyError:
            raise ToolNotRegistered(self.name, name) from None


class _Registry:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loaded: dict[str, Agent] | None = None
        self._overrides: list[dict[str, Agent]] = []

    def _from_settings(self) -> dict[str, Agent]:
        with self._lock:
            if self._loaded is None:
                found: dict[str, Agent] = {}
                for path in setting("AGENTS"):
                    obj = import_string(path)
                    for agent in obj if isinstance(obj, list | tuple) else [obj]:
                        found[agent.name] = agent
                self._loaded = found
            return self._loaded

    def all(self) -> dict[str, Agent]:
        merged = dict(self._from_settings())
        for layer in self._overrides:
            merged.update(layer)
        return merged

    def get(self, name: str) -> Agent:
        agents = self.all()
        try:
            return agents[name]
        except KeyError:
            raise UnknownAgent(name, sorted(agents)) from None

    @contextmanager
    def override(self, *agents: Agent) -> Iterator[None]:
        """Register agents for the duration of a block (tests)."""
        layer = {a.name: a for a in agents}
        self._overrides.append(layer)
        try:
            yield
        finally:
            self._overrides.remove(layer)


registry = _Registry()


def get_agent(name: str) -> Agent:
    return registry.get(name)
