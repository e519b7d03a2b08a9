"""The API's request and response shapes (typed pydantic schemas, published as OpenAPI at
``/api/openapi.json``)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from ninja import Field, Schema

from runtime.approvals.batch import BATCH_LIMIT
from runtime.approvals.rules import Decision

STEPS_SHOWN = 50  # a run's or an approval's latest steps; the events endpoint pages all


class ErrorOut(Schema):
    code: str
    message: str
    status: str | None = None
    decided_by: str | None = None
    decided_at: datetime | None = None
    errors: list[dict[str, Any]] | None = None
    items: list[dict[str, Any]] | None = Field(None, description="A refused batch: each "
                                               "refused approval's id, code and message.")


ERRORS = {401: ErrorOut, 403: ErrorOut, 404: ErrorOut, 405: ErrorOut, 409: ErrorOut,
          415: ErrorOut, 422: ErrorOut}


class StepOut(Schema):
    index: int
    status: str
    tool: str
    effect: str
    arguments: Any
    result: Any
    error: str
    attempt: int
    started_at: datetime
    finished_at: datetime | None


class ApprovalSummary(Schema):
    id: int
    run_id: int
    agent: str
    step_index: int
    kind: str
    status: str
    tool: str
    effect: str
    title: str
    digest: str
    created_at: datetime
    expires_at: datetime | None


class ApprovalPage(Schema):
    items: list[ApprovalSummary]
    next_cursor: str | None = Field(description="Pass as ?cursor= for the next page; null at "
                                                "the end.")


class ApprovalOut(ApprovalSummary):
    arguments: Any
    detail: str
    decided_by: str | None
    decided_at: datetime | None
    note: str
    result: Any
    decisions: Sequence[str] = Field(description="What the caller may decide now.")
    editable: bool = Field(False, description="Whether the caller may approve with edited "
                           "``arguments`` now (a pending policy approval whose agent and tool "
                           "allow it).")
    edited_by: str | None = Field(None, description="Who edited the arguments it ran with.")
    effective_arguments: Any = Field(None, description="The arguments it was allowed with, "
                                     "when edited (``arguments`` stay the proposed ones).")
    effective_digest: str | None = Field(None, description="The digest of the edited request.")
    steps: list[StepOut] = Field(description=f"The run's latest {STEPS_SHOWN} steps.")
    steps_total: int


class DecideIn(Schema):
    decision: Decision
    expected_digest: str = Field(max_length=128, description="The digest of the request you "
                                 "decided on; another one is refused as stale.")
    note: str = Field("", max_length=10_000)
    result: Any = Field(None, description="For resolve: the call's outcome, as JSON.")
    arguments: dict[str, Any] | None = Field(
        None, description="For approve on a policy approval: run the call with these "
        "arguments instead of the proposed ones (checked by the tool's schema; refused where "
        "the call may have happened already, or the agent or tool forbids editing).")


class BatchItemIn(Schema):
    id: int
    digest: str = Field(max_length=128, description="The digest of the request you decided "
                        "on; another one is refused as stale.")


class BatchDecideIn(Schema):
    decision: Decision = Field(description="approve or reject (resolve is one at a time).")
    note: str = Field("", max_length=10_000)
    approvals: list[BatchItemIn] = Field(min_length=1, max_length=BATCH_LIMIT)


class DecidedOut(ApprovalSummary):
    decided_by: str | None
    decided_at: datetime | None
    note: str


class BatchOut(Schema):
    decided: int
    items: list[DecidedOut] = Field(description="Every approval decided, in the order sent.")


class RunIn(Schema):
    agent: str = Field(max_length=200)
    input: Any = None


class RunOut(Schema):
    id: int
    agent: str
    status: str
    input: Any
    output: Any
    failure_code: str
    failure_message: str
    created_by: str
    created_at: datetime
    updated_at: datetime
    event_seq: int
    steps: list[StepOut] = Field(description=f"The run's latest {STEPS_SHOWN} steps.")
    steps_total: int


class EventOut(Schema):
    seq: int
    kind: str
    step_index: int | None
    payload: Any
    actor: str
    at: datetime


class EventPage(Schema):
    items: list[EventOut]
    next_cursor: str | None
