"""The LLM interface: given the transcript and tool specs, return the next decision(s)."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Protocol

from runtime.agents.tools import ToolSpec


@dataclass(frozen=True)
class ToolCall:
    """The LLM asks for one tool call."""

    tool: str
    arguments: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class FinalAnswer:
    """The LLM is done; ``output`` becomes the run's output."""

    output: Any


Decision = ToolCall | FinalAnswer


@dataclass(frozen=True)
class Usage:
    tokens_in: int = 0
    tokens_out: int = 0
    cost: Decimal = Decimal("0")


@dataclass(frozen=True)
class LLMResponse:
    """One LLM answer: several tool calls become consecutive steps."""

    decisions: list[Decision]
    usage: Usage = Usage()


@dataclass(frozen=True)
class TranscriptEntry:
    step_index: int
    tool: str
    arguments: dict[str, Any]
    result: Any = None
    error: str = ""


@dataclass
class Transcript:
    """What the LLM sees: the run's input and every finished tool call, in order."""

    run_id: int
    agent: str
    input: Any
    entries: list[TranscriptEntry] = field(default_factory=list)


class SyncLLM(Protocol):
    def complete(self, transcript: Transcript, tools: Sequence[ToolSpec]) -> LLMResponse: ...


class AsyncLLM(Protocol):
    """A model client whose ``complete`` is a coroutine (run on the worker thread's loop)."""

    async def complete(self, transcript: Transcript,
                       tools: Sequence[ToolSpec]) -> LLMResponse: ...


LLM = SyncLLM | AsyncLLM


ScriptItem = Decision | Sequence[ToolCall]


class ScriptedLLM:
    """A deterministic LLM for tests and demos.

    ``script`` is a list with one item per LLM response (a decision, or a list of tool calls
    for one response that asks for several), or a function of the transcript returning one.
    The list form is indexed by how many tool calls the transcript already holds, so a run that
    is resumed after a crash is asked the same question and gets the same answer. The function
    may be an ``async def`` (then ``complete`` is awaited, as an async client's is).

    ``blocks``: whether answering may wait (a sync function may sleep or do I/O: the event-loop
    worker calls it on its thread pool); default False for a list, True for a sync function.
    """

    def __init__(
        self,
        script: Sequence[ScriptItem] | Callable[[Transcript], Any],
        usage: Usage = Usage(tokens_in=10, tokens_out=5),
        *,
        blocks: bool | None = None,
    ) -> None:
        self.script = script
        self.usage = usage
        self.calls = 0
        self.blocks = callable(script) if blocks is None else blocks

    def complete(self, transcript: Transcript, tools: Sequence[ToolSpec]) -> Any:
        """The response; from an ``async def`` script, a coroutine giving it."""
        self.calls += 1
        if callable(self.script):
            item = self.script(transcript)
            if inspect.isawaitable(item):
                return self._later(item)
            return self._response(item)
        done, start = len(transcript.entries), 0
        for item in self.script:
            calls = _as_list(item)
            if start <= done < start + len(calls):
                return LLMResponse(calls[done - start:], self.usage)
            start += len(calls)
        return LLMResponse([FinalAnswer({"note": "script exhausted"})], self.usage)


    async def _later(self, item: Any) -> LLMResponse:
        return self._response(await item)

    def _response(self, item: Any) -> LLMResponse:
        return item if isinstance(item, LLMResponse) else LLMResponse(_as_list(item), self.usage)


def _as_list(item: Any) -> list[Decision]:
    if isinstance(item, ToolCall | FinalAnswer):
        return [item]
    return list(item)
