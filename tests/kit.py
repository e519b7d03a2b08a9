"""Helpers for tests: an outside-world ledger, a controllable tool, agents built in one line."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

from runtime import Agent, Budget, FinalAnswer, ScriptedLLM, ToolCall, ToolContext, tool
from runtime.models import Event, Run


class Ledger:
    """The outside world's own record of calls: one fsynced line per call, in a file the runtime
    does not own. Side-effect counts in tests come from here, never from the runtime's tables."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.touch()
        self._lock = threading.Lock()

    def record(self, name: str, **data: Any) -> None:
        with self._lock, open(self.path, "a") as fh:
            fh.write(json.dumps({"call": name, **data}, sort_keys=True) + "\n")
            fh.flush()
            os.fsync(fh.fileno())

    def calls(self, name: str | None = None) -> list[dict[str, Any]]:
        rows = [json.loads(line) for line in self.path.read_text().splitlines() if line]
        return [r for r in rows if name is None or r["call"] == name]

    def count(self, name: str | None = None) -> int:
        return len(self.calls(name))


class Gate:
    """Lets a test hold a tool call open until it says go (synchronisation, not sleeping).
    With ``once=True`` only the first call is held; later calls pass straight through."""

    def __init__(self, once: bool = False) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.once = once

    def wait_inside(self, timeout: float = 10) -> None:
        assert self.entered.wait(timeout), "the tool was never entered"

    def hold(self, timeout: float = 30) -> None:
        if self.once and self.entered.is_set():
            return
        self.entered.set()
        assert self.release.wait(timeout), "the test never released the tool"


class Background:
    """Runs ``fn`` on its own thread (own database connection); keeps its result or error."""

    def __init__(self, fn: Any) -> None:
        self.result: Any = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(fn,), daemon=True)
        self.thread.start()

    def _run(self, fn: Any) -> None:
        from django.db import connection

        try:
            self.result = fn()
        except BaseException as exc:  # the test inspects it, including SimulatedCrash
            self.error = exc
        finally:
            connection.close()

    def join(self, timeout: float = 30) -> Background:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "background work did not finish"
        return self


def make_tools(ledger: Ledger, gates: dict[str, Gate] | None = None) -> list:
    """read (read-only), charge (side effect), and send (side effect using ctx.dispatch())."""
    gates = gates or {}

    @tool(effect="read_only")
    def read(ctx: ToolContext, key: str) -> dict:
        """Look something up."""
        if "read" in gates:
            gates["read"].hold()
        ledger.record("read", key=key, attempt=ctx.attempt, step=ctx.step_index)
        return {"value": key.upper()}

    @tool(effect="side_effect")
    def charge(ctx: ToolContext, amount: int) -> dict:
        """Charge a card."""
        if "charge" in gates:
            gates["charge"].hold()
        ledger.record("charge", amount=amount, key=ctx.idempotency_key, attempt=ctx.attempt)
        return {"charged": amount}

    @tool(effect="side_effect", dispatches=True)
    def send(ctx: ToolContext, to: str) -> dict:
        """Send a message; announces the outbound call with ctx.dispatch()."""
        if "send.before" in gates:
            gates["send.before"].hold()
        ctx.dispatch()
        ledger.record("send", to=to, key=ctx.idempotency_key, attempt=ctx.attempt)
        if "send" in gates:
            gates["send"].hold()
        return {"sent": to}

    return [read, charge, send]


def make_agent(name: str, script: list, ledger: Ledger, gates: dict[str, Gate] | None = None,
               **kw: Any) -> Agent:
    llm = kw.pop("llm", None) or ScriptedLLM(script)
    return Agent(name, llm, make_tools(ledger, gates), **kw)


def events_of(run: Run | int) -> list[str]:
    run_id = run if isinstance(run, int) else run.pk
    return list(Event.objects.filter(run_id=run_id).order_by("seq").values_list("kind", flat=True))


__all__ = ["Background", "Budget", "FinalAnswer", "Gate", "Ledger", "ToolCall", "events_of",
           "make_agent", "make_tools"]
