"""The crash matrix (design §11): every crash point x tool kind x operator decision, each worker
killed for real (SIGKILL) and every run resumed in a fresh process on a fresh open of the file.

The whole matrix runs as one batch so the short leases are waited out once per phase, not once per
case: phase 1 kills one process per run, phase 2 kills the taking-over process where a cell needs
a double crash, then one worker drains everything, the operator decides, and a worker drains
again. Every run is checked against its cell's expected outcome and all six invariants, before and
after the decisions. The crash-safety table in docs/guides/testing.md is written from this run's
observations.

The matrix runs on both engines. Regenerate the table: ``make crash-table`` (writes
test-output/crash-matrix.md from SQLite, test-output/crash-matrix-postgres.md from PostgreSQL).
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from runtime.crashpoints import OFF_STEP_POINTS
from runtime.models import Approval, ApprovalStatus, Event, Run, Step
from runtime.testkit import APPROVE, REJECT, Crash, CrashPoint, ProcessKit, resolve_with
from tests.procs import ROOT

P = CrashPoint
KINDS = ["read", "charge", "send", "reconcile-check", "reconcile-wait", "reconcile-conflict",
         "scheduled-charge"]
# Runs a schedule with a standing authorization fired: the policy's approval of the charge is
# granted on the record (side_effect.auto_confirmed), and nothing else changes: an interrupted
# charge still asks a person.
SCHEDULED = {"scheduled-charge"}
BRANCHES = {"approve": APPROVE, "reject": REJECT, "resolve": resolve_with({"resolved": True})}

BEFORE_TOOL = {P.AFTER_STEP_STARTED, P.DURING_LLM_REQUEST}
STARTED = {P.AFTER_STEP_DECIDED, P.AFTER_TOOL_STARTED}
RESULT_LOST = {P.AFTER_TOOL_EFFECT, P.IN_TRANSACTION}
ON_TAKEOVER = {P.AFTER_RUN_RESUMED, P.AFTER_STEP_INTERRUPTED}

# What each kind does when its step-2 call started and the process died before the effect (S)
# and after it (E): (outcome, executions of step 2 counted by the outside world).
# A reconcile that finds no effect answers Continue; the crashed process (a runagent, not a
# registered worker) cannot be proved dead, so its call may still land as far as the runtime
# can tell, and a person decides (recovery.call_may_still_land).
IF_STARTED = {"read": ("re-ran", 1), "charge": ("waits:interrupted_side_effect", 0),
              "send": ("re-ran", 1), "reconcile-check": ("waits:reconcile", 0),
              "reconcile-wait": ("waits:reconcile", 0),
              "reconcile-conflict": ("failed:reconcile_conflict", 0),
              "scheduled-charge": ("waits:interrupted_side_effect", 0)}
IF_EFFECT = {"read": ("re-ran", 2), "charge": ("waits:interrupted_side_effect", 1),
             "send": ("waits:interrupted_side_effect", 1), "reconcile-check": ("reconciled", 1),
             "reconcile-wait": ("waits:reconcile", 1),
             "reconcile-conflict": ("failed:reconcile_conflict", 1),
             "scheduled-charge": ("waits:interrupted_side_effect", 1)}


@dataclass
class Cell:
    point: CrashPoint
    kind: str
    phases: list[Crash]
    outcome: str
    executions: int
    seen: dict[str, str] = field(default_factory=dict)  # branch -> what happened

    @property
    def waits(self) -> bool:
        return self.outcome.startswith("waits:")


# The Pydantic AI matrix (runtime.testkit.pai_agents): each kind behaves as its native twin.
PAI_KINDS = ["pai-read", "pai-charge", "pai-send"]
# The MCP matrix (runtime.testkit.mcp_agents): tools of a real MCP server process.
MCP_KINDS = ["mcp-read", "mcp-charge"]
TWIN = {"pai-read": "read", "pai-charge": "charge", "pai-send": "send", "mcp-read": "read",
        "mcp-charge": "charge"}
# A Pydantic AI run's commit of step 2's result is the 2nd commit naming step 2 (its start and
# decision, its result with the next model request), the 3rd for a tool that records its
# dispatch; a native run's also starts step 3, so it is the first naming step 3.
PAI_RESULT_COMMIT = {"pai-read": 2, "pai-charge": 2, "pai-send": 3}


def plan(kinds: list[str] = KINDS) -> list[Cell]:
    """Every reachable (crash point, kind); unreachable ones are absent from the table."""
    cells = []
    for point in P:
        if point in OFF_STEP_POINTS:  # not a step's: test_outbox.py, test_group_commit.py
            continue
        for name in kinds:
            kind = TWIN.get(name, name)
            phases = [Crash(point, step_index=2)]
            if point in BEFORE_TOOL or point == P.AFTER_TOOL_FINISHED:
                outcome, n = "continued", 1
            elif point in STARTED:
                outcome, n = IF_STARTED[kind]
            elif point == P.IN_TRANSACTION:  # the commit holding step 2's result, rolled back
                phases = ([Crash(point, step_index=2, occurrence=PAI_RESULT_COMMIT[name])]
                          if name in PAI_RESULT_COMMIT else [Crash(point, step_index=3)])
                outcome, n = IF_EFFECT[kind]
            elif point == P.AFTER_TOOL_EFFECT:
                outcome, n = IF_EFFECT[kind]
            elif point in ON_TAKEOVER:  # the process taking over dies too
                phases = [Crash(P.AFTER_TOOL_STARTED, step_index=2), Crash(point, step_index=2)]
                outcome, n = IF_STARTED[kind]
            elif point == P.AFTER_PAUSE:  # only kinds that pause can crash after pausing
                if not IF_EFFECT[kind][0].startswith("waits:"):
                    continue
                phases = [Crash(P.AFTER_TOOL_EFFECT, step_index=2), Crash(point, step_index=2)]
                outcome, n = IF_EFFECT[kind]
            elif point == P.AFTER_TOOL_DISPATCHED:
                if kind != "send":
                    continue
                outcome, n = "waits:interrupted_side_effect", 0
            else:  # pragma: no cover - a new crash point must be added to the matrix
                raise AssertionError(f"the matrix does not cover {point}")
            cells.append(Cell(point, name, phases, outcome, n))
    return cells


def observe(run_id: int, ledger_counts: Counter) -> tuple[str, int]:
    """What happened to a run, from the database and the outside world's ledger."""
    run = Run.objects.get(pk=run_id)
    executions = ledger_counts[(run_id, 2)]
    if run.status == "waiting":
        approval = Approval.objects.get(run_id=run_id, status=ApprovalStatus.PENDING)
        return f"waits:{approval.kind}", executions
    if run.status == "failed":
        return f"failed:{run.failure_code}", executions
    assert run.status == "succeeded", f"run {run_id} is {run.status}"
    step2 = Event.objects.filter(run_id=run_id, step_index=2)
    if step2.filter(kind="reconcile.decided", payload__outcome="complete").exists():
        return "reconciled", executions
    starts = step2.filter(kind="step.tool_started").count()
    return ("re-ran" if starts > 1 else "continued"), executions


def standing_authorization_problems(run_id: int) -> list[str]:
    """A scheduled run never asked a person about its charge's first start: each start that
    no interrupted-side-effect approval authorized follows a side_effect.auto_confirmed by the
    schedule; no policy approval exists."""
    problems = []
    if Approval.objects.filter(run_id=run_id, kind="policy").exists():
        problems.append(f"run {run_id}: a policy approval in a run its schedule authorized")
    events = list(Event.objects.filter(run_id=run_id, step_index=2).order_by("seq"))
    for n, e in enumerate(events):
        if e.kind == "step.tool_started" and not e.payload.get("authorized_by"):
            before = events[n - 1] if n else None
            if before is None or before.kind not in ("side_effect.auto_confirmed",
                                                      "approval.consumed"):
                problems.append(f"run {run_id}: a start of step 2 with neither a standing "
                                f"nor a person's authorization (#{e.seq})")
            elif before.kind == "side_effect.auto_confirmed" and not (
                    before.actor.startswith("schedule:") and before.payload.get("authorized_by")):
                problems.append(f"run {run_id}: #{before.seq} does not name the schedule and "
                                "who authorized it")
    if not any(e.kind == "side_effect.auto_confirmed" for e in events):
        problems.append(f"run {run_id}: no side_effect.auto_confirmed on record")
    return problems


LABELS = {"continued": "continued", "re-ran": "re-ran on its own", "reconciled": "reconciled",
          "waits:interrupted_side_effect": "**asks a person**",
          "waits:reconcile": "**asks a person** (reconcile)",
          "failed:reconcile_conflict": "failed: reconcile conflict"}


def why_rerun(run_id: int) -> str:
    last = Event.objects.filter(run_id=run_id, step_index=2, kind="step.tool_started").last()
    return {"dispatch proof": "dispatch proof", "reconcile": "reconcile said so"}.get(
        last.payload.get("authorized_by", ""), "read-only")


# The matrices kill and start hundreds of processes: one after another on one test worker,
# each given the time that takes on a busy 2-CPU machine.
MATRIX = [pytest.mark.slow, pytest.mark.engines, pytest.mark.xdist_group("crash-matrix"),
          pytest.mark.timeout(900)]


def matrix(test):  # a decorator for the three matrices
    for mark in reversed(MATRIX):
        test = mark(test)
    return test


@matrix
def test_crash_matrix(database, tmp_path):
    run_matrix(database, tmp_path, KINDS, "runtime.testkit.agents.AGENTS",
               table_path(database.engine))


@matrix
def test_crash_matrix_of_a_pydantic_ai_agent(database, tmp_path):
    """The same matrix for a Pydantic AI agent: each kind ends as its native twin does, and
    the model, which counts the requests it is sent, is never sent a recorded one again."""
    kit = run_matrix(database, tmp_path, PAI_KINDS, "runtime.testkit.pai_agents.AGENTS",
                     table_path(database.engine, "pydantic-ai"))
    sent = Counter((c["prompt"], c["request"]) for c in kit.ledger.calls("model"))
    assert sent and max(sent.values()) == 1, [k for k, n in sent.items() if n > 1]


@matrix
def test_crash_matrix_of_mcp_tools(database, tmp_path):
    """The same matrix for an agent whose tools are a real MCP server's (a process started
    over stdio for each call): the server's own ledger counts the calls, from the run, step
    and attempt each request carried in its ``_meta``."""
    kit = run_matrix(database, tmp_path, MCP_KINDS, "runtime.testkit.mcp_agents.AGENTS",
                     table_path(database.engine, "mcp"))
    keys = {c["key"] for c in kit.ledger.calls("charge")}
    assert keys and all(k for k in keys)  # every call carried its idempotency key


def run_matrix(database, tmp_path, kinds: list[str], agents: str, table: Path) -> ProcessKit:
    kit = ProcessKit(database, tmp_path, agents=agents,
                     manage=ROOT / "manage.py", lease_seconds=3,
                     env={"RUNTIME_TEST_DIR": str(tmp_path)}, timeout=120)
    cells = plan(kinds)
    runs: dict[int, tuple[Cell, str]] = {}
    for cell in cells:
        start = kit.start_scheduled if cell.kind in SCHEDULED else kit.start
        for branch in ["none", *BRANCHES] if cell.waits else ["none"]:
            runs[start(cell.kind, {"cell": f"{cell.point}/{cell.kind}", "branch": branch})] = (
                cell, branch)

    # Phase 1: one real process per run, SIGKILLed at the cell's point; a fresh process is then
    # refused while the dead owner's lease is live (checked right after each kill).
    kit.crash_many([(rid, cell.phases[:1]) for rid, (cell, _) in runs.items()], refuse=True)
    # Phase 2: double crashes, where the taking-over process dies as well.
    kit.wait_for_expiry()
    kit.crash_many([(rid, cell.phases[1:]) for rid, (cell, _) in runs.items()
                    if len(cell.phases) > 1])
    kit.drain()

    ledger = kit.ledger.executions()
    wrong = []
    for rid, (cell, _branch) in runs.items():
        seen = observe(rid, ledger)
        label = LABELS[seen[0]] + (f" ({why_rerun(rid)})" if seen[0] == "re-ran" else "")
        cell.seen.setdefault("none", f"{label}; ran {seen[1]}")
        if seen != (cell.outcome, cell.executions):
            wrong.append(f"{cell.point} x {cell.kind} run {rid}: expected "
                         f"{(cell.outcome, cell.executions)}, saw {seen}")
    wrong += [problem for rid, (cell, _) in runs.items() if cell.kind in SCHEDULED
              for problem in standing_authorization_problems(rid)]
    assert not wrong, "\n".join(wrong)
    before = kit.check()  # all six invariants, decision "none yet"

    # The operator decides each branch's approval; a fresh worker drains again.
    for rid, (_cell, branch) in runs.items():
        if branch != "none":
            kit.decide(Approval.objects.get(run_id=rid, status=ApprovalStatus.PENDING).pk,
                       BRANCHES[branch])
    kit.drain(expiry=False)
    ledger = kit.ledger.executions()
    for rid, (cell, branch) in runs.items():
        if branch == "none":
            continue
        run, n = Run.objects.get(pk=rid), ledger[(rid, 2)]
        expected = {"approve": ("succeeded", cell.executions + 1),
                    "reject": ("failed", cell.executions),
                    "resolve": ("succeeded", cell.executions)}[branch]
        if (run.status, n) != expected:
            wrong.append(f"{cell.point} x {cell.kind} {branch} run {rid}: expected {expected}, "
                         f"saw {(run.status, n)} {run.failure_code}")
        if branch == "reject" and run.failure_code != "rejected":
            wrong.append(f"run {rid}: rejected run failed with {run.failure_code}")
        if branch == "resolve" and Step.objects.get(run_id=rid, index=2).result != {
                "resolved": True}:
            wrong.append(f"run {rid}: the resolved result was not recorded as step 2's")
        cell.seen[branch] = f"{run.status}, ran {n}"
    assert not wrong, "\n".join(wrong)
    after = kit.check()

    assert kit.refusals == sum(1 for c, _ in runs.values() if c.phases[0].point != P.AFTER_PAUSE)
    assert after.runs == len(runs) and after.approvals_consumed == sum(
        1 for _, b in runs.values() if b == "approve")
    write_table(cells, kinds, len(runs), before, after, table)
    return kit


def table_path(engine: str, suite: str = "") -> Path:
    """Where this engine's table goes: the SQLite one keeps its old name and
    ``CRASH_TABLE``; PostgreSQL's has its own file (``CRASH_TABLE_POSTGRES``); another
    suite's tables are named after it."""
    if suite:
        tail = "" if engine == "sqlite" else f"-{engine}"
        return ROOT / "test-output" / f"crash-matrix-{suite}{tail}.md"
    if engine == "sqlite":
        return Path(os.environ.get("CRASH_TABLE", ROOT / "test-output" / "crash-matrix.md"))
    return Path(os.environ.get("CRASH_TABLE_POSTGRES",
                               ROOT / "test-output" / f"crash-matrix-{engine}.md"))


def write_table(cells: list[Cell], kinds: list[str], runs: int, before, after,
                out: Path) -> None:
    """The crash-safety table, from what this run observed."""
    by = {(c.point, c.kind): c for c in cells}
    lines = ["| crash point | " + " | ".join(kinds) + " |",
             "|---|" + "---|" * len(kinds)]
    for point in P:
        if point in OFF_STEP_POINTS:
            continue
        row = []
        for kind in kinds:
            cell = by.get((point, kind))
            if cell is None:
                row.append("—")
                continue
            text = cell.seen["none"]
            if cell.waits:
                text += "".join(f"<br>{b}: {cell.seen[b]}" for b in BRANCHES)
            row.append(text)
        lines.append(f"| `{point}` | " + " | ".join(row) + " |")
    lines.append("")
    lines.append(f"{len(cells)} cells, {runs} runs, {after.events} events; invariants held "
                 f"before the decisions ({before.side_effect_executions} side-effect executions "
                 f"counted outside) and after ({after.side_effect_executions}, "
                 f"{after.approvals_consumed} approvals consumed).")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
