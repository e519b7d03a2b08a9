"""Deciding many approvals at once: approve (allow, run once more) or reject (end the runs)
every approval of a batch, each on the request whose digest the person was shown, or none.

Every item is checked before anything is written (its status, deadline, digest, and the
rules' refusals such as four-eyes), so a refused batch names each refused item. The plans
then commit in ONE transaction, in approval id order (two batches lock rows in one order, so
they never deadlock on PostgreSQL): a plan refused at commit, because someone decided an item
meanwhile, rolls every other one back. Resolving records a result a person found for one call:
it stays one at a time (``runtime.approvals.decisions.resolve``).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.db import transaction

from runtime.approvals.decisions import (
    DECIDE_ATTEMPTS,
    approval_load,
    decision_inputs,
    decision_lost,
    decision_plan,
)
from runtime.approvals.rules import Decision, already_decided
from runtime.clock import SYSTEM_CLOCK
from runtime.errors import AgentRuntimeError, ApprovalConflict, BatchRefused, InvalidDecision
from runtime.models import Approval, ApprovalStatus
from runtime.storage.base import Refused
from runtime.storage.engines import engine, notify_ready
from runtime.storage.events import log_events
from runtime.storage.plan import Plan

BATCH_LIMIT = 100  # approvals in one batch: one transaction holds all their rows
BATCH_DECISIONS = (Decision.APPROVE, Decision.REJECT)
DIGEST_MAX = 128  # a digest is 64 hex characters; anything longer is not one
NOTHING_DECIDED = "nothing was decided: "  # how a refusal naming approvals begins


def approvals_decide(items: Sequence[tuple[int, str]], decision: Decision | str, by: str,
                     note: str = "", *, now: datetime | None = None) -> list[Approval]:
    """Make ``decision`` (approve or reject) on every approval of ``items`` — pairs of
    (approval id, the digest of the request the person was shown) — as ``by``, all in one
    commit, and return them decided (in the order given). ``BatchRefused`` changes nothing: its
    ``refusals`` name each approval refused and why (already decided, expired, stale, four-eyes,
    no such approval), or its ``reason`` says what is wrong with the batch itself."""
    decision = _batch_decision(decision)
    pairs = _batch_items(items)
    note = note or ""
    try:
        decision, note, _ = decision_inputs(pairs[0][0], decision, by, note, None)
    except InvalidDecision as exc:
        raise BatchRefused(exc.reason) from None
    now = now or SYSTEM_CLOCK.now()
    for attempt in range(1, DECIDE_ATTEMPTS + 1):
        try:
            committed = _commit_batch(pairs, decision, by, note, now)
            break
        except BatchRefused as refused:
            # Only runs whose chains moved beside their approvals (a deadline warning): plan
            # the whole batch again on the new heads.
            if attempt == DECIDE_ATTEMPTS or not refused.refusals or any(
                    getattr(e, "reason_code", "") != "retry"
                    for e in refused.refusals.values()):
                raise
    for one in committed:
        log_events(one.rows)
    if decision == Decision.APPROVE:
        notify_ready()  # the runs are queued: once for the batch
    fresh = Approval.objects.select_related("run", "step").in_bulk([pk for pk, _ in pairs])
    return [fresh[pk] for pk, _ in pairs]


def _commit_batch(pairs: list[tuple[int, str]], decision: Decision, by: str, note: str,
                  now: datetime) -> list[Any]:
    """Every item planned, then every plan committed in one transaction, or ``BatchRefused``
    naming each refused item (nothing written)."""
    planned: list[tuple[Approval, Plan]] = []
    refusals: dict[int, AgentRuntimeError] = {}
    for pk, shown in pairs:
        try:
            approval = approval_load(pk)
            planned.append((approval, _item_plan(approval, shown, decision, by, note, now)))
        except AgentRuntimeError as exc:
            refusals[pk] = exc
    if refusals:
        raise BatchRefused(_refused_words(len(refusals), len(pairs)), refusals)
    planned.sort(key=lambda pair: pair[0].pk)  # one lock order for every batch
    eng = engine()
    committed: list[Any] = []
    current: Approval | None = None
    try:
        with transaction.atomic():
            for approval, plan in planned:
                current = approval
                committed.append(eng.apply_in_tx(plan, SYSTEM_CLOCK))
    except Refused:
        assert current is not None
        raise _lost(pairs, current, decision, by, now) from None
    return committed


def _batch_decision(decision: Decision | str) -> Decision:
    try:
        chosen = Decision(decision)
    except ValueError:
        raise BatchRefused(f"unknown decision {decision!r}; a batch approves or "
                           "rejects") from None
    if chosen not in BATCH_DECISIONS:
        raise BatchRefused("resolving records the result a person found for one call: it is "
                           "done one approval at a time, never in a batch")
    return chosen


def _batch_items(items: Sequence[tuple[int, str]]) -> list[tuple[int, str]]:
    """The items checked as inputs: some, at most ``BATCH_LIMIT``, each id once, each with a
    digest (the request the person was shown)."""
    pairs = list(items)
    if not pairs:
        raise BatchRefused("a batch needs at least one approval")
    if len(pairs) > BATCH_LIMIT:
        raise BatchRefused(f"a batch decides at most {BATCH_LIMIT} approvals; this one has "
                           f"{len(pairs)}")
    seen: set[int] = set()
    refusals: dict[int, AgentRuntimeError] = {}
    for pk, shown in pairs:
        if not isinstance(pk, int) or isinstance(pk, bool):
            raise BatchRefused(f"an approval id is a whole number, not {pk!r}")
        if pk in seen:
            refusals[pk] = InvalidDecision(pk, "named twice in one batch")
        elif not isinstance(shown, str) or not shown or len(shown) > DIGEST_MAX:
            refusals[pk] = InvalidDecision(pk, "needs the digest of the request that was "
                                           "shown")
        seen.add(pk)
    if refusals:
        raise BatchRefused(_refused_words(len(refusals), len(pairs)), refusals)
    return pairs


def _item_plan(approval: Approval, shown: str, decision: Decision, by: str, note: str,
               now: datetime) -> Plan:
    """The one item's plan, or the typed error that refuses it: decided (or expired) first,
    then a request other than the one shown, then the rules' own refusals."""
    if approval.status != ApprovalStatus.PENDING:
        raise already_decided(approval)
    if approval.digest != shown:
        raise ApprovalConflict(approval.pk, "stale: the request shown is not the one this "
                               "approval now holds; look at it again", status=approval.status,
                               reason_code="stale")
    return decision_plan(approval, decision, by, note, None, now)


def _lost(pairs: list[tuple[int, str]], current: Approval, decision: Decision, by: str,
          now: datetime) -> BatchRefused:
    """Why the commit was refused, read afresh after the rollback: every item now refused
    (someone decided some meanwhile), and at least the one whose commit failed."""
    refusals: dict[int, AgentRuntimeError] = {}
    for pk, shown in pairs:
        try:
            _item_plan(approval_load(pk), shown, decision, by, "-", now)
        except AgentRuntimeError as exc:
            refusals[pk] = exc
    if current.pk not in refusals:
        refusals[current.pk] = decision_lost(current, now)
    return BatchRefused(_refused_words(len(refusals), len(pairs)), refusals)


def _refused_words(refused: int, total: int) -> str:
    which = "the approval" if total == 1 else f"{refused} of the {total} approvals"
    return f"{NOTHING_DECIDED}{which} cannot be decided as asked"
