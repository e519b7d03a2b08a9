"""Everything ``verifyaudit`` checks, in one place: the append-only triggers, the global chain,
every run's own chain and its rows replayed from its events, and a signed checkpoint.

The triggers are what make the log append-only; someone who can drop (or disable, or rewrite)
them can do anything, so their presence, exact text and state are checked first. What they
would have stopped is then found by the chains (an edit, a deletion, a rollback) and, for a
rewrite that re-hashed a whole chain, by a checkpoint taken before it.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from django.db import connections

from runtime.audit.chain import EVENT_COLUMNS, chain_check, replay_verdict
from runtime.audit.checkpoint import checkpoint_verify
from runtime.audit.compare import replay_compare
from runtime.audit.creations import creations_verify
from runtime.models import Approval, Event, Run, RunCreation, Step
from runtime.schedules.verify import schedules_problems
from runtime.storage.triggers import (
    APPEND_ONLY_TABLES,
    POSTGRES_FUNCTION_BODY,
    _postgres_expected,
    _sqlite_expected,
)


def _normal(sql: str) -> str:
    return " ".join(sql.split())


def triggers_problems(using: str = "default") -> list[str]:
    """What is wrong with the append-only triggers: missing, altered, or disabled."""
    connection = connections[using]
    problems = []
    with connection.cursor() as cur:
        if connection.vendor == "sqlite":
            expected = _sqlite_expected()
            cur.execute("SELECT name, sql FROM sqlite_master WHERE type = 'trigger'")
            found = {name: _normal(sql or "") for name, sql in cur.fetchall()}
            enabled = dict.fromkeys(found, True)
            bodies_ok = True
        elif connection.vendor == "postgresql":
            expected = _postgres_expected()
            cur.execute(
                "SELECT t.tgname, pg_get_triggerdef(t.oid), t.tgenabled IN ('O', 'A'), p.prosrc "
                "FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid "
                "JOIN pg_proc p ON p.oid = t.tgfoid "
                "WHERE NOT t.tgisinternal AND c.relname = ANY(%s) "
                "AND c.relnamespace = to_regnamespace(current_schema())",
                [list(APPEND_ONLY_TABLES)])
            rows = cur.fetchall()
            found = {name: re.sub(r" ON \S+\.", " ON ", _normal(d)) for name, d, _, _ in rows}
            enabled = {name: on for name, _, on, _ in rows}
            bodies_ok = all(_normal(src) == POSTGRES_FUNCTION_BODY for _, _, _, src in rows)
            if not bodies_ok:
                problems.append("the append-only trigger function runtime_event_append_only() "
                                "was replaced: it no longer refuses")
        else:
            return [f"no append-only triggers are known for {connection.vendor}"]
    for name, sql in expected.items():
        if name not in found:
            problems.append(f"trigger {name} is missing: the table it guards can be changed "
                            "or emptied without a trace in the database")
        elif found[name] != _normal(sql):
            problems.append(f"trigger {name} was altered: {found[name]}")
        elif not enabled[name]:
            problems.append(f"trigger {name} is disabled")
    return problems


@dataclass
class AuditReport:
    """What ``audit_check`` looked at, for the command's last line."""

    runs: int = 0
    broken_runs: int = 0
    creations: int = 0
    checkpoint: int | None = None
    problems: int = 0


def audit_check(*, using: str = "default", run_id: int | None = None,
                checkpoint: dict[str, Any] | None = None,
                report: Callable[[str], None] = lambda line: None,
                progress: Callable[[str], None] | None = None) -> AuditReport:
    """Run every check; each problem goes to ``report`` as one line. ``run_id`` narrows the
    per-run checks to one run (the triggers and the global chain are still checked)."""

    out = AuditReport()

    def problem(line: str) -> None:
        out.problems += 1
        report(line)

    for line in triggers_problems(using):
        problem(line)
    for line in creations_verify(using):
        problem(line)
    for line in schedules_problems(using):
        problem(line)
    out.creations = RunCreation.objects.using(using).count()
    runs = Run.objects.using(using).order_by("pk")
    if run_id is not None:
        runs = runs.filter(pk=run_id)
    batch: list[Run] = []
    for run in runs.iterator(chunk_size=_BATCH):
        batch.append(run)
        if len(batch) == _BATCH:
            _verify_batch(batch, using, out, problem)
            batch = []
            if progress is not None and out.runs % 10_000 == 0:
                progress(f"{out.runs:,} runs verified")
    _verify_batch(batch, using, out, problem)
    if checkpoint is not None:
        out.checkpoint = checkpoint["checkpoint"]
        for line in _checkpoint_lines(checkpoint, using, run_id):
            problem(line)
    return out


_BATCH = 500  # runs whose events, steps and approvals are read in one query each


def _verify_batch(runs: list, using: str, out: AuditReport,
                  problem: Callable[[str], None]) -> None:
    """Each run's chain and replay (``audit.verify``'s two checks) over rows read in three
    queries for the whole batch: per-run queries would cost more than the checks."""

    if not runs:
        return
    ids = [r.pk for r in runs]
    events: dict[int, list[tuple]] = defaultdict(list)
    rows = Event.objects.using(using).filter(run_id__in=ids).order_by("run_id", "seq")
    for row in rows.values_list("run_id", *EVENT_COLUMNS).iterator(chunk_size=5000):
        events[row[0]].append(row[1:])
    steps: dict[int, list] = defaultdict(list)
    for step in Step.objects.using(using).filter(run_id__in=ids):
        steps[step.run_id].append(step)
    approvals: dict[int, list] = defaultdict(list)
    for approval in Approval.objects.using(using).filter(run_id__in=ids):
        approvals[approval.run_id].append(approval)
    for run in runs:
        own = events.pop(run.pk, [])
        result = chain_check(run.pk, run.event_seq, run.event_hash, own)
        if result.ok:
            result = replay_verdict(result, replay_compare(
                run, ((k, i, p, at) for _, k, i, p, _, at, _ in own), steps[run.pk],
                approvals[run.pk]))
        out.runs += 1
        if not result.ok:
            out.broken_runs += 1
            problem(str(result))


def _checkpoint_lines(doc: dict[str, Any], using: str, run_id: int | None) -> Iterator[str]:
    if run_id is not None:
        doc = {**doc, "heads": [h for h in doc["heads"] if h[0] == run_id]}
    yield from checkpoint_verify(doc, using)
