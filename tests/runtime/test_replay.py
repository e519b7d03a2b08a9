"""Replay (design §12a): a run's rows rebuilt from its events alone. Every run the runtime
produces itself replays without a single difference, whatever crashed, took over, retried,
waited or was decided on the way; a row edited behind the runtime's back is reported, naming
the row, the field, what it holds and what the events say."""

from __future__ import annotations

import contextlib
import random
import subprocess
import sys
from datetime import timedelta
from decimal import Decimal

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from runtime import (
    Agent,
    Allow,
    Budget,
    Complete,
    Conflict,
    Continue,
    Deny,
    FinalAnswer,
    LLMError,
    LLMResponse,
    RequireApproval,
    ScriptedLLM,
    ToolCall,
    Usage,
    Wait,
    cancel,
    crashpoints,
    resume,
    start,
)
from runtime.agents.agent import registry
from runtime.approvals.decisions import approve, reject, resolve
from runtime.audit.compare import replay_problems
from runtime.audit.replay import REPLAYED_KINDS, replay_events
from runtime.benchkit.db import use_database
from runtime.canonical import request_digest
from runtime.crashpoints import OFF_STEP_POINTS, CrashPoint
from runtime.errors import CrashNotReached, RunLeased, RunNotResumable, SimulatedCrash
from runtime.leasing.claims import run_release
from runtime.leasing.lease import Lease
from runtime.loop.driver import Driver
from runtime.models import TERMINAL_RUN_STATUSES, Approval, Event, Run, RunStatus, Step
from runtime.storage.events import EVENT_KINDS
from runtime.testkit import APPROVE, REJECT, Crash, InProcessKit, resolve_with
from runtime.testkit.agents import AGENTS as KIT_AGENTS
from tests.engines import current_config
from tests.kit import Ledger, crash_then_take_over, make_agent, make_tools
from tests.procs import ROOT

pytestmark = pytest.mark.engines

P = CrashPoint
SCRIPT = [ToolCall("read", {"key": "k"}), ToolCall("charge", {"amount": 9}),
          ToolCall("send", {"to": "ann"}), FinalAnswer({"total": 9, "ratio": 1.5})]


def clean(*run_ids: int) -> None:
    """Every run named replays to exactly its rows."""
    for run_id in run_ids:
        assert replay_problems(run_id) == [], f"run {run_id}"


def everything_clean() -> int:
    ids = list(Run.objects.order_by("pk").values_list("pk", flat=True))
    problems = [p for run_id in ids for p in replay_problems(run_id)]
    assert problems == []
    return len(ids)


def charge_needs_approval(request, run):
    return RequireApproval(f"Charge {request.arguments['amount']}?", "a card is charged") \
        if request.tool == "charge" else Allow()


def drive(run_id: int, clock, owner: str | None = None) -> Run:
    return resume(run_id, owner=owner, clock=clock, lease_seconds=1)


class FlakyLLM:
    """Fails ``fails`` times (retryable or not), then follows ``script``."""

    def __init__(self, fails: int, script: list, retryable: bool = True) -> None:
        self.left, self.retryable, self.max_retries = fails, retryable, 2
        self.inner, self.calls = ScriptedLLM(script), 0

    def complete(self, transcript, tools):
        self.calls += 1
        if self.left > 0:
            self.left -= 1
            raise LLMError("overloaded", retryable=self.retryable, retry_after=0, status=503)
        return self.inner.complete(transcript, tools)


# -- legitimately produced runs: not one difference ---------------------------------------------


def sc_success(tmp_path, clock, crash):
    """Reads, side effects (one with ctx.dispatch()), several calls in one answer, usage with a
    cost finer than the column, a float in the output."""
    ledger = Ledger(tmp_path / "l")
    llm = ScriptedLLM([[ToolCall("read", {"key": "a"}), ToolCall("read", {"key": "b"})],
                       *SCRIPT[1:]], usage=Usage(7, 3, Decimal("0.0000004")))
    with registry.override(make_agent("ok", [], ledger, llm=llm)):
        run = start("ok", {"order": 1, "weight": 2.0}, created_by="ann", clock=clock)
        clean(run.pk)
        run = drive(run.pk, clock)
    assert run.status == "succeeded" and run.tokens_in == 28
    return [run.pk]


def sc_planned_crash(tmp_path, clock, crash):
    """A crash with calls still planned (non-terminal, dead lease), then a takeover."""
    ledger = Ledger(tmp_path / "l")
    llm = ScriptedLLM([[ToolCall("read", {"key": "a"}), ToolCall("read", {"key": "b"}),
                        ToolCall("read", {"key": "c"})], FinalAnswer("ok")])
    with registry.override(make_agent("plan", [], ledger, llm=llm)):
        run = start("plan", {}, clock=clock)
        crash(P.AFTER_TOOL_FINISHED, step_index=1)
        with pytest.raises(SimulatedCrash):
            drive(run.pk, clock, "dead")
        crashpoints.disarm()
        assert len(Run.objects.get(pk=run.pk).planned) == 2
        clean(run.pk)  # running, its lease held by the dead owner
        clock.advance(2)
        crash(P.AFTER_STEP_DECIDED, step_index=2)  # decided from the plan, then started
        with pytest.raises(SimulatedCrash):
            drive(run.pk, clock, "dead-too")
        crashpoints.disarm()
        clean(run.pk)
        clock.advance(2)
        run = drive(run.pk, clock)
    assert run.status == "succeeded"
    return [run.pk]


def sc_policy(tmp_path, clock, crash):
    """A policy approval approved then consumed; another rejected; one cancelled while
    approved (the canceller is written over the grant)."""
    ledger, ids = Ledger(tmp_path / "l"), []
    agent = Agent("pol", ScriptedLLM(SCRIPT), make_tools(ledger), policy=charge_needs_approval)
    with registry.override(agent):
        for decision in ("approve", "reject", "cancel-approved", "cancel-pending"):
            run = drive(start("pol", {"d": decision}, clock=clock).pk, clock)
            assert run.status == "waiting"
            clean(run.pk)
            a = Approval.objects.get(run_id=run.pk)
            if decision == "approve":
                approve(a.pk, "alice", "fine", now=clock.now())
                clean(run.pk)
                run = drive(run.pk, clock)
                assert run.status == "succeeded"
                assert Approval.objects.get(pk=a.pk).status == "consumed"
            elif decision == "reject":
                reject(a.pk, "bob", "no charges today", now=clock.now())
            elif decision == "cancel-approved":
                approve(a.pk, "alice", "fine", now=clock.now())
                cancel(run.pk, "carol", "customer left", clock=clock)
                assert Approval.objects.get(pk=a.pk).decided_by == "carol"
            else:
                cancel(run.pk, "carol", clock=clock)
            ids.append(run.pk)
    return ids


def sc_policy_changes(tmp_path, clock, crash):
    """Policy re-evaluated at consumption: denied (the approval cancelled), or raising."""
    ledger, ids = Ledger(tmp_path / "l"), []
    for verdict in ("deny", "raise", "deny-first"):
        state = {"n": 0}

        def policy(request, run, verdict=verdict, state=state):
            if request.tool != "charge":
                return Allow()
            state["n"] += 1
            if verdict == "deny-first":
                return Deny("charges are frozen")
            if state["n"] == 1:
                return RequireApproval("Charge?")
            if verdict == "raise":
                raise RuntimeError("policy service down")
            return Deny("card frozen since")

        name = f"pc-{verdict}"
        with registry.override(Agent(name, ScriptedLLM(SCRIPT), make_tools(ledger),
                                     policy=policy)):
            run = drive(start(name, {}, clock=clock).pk, clock)
            if verdict != "deny-first":
                a = Approval.objects.get(run_id=run.pk)
                approve(a.pk, "alice", now=clock.now())
                run = drive(run.pk, clock)
                assert Approval.objects.get(pk=a.pk).status == "cancelled"
        assert run.status == "failed"
        ids.append(run.pk)
    return ids


def sc_interrupted(tmp_path, clock, crash):
    """An interrupted charge approved and re-run, then interrupted again and resolved, then a
    dispatched send approved; one rejected; an undispatched send re-run on the dispatch
    proof."""
    ledger, ids = Ledger(tmp_path / "l"), []
    script = [ToolCall("charge", {"amount": 5}), ToolCall("send", {"to": "x"}),
              FinalAnswer("done")]
    with registry.override(make_agent("int", script, ledger)):
        run = start("int", {}, clock=clock)
        run = crash_then_take_over(run.pk, clock, crash, P.AFTER_TOOL_EFFECT, 1)
        assert run.status == "waiting"
        clean(run.pk)
        approve(Approval.objects.get(run_id=run.pk).pk, "alice", "no trace", now=clock.now())
        crash(P.AFTER_TOOL_STARTED, step_index=1)
        with pytest.raises(SimulatedCrash):
            drive(run.pk, clock, "dead-again")
        crashpoints.disarm()
        clean(run.pk)
        clock.advance(2)
        run = drive(run.pk, clock, "heir")
        pending = Approval.objects.get(run_id=run.pk, status="pending")
        resolve(pending.pk, "carol", {"charged": 5, "receipt": "r1"}, "found it",
                now=clock.now())
        clean(run.pk)
        crash(P.AFTER_TOOL_DISPATCHED, step_index=2)
        with pytest.raises(SimulatedCrash):
            drive(run.pk, clock, "dead-3")
        crashpoints.disarm()
        clock.advance(2)
        run = drive(run.pk, clock, "heir-2")
        assert run.status == "waiting"
        approve(Approval.objects.get(run_id=run.pk, status="pending").pk, "dan",
                now=clock.now())
        run = drive(run.pk, clock)
        assert run.status == "succeeded"
        ids.append(run.pk)

        rejected = start("int", {}, clock=clock)
        crash_then_take_over(rejected.pk, clock, crash, P.AFTER_TOOL_EFFECT, 1)
        reject(Approval.objects.get(run_id=rejected.pk).pk, "bob", "refund by hand",
               now=clock.now())
        ids.append(rejected.pk)

    with registry.override(make_agent("snd", [ToolCall("send", {"to": "y"}),
                                              FinalAnswer("sent")], ledger)):
        auto = start("snd", {}, clock=clock)
        run = crash_then_take_over(auto.pk, clock, crash, P.AFTER_TOOL_STARTED, 1)
        assert run.status == "succeeded"
        assert Event.objects.filter(run_id=auto.pk, kind="side_effect.auto_confirmed").exists()
        ids.append(auto.pk)
    return ids


def sc_reconcile(tmp_path, clock, crash):
    """Every reconcile outcome, a reconcile that raises, and a reconcile wait resolved."""
    ledger, ids = Ledger(tmp_path / "l"), []

    def raises(view):
        raise ValueError("cannot tell")

    outcomes = {"continue": lambda v: Continue(), "complete": lambda v: Complete({"ok": 1.0}),
                "wait": lambda v: Wait("Check it", "look the key up"),
                "conflict": lambda v: Conflict("refunded meanwhile"), "raises": raises}
    for name, reconcile in outcomes.items():
        agent = make_agent(f"rc-{name}", [ToolCall("charge", {"amount": 5}), FinalAnswer(1)],
                           ledger, reconcile=reconcile)
        with registry.override(agent):
            run = start(agent.name, {}, clock=clock)
            run = crash_then_take_over(run.pk, clock, crash, P.AFTER_TOOL_EFFECT, 1)
            if run.status == "waiting":
                a = Approval.objects.get(run_id=run.pk, status="pending")
                resolve(a.pk, "carol", {"charged": 5}, now=clock.now())
                run = drive(run.pk, clock)
        ids.append(run.pk)
    return ids


def sc_conflicts_and_caps(tmp_path, clock, crash):
    """A tool gone after the crash (reconcile_conflict); a read over its attempt cap."""
    ledger, ids = Ledger(tmp_path / "l"), []
    with registry.override(make_agent("gone", [ToolCall("charge", {"amount": 5}),
                                               FinalAnswer(1)], ledger)):
        run = start("gone", {}, clock=clock)
        crash(P.AFTER_TOOL_STARTED, step_index=1)
        with pytest.raises(SimulatedCrash):
            drive(run.pk, clock, "dead")
        crashpoints.disarm()
    clock.advance(2)
    reads_only = Agent("gone", ScriptedLLM([FinalAnswer(1)]), make_tools(ledger)[:1])
    with registry.override(reads_only):
        run = drive(run.pk, clock)
    assert run.failure_code == "reconcile_conflict"
    ids.append(run.pk)
    with registry.override(make_agent("cap", [ToolCall("read", {"key": "a"}), FinalAnswer(1)],
                                      ledger)):
        run = start("cap", {}, clock=clock)
        for n in range(3):
            crash(P.AFTER_TOOL_EFFECT, step_index=1)
            with pytest.raises(SimulatedCrash):
                drive(run.pk, clock, f"w{n}")
            crashpoints.disarm()
            clock.advance(2)
        run = drive(run.pk, clock)
    assert run.status == "failed"
    ids.append(run.pk)
    return ids


def sc_budgets_and_failures(tmp_path, clock, crash):
    """Every budget; bad decisions; a tool raising; a final answer that cannot be stored; an
    LLM failing then answering on a retry; an LLM failing for good; an agent gone."""
    ledger, ids = Ledger(tmp_path / "l"), []
    reads = [ToolCall("read", {"key": str(i)}) for i in range(10)]
    for i, budget in enumerate([Budget(max_steps=2), Budget(max_llm_requests=2),
                                Budget(max_tokens=25), Budget(max_cost=Decimal("0.01"))]):
        llm = ScriptedLLM(reads, usage=Usage(10, 5, Decimal("0.006")))
        with registry.override(make_agent(f"b{i}", [], ledger, llm=llm, budget=budget)):
            run = drive(start(f"b{i}", {}, clock=clock).pk, clock)
        assert run.failure_code == "budget_exceeded"
        ids.append(run.pk)
    cases = {
        "bad": ScriptedLLM([ToolCall("nope", {}), ToolCall("charge", {"amount": "x"}),
                            FinalAnswer(1)]),
        "unstorable": ScriptedLLM([FinalAnswer({"when": object()})]),
        "later-unstorable": ScriptedLLM([[ToolCall("read", {"key": "a"}),
                                          FinalAnswer({"x": object()})]]),
        "retried": FlakyLLM(2, [ToolCall("read", {"key": "a"}), FinalAnswer(2)]),
        "down": FlakyLLM(9, [FinalAnswer(1)]),
        "not-retryable": FlakyLLM(1, [FinalAnswer(1)], retryable=False),
        "empty": ScriptedLLM(lambda t: LLMResponse([])),
    }
    for name, llm in cases.items():
        with registry.override(make_agent(name, [], ledger, llm=llm)):
            run = resume(start(name, {}, clock=clock).pk, clock=clock, sleep=lambda s: None)
        assert run.status in ("succeeded", "failed"), name
        ids.append(run.pk)
    with registry.override(make_agent("vanish", [FinalAnswer(1)], ledger)):
        run = start("vanish", {}, clock=clock)
    ids.append(drive(run.pk, clock).pk)
    return ids


def sc_released_and_cancelled(tmp_path, clock, crash):
    """Handed back to the queue mid-decision (then cancelled, or its agent gone); a queued run
    cancelled; a worker past its grace period releasing a run mid-call, then resumed; a run
    never claimed."""
    ledger, ids = Ledger(tmp_path / "l"), []
    for ending in ("cancel", "vanish", "resume"):
        llm = FlakyLLM(1, [FinalAnswer(1)])
        name = f"rel-{ending}"
        with registry.override(make_agent(name, [], ledger, llm=llm)):
            run = start(name, {}, clock=clock)
            driver = Driver(f"w-{ending}", clock=clock, lease_seconds=5, sleep=lambda s: None)
            driver.execute(driver.acquire(run.pk), should_stop=lambda llm=llm: llm.calls >= 1)
            assert Run.objects.get(pk=run.pk).status == "queued"
            clean(run.pk)
            if ending == "cancel":
                cancel(run.pk, "ada", "not needed", clock=clock)
            elif ending == "resume":
                drive(run.pk, clock)
        if ending == "vanish":
            drive(run.pk, clock)
            assert Step.objects.get(run_id=run.pk).status == "deciding"
        ids.append(run.pk)
    with registry.override(make_agent("q", [ToolCall("read", {"key": "a"}), FinalAnswer(1)],
                                      ledger)):
        ids.append(start("q", None, clock=clock).pk)
        queued = start("q", [], clock=clock)
        cancel(queued.pk, "ada", clock=clock)
        ids.append(queued.pk)
        for tool_call in (ToolCall("read", {"key": "a"}), ToolCall("charge", {"amount": 1})):
            with registry.override(make_agent("rr", [tool_call, FinalAnswer(1)], ledger)):
                run = start("rr", {}, clock=clock)
                crash(P.AFTER_TOOL_STARTED, step_index=1)
                with pytest.raises(SimulatedCrash):
                    drive(run.pk, clock, "stopping")
                crashpoints.disarm()
                row = Run.objects.get(pk=run.pk)
                lease = Lease(row.pk, row.lease_owner, row.lease_epoch, row.lease_expires_at,
                              (row.event_seq, row.event_hash), seconds=1)
                assert run_release(lease, clock=clock, reason="grace period over")
                clean(run.pk)
                ids.append(drive(run.pk, clock).pk)
    return ids


def sc_takeover_races(tmp_path, clock, crash):
    """A takeover refused while the lease lives, then taken after expiry at every crash point
    of a three-step run."""
    ledger, ids = Ledger(tmp_path / "l"), []
    with registry.override(make_agent("tk", SCRIPT, ledger)):
        for point in (P.AFTER_STEP_STARTED, P.AFTER_STEP_DECIDED, P.DURING_LLM_REQUEST,
                      P.AFTER_TOOL_FINISHED, P.IN_TRANSACTION):
            run = start("tk", {}, clock=clock)
            crash(point, step_index=1)
            with pytest.raises(SimulatedCrash):
                drive(run.pk, clock, "dead")
            crashpoints.disarm()
            with pytest.raises(RunLeased):
                drive(run.pk, clock, "early")
            clean(run.pk)
            clock.advance(2)
            run = drive(run.pk, clock, "heir")
            clean(run.pk)
            if run.status == "waiting":
                approve(Approval.objects.get(run_id=run.pk, status="pending").pk, "al",
                        now=clock.now())
                run = drive(run.pk, clock)
            ids.append(run.pk)
    return ids


SCENARIOS = {f.__name__[3:]: f for f in [
    sc_success, sc_planned_crash, sc_policy, sc_policy_changes, sc_interrupted, sc_reconcile,
    sc_conflicts_and_caps, sc_budgets_and_failures, sc_released_and_cancelled,
    sc_takeover_races]}


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_legitimately_produced_runs_replay_without_a_difference(database, tmp_path, clock, crash,
                                                                scenario):
    ids = SCENARIOS[scenario](tmp_path, clock, crash)
    assert ids
    clean(*ids)
    assert everything_clean() >= len(ids)


RUNS = 48


def test_a_randomised_in_process_soak_replays_clean_at_every_stage(database, tmp_path,
                                                                   monkeypatch):
    """The kit's agents, crashed at random points and steps, taken over, decided on at random
    by the operator, checked after every round (mid-flight, waiting and finished runs)."""
    monkeypatch.setenv("RUNTIME_TEST_DIR", str(tmp_path))
    rng = random.Random(20240611)
    kit = InProcessKit(Ledger(tmp_path / "ledger.jsonl"), lease_seconds=1)
    names = [a.name for a in KIT_AGENTS]
    points = [p for p in CrashPoint if p not in OFF_STEP_POINTS]

    def choose(approval):
        roll = rng.random()
        if approval.kind == "policy":
            return APPROVE if roll < 0.7 else REJECT
        return APPROVE if roll < 0.5 else REJECT if roll < 0.7 else (
            resolve_with({"resolved": True}) if roll < 0.9 else None)

    with registry.override(*KIT_AGENTS):
        ids = [kit.start(rng.choice(names), {"i": i}) for i in range(RUNS)]
        for _ in range(8):
            kit.expire()
            for run_id in ids:
                status = Run.objects.get(pk=run_id).status
                if status in (RunStatus.QUEUED, RunStatus.WAITING) and rng.random() < 0.03:
                    cancel(run_id, "ops", "no longer needed", clock=kit.clock)
                if status not in (RunStatus.QUEUED, RunStatus.RUNNING):
                    continue
                crashes = [Crash(rng.choice(points), rng.choice([None, 1, 2, 2, 3]))]
                with contextlib.suppress(CrashNotReached, RunNotResumable):
                    kit.crash(run_id, *crashes)
            everything_clean()
            kit.operate(choose)
            everything_clean()
        for _ in range(10):
            kit.expire()
            kit.drain()
            kit.operate(lambda a: APPROVE if a.kind == "policy" else resolve_with({"r": 1}))
        kit.drain()
    assert not Run.objects.exclude(status__in=TERMINAL_RUN_STATUSES).exists()
    assert everything_clean() == RUNS
    assert {"succeeded", "failed"} <= set(Run.objects.values_list("status", flat=True))
    kinds = set(Event.objects.values_list("kind", flat=True))
    assert {"lease.taken_over", "step.interrupted", "approval.consumed",
            "reconcile.decided"} <= kinds  # the soak went where it should


@pytest.mark.slow
def test_a_real_process_chaos_soak_replays_clean(database, tmp_path):
    """``manage.py chaos``: workers SIGKILLed at random moments and armed crash points, a
    random operator; every run it leaves replays to exactly its rows."""
    soak = tmp_path / "soak"
    on_pg = ("--database-url", database.url) if database.is_postgres else ()
    done = subprocess.run(
        [sys.executable, "manage.py", "chaos", "--workers", "3", "--runs", "40", "--seconds",
         "40", "--seed", "7", "--dir", str(soak), *on_pg],
        cwd=ROOT, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stdout + done.stderr
    saved = current_config()
    if database.is_sqlite:  # the soak made its own file
        use_database({**saved, "NAME": str(soak / "chaos.sqlite3")})
    try:
        assert everything_clean() == 40
        assert Event.objects.filter(kind="lease.taken_over").exists()
    finally:
        use_database(saved)


# -- tampering: every edit of a row is reported, naming the field --------------------------------


@pytest.fixture
def approved(database, tmp_path, clock):
    """A finished run whose charge needed a policy approval, approved by alice and consumed:
    (run, approval)."""
    ledger = Ledger(tmp_path / "l")
    agent = Agent("tamper", ScriptedLLM(SCRIPT), make_tools(ledger), policy=charge_needs_approval)
    with registry.override(agent):
        run = drive(start("tamper", {"order": 7}, created_by="ann", clock=clock).pk, clock)
        a = Approval.objects.get(run_id=run.pk)
        approve(a.pk, "alice", "looks right", now=clock.now())
        run = drive(run.pk, clock)
    assert run.status == "succeeded"
    clean(run.pk)
    return run, Approval.objects.get(pk=a.pk)


def _steps(run, index):
    return Step.objects.filter(run_id=run.pk, index=index)


def _extra_step(run, approval):
    Step.objects.create(run_id=run.pk, index=5, status="succeeded", tool="charge",
                        arguments={"amount": 900}, effect="side_effect", idempotency_key="k",
                        result={"charged": 900}, attempt=1, started_at=approval.created_at)


def _extra_approval(run, approval):
    return Approval.objects.create(
        run_id=run.pk, step_id=approval.step_id, kind="policy", status="consumed",
        tool="charge", arguments={"amount": 900}, effect="side_effect",
        digest=request_digest("charge", {"amount": 900}, "side_effect"), title="Charge 900?",
        created_at=approval.created_at, decided_by="alice").pk


def _raw(sql: str, *params) -> None:
    with connection.cursor() as cur:
        cur.execute(sql, params)


TAMPERING = {
    "approval decided_by": (
        lambda r, a: Approval.objects.filter(pk=a.pk).update(decided_by="mallory"),
        "approval {a}: decided_by is 'mallory' in the row; the events give 'alice'"),
    "approval arguments": (
        lambda r, a: Approval.objects.filter(pk=a.pk).update(arguments={"amount": 900}),
        'approval {a}: arguments is {{"amount":900}} in the row; the events give '
        '{{"amount":9}}'),
    "approval status": (
        lambda r, a: Approval.objects.filter(pk=a.pk).update(status="approved"),
        "approval {a}: status is 'approved' in the row; the events give 'consumed'"),
    "approval decided_at": (
        lambda r, a: Approval.objects.filter(pk=a.pk).update(
            decided_at=a.decided_at - timedelta(days=1)),
        "approval {a}: decided_at is"),
    "step result": (
        lambda r, a: _steps(r, 1).update(result={"value": "FORGED"}),
        'step 1: result is {{"value":"FORGED"}} in the row; the events give {{"value":"K"}}'),
    "step arguments": (
        lambda r, a: _steps(r, 2).update(arguments={"amount": 900}),
        'step 2: arguments is {{"amount":900}} in the row; the events give {{"amount":9}}'),
    "step attempt": (
        lambda r, a: _steps(r, 2).update(attempt=3),
        "step 2: attempt is 3 in the row; the events give 1"),
    "run status": (
        lambda r, a: Run.objects.filter(pk=r.pk).update(status="failed"),
        ": status is 'failed' in the row; the events give 'succeeded'"),
    "run output": (
        lambda r, a: Run.objects.filter(pk=r.pk).update(output={"total": 1}),
        ': output is {{"total":1}} in the row; the events give {{"ratio":1.5,"total":9}}'),
    "run created_by": (
        lambda r, a: Run.objects.filter(pk=r.pk).update(created_by="eve"),
        ": created_by is 'eve' in the row; the events give 'ann'"),
    "run lease": (
        lambda r, a: Run.objects.filter(pk=r.pk).update(lease_owner="ghost", lease_epoch=9),
        ": lease_owner is 'ghost' in the row; the events give ''"),
    "delete approval": (
        lambda r, a: _raw("DELETE FROM runtime_approval WHERE id = %s", a.pk),
        "approval {a}: no row; the events give one (policy, consumed)"),
    "delete step": (
        lambda r, a: _raw('DELETE FROM runtime_step WHERE run_id = %s AND "index" = %s', r.pk, 4),
        "step 4: no row; the events give one (succeeded, tool '')"),
    "insert step": (_extra_step, "step 5: a row (succeeded, tool 'charge') that no event"),
    "insert approval": (_extra_approval,
                        "approval {new}: a row (policy, consumed) that no event describes"),
}


@pytest.mark.parametrize("tamper", TAMPERING)
def test_a_row_edited_behind_the_runtimes_back_is_reported(approved, tamper):
    run, approval = approved
    edit, expected = TAMPERING[tamper]
    new = edit(run, approval)
    problems = replay_problems(run.pk)
    want = f"run {run.pk}" + ("" if expected.startswith(":") else " ") + expected.format(
        a=approval.pk, new=new)
    assert any(p.startswith(want) for p in problems), problems
    assert all(p.startswith(f"run {run.pk}") and "\n" not in p for p in problems)


def test_a_missing_run_and_a_run_without_events_are_reported(database, tmp_path, clock):
    assert replay_problems(987654) == ["run 987654: no run row"]
    state = replay_events([])
    assert state.events == 0 and not state.run.created


def test_replay_knows_every_event_kind_and_reports_one_it_does_not(database, tmp_path, clock):
    assert REPLAYED_KINDS == EVENT_KINDS  # a new kind needs its meaning taught to replay
    state = replay_events([("run.created", None, {"agent": "a", "input": 1}, clock.now()),
                           ("approval.teleported", 1, {"approval_id": 3}, clock.now())])
    assert state.unreadable == ["event #2 is of kind 'approval.teleported', which replay does "
                                "not know: the rows cannot be vouched for"]


def test_json_values_compare_by_canonical_json(database, tmp_path, clock, approved):
    """Key order and 1 against 1.0 are not differences; a changed value is."""
    run, approval = approved
    Run.objects.filter(pk=run.pk).update(output={"total": 9.0, "ratio": 1.5})
    Approval.objects.filter(pk=approval.pk).update(arguments={"amount": 9.0})
    assert replay_problems(run.pk) == []
    Run.objects.filter(pk=run.pk).update(output={"total": 9, "ratio": 1.25})
    assert len(replay_problems(run.pk)) == 1


def test_replay_reads_a_run_in_a_fixed_number_of_queries(database, tmp_path, clock):
    ledger = Ledger(tmp_path / "l")
    counts = []
    for n in (1, 25):
        script = [ToolCall("read", {"key": str(i)}) for i in range(n)] + [FinalAnswer(n)]
        agent = Agent(f"q{n}", ScriptedLLM(script), make_tools(ledger))
        with registry.override(agent):
            run = drive(start(f"q{n}", {}, clock=clock).pk, clock)
        with CaptureQueriesContext(connection) as queries:
            assert replay_problems(run.pk) == []
        counts.append(len(queries))
    assert counts[0] == counts[1] <= 4
