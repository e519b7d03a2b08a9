"""Reads for people: what the console (or any other reader) shows, with the runtime's rules
applied here, once, so a page never restates which decisions are allowed or whether a lease
holds.

Each selector loads only the columns its readers show and is bounded: a run of 5,000 steps
or an audit log of a million events costs a page the same as a short one. Each topic has its
module (``approvals``, ``runs``, ``workers``, ``schedules``); the first three are gathered
here, so ``from runtime import selectors`` reads them all.
"""

from runtime.selectors.approvals import (
    QUEUE_FIELDS,
    QUEUE_SORTS,
    approval_after_restore,
    approval_batchable,
    approval_deadline_urgency,
    approval_decisions,
    approval_edit,
    approval_edit_note,
    approval_edit_schema,
    approval_editable,
    approval_effect_source,
    approval_for_page,
    approval_four_eyes_blocked,
    approval_is_policy,
    approval_notifications,
    approval_outcome_unknown,
    approval_past_deadline,
    approval_queue,
    approval_queue_version,
    approval_tampered,
    approval_version,
    approvals_after,
    pending,
)
from runtime.selectors.runs import (
    Tail,
    events_after,
    events_tail,
    run_approvals,
    run_awaits_worker,
    run_cancellable,
    run_for_page,
    run_is_live,
    run_lease_live,
    run_version,
    runs_without_worker,
    steps_tail,
    with_lease_state,
)
from runtime.selectors.workers import agents_without_live_worker, live_workers, worker_live

__all__ = [
    "QUEUE_FIELDS",
    "QUEUE_SORTS",
    "Tail",
    "agents_without_live_worker",
    "approval_after_restore",
    "approval_batchable",
    "approval_deadline_urgency",
    "approval_decisions",
    "approval_edit",
    "approval_edit_note",
    "approval_edit_schema",
    "approval_editable",
    "approval_effect_source",
    "approval_for_page",
    "approval_four_eyes_blocked",
    "approval_is_policy",
    "approval_notifications",
    "approval_outcome_unknown",
    "approval_past_deadline",
    "approval_queue",
    "approval_queue_version",
    "approval_tampered",
    "approval_version",
    "approvals_after",
    "events_after",
    "events_tail",
    "live_workers",
    "pending",
    "run_approvals",
    "run_awaits_worker",
    "run_cancellable",
    "run_for_page",
    "run_is_live",
    "run_lease_live",
    "run_version",
    "runs_without_worker",
    "steps_tail",
    "with_lease_state",
    "worker_live",
]
