"""Helpers for tests: a controllable tool, agents built in one line (the outside-world ledger
is the crash test kit's, ``runtime.testkit.Ledger``)."""

from __future__ import annotations

import io
import threading
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from runtime import (
    Agent,
    Allow,
    Budget,
    FinalAnswer,
    RequireApproval,
    ScriptedLLM,
    ToolCall,
    ToolContext,
    crashpoints,
    resume,
    tool,
)
from runtime.crashpoints import CrashPoint
from runtime.errors import RunLeased, SimulatedCrash
from runtime.models import Approval, Event, Run, Step
from runtime.testkit.ledger import Ledger


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
        ledger.record("read", key=key, attempt=ctx.attempt, step=ctx.step_index, run=ctx.run_id)
        return {"value": key.upper()}

    @tool(effect="side_effect")
    def charge(ctx: ToolContext, amount: int) -> dict:
        """Charge a card."""
        if "charge" in gates:
            gates["charge"].hold()
        ledger.record_call("charge", ctx, amount=amount)
        return {"charged": amount}

    @tool(effect="side_effect", dispatches=True)
    def send(ctx: ToolContext, to: str) -> dict:
        """Send a message; announces the outbound call with ctx.dispatch()."""
        if "send.before" in gates:
            gates["send.before"].hold()
        ctx.dispatch()
        ledger.record_call("send", ctx, to=to)
        if "send" in gates:
            gates["send"].hold()
        return {"sent": to}

    return [read, charge, send]


def charges_need_approval(request: Any, run: Any) -> Any:
    """A policy: a person approves each charge before it starts; everything else goes ahead."""
    return RequireApproval("Charge?", "") if request.tool == "charge" else Allow()


def make_agent(name: str, script: list, ledger: Ledger, gates: dict[str, Gate] | None = None,
               **kw: Any) -> Agent:
    llm = kw.pop("llm", None) or ScriptedLLM(script)
    return Agent(name, llm, make_tools(ledger, gates), **kw)


def crash_then_take_over(run_id: int, clock, crash, point: CrashPoint, step_index: int,
                         dead: str = "worker-a", heir: str = "worker-b",
                         proved_dead: bool = True) -> Run:
    """Crash ``dead`` at ``point``; check the lease stays with it; take over once it lapses.
    ``proved_dead``: the heir knows ``dead`` is gone (as a worker on its host proves by pid);
    without it, a call ``dead`` started may still land as far as the runtime can tell."""
    crash(point, step_index=step_index)
    try:
        with pytest.raises(SimulatedCrash) as info:
            resume(run_id, owner=dead, clock=clock, lease_seconds=1)
    finally:
        crashpoints.disarm()
    assert info.value.point == str(point)
    row = Run.objects.get(pk=run_id)
    assert row.status == "running" and row.lease_owner == dead  # the dead keep it until expiry
    with pytest.raises(RunLeased):
        resume(run_id, owner=heir, clock=clock, lease_seconds=1)
    clock.advance(2)
    return resume(run_id, owner=heir, clock=clock, lease_seconds=1,
                  owner_is_dead=(lambda run: run.lease_owner == dead) if proved_dead else None)


def events(run: Run | int, kind: str) -> list[Event]:
    run_id = run if isinstance(run, int) else run.pk
    return list(Event.objects.filter(run_id=run_id, kind=kind).order_by("seq"))


def kinds_after(run: Run | int, kind: str) -> list[str]:
    """Event kinds after the last ``kind`` event of the run."""
    kinds = events_of(run)
    last = len(kinds) - 1 - kinds[::-1].index(kind)
    return kinds[last + 1:]


def events_of(run: Run | int) -> list[str]:
    run_id = run if isinstance(run, int) else run.pk
    return list(Event.objects.filter(run_id=run_id).order_by("seq").values_list("kind", flat=True))


__all__ = ["Background", "Budget", "FinalAnswer", "Gate", "Ledger", "ToolCall",
           "crash_then_take_over", "events", "events_of", "kinds_after", "make_agent",
           "make_tools"]


def snapshot(run_id: int) -> tuple:
    """Everything a refused decision must leave as it was."""
    return (
        Run.objects.values().get(pk=run_id),
        list(Approval.objects.filter(run_id=run_id).order_by("pk").values()),
        list(Step.objects.filter(run_id=run_id).order_by("index").values()),
        list(Event.objects.filter(run_id=run_id).order_by("seq").values_list("seq", "kind",
                                                                              "hash")),
    )


def verifyaudit(*args: str) -> str:
    """``manage.py verifyaudit`` with ``args``: what it printed (it must pass)."""
    out = io.StringIO()
    call_command("verifyaudit", *args, stdout=out, stderr=out)
    return out.getvalue()


def broken(*args: str) -> str:
    """verifyaudit's complaints; fails the test if it says all is well."""
    err = io.StringIO()
    with pytest.raises(CommandError, match=r"problem"):
        call_command("verifyaudit", *args, stdout=io.StringIO(), stderr=err)
    return err.getvalue()
