"""OpenAPI links: which values of one answer a client feeds to which operation next (the
approval a listing names, the run a start made). They document the API's paths for people
and let a fuzzer's stateful phase follow them with real ids and digests."""

from __future__ import annotations

from typing import Any

LIST_APPROVALS = "listApprovals"
DECIDE_APPROVALS = "decideApprovals"
GET_APPROVAL = "getApproval"
DECIDE_APPROVAL = "decideApproval"
START_RUN = "startRun"
GET_RUN = "getRun"
LIST_RUN_EVENTS = "listRunEvents"


def link(operation_id: str, description: str, parameters: dict[str, str] | None = None,
         body: dict[str, Any] | None = None) -> dict[str, Any]:
    """One OpenAPI link object: ``parameters`` and ``body`` hold runtime expressions."""
    found: dict[str, Any] = {"operationId": operation_id, "description": description}
    if parameters:
        found["parameters"] = parameters
    if body:
        found["requestBody"] = body
    return found


def links(status: int, **named: dict[str, Any]) -> dict[str, Any]:
    """An operation's ``openapi_extra``: the links of its ``status`` answer."""
    return {"responses": {status: {"links": named}}}


FIRST = "$response.body#/items/0"

APPROVALS_LINKS = links(
    200,
    FirstApproval=link(GET_APPROVAL, "Read the first approval listed.",
                       {"approval_id": f"{FIRST}/id"}),
    DecideFirstApproval=link(DECIDE_APPROVAL, "Decide the first approval listed, on the "
                             "request it lists.", {"approval_id": f"{FIRST}/id"},
                             {"expected_digest": f"{FIRST}/digest"}),
    DecideFirstInABatch=link(DECIDE_APPROVALS, "Decide the first approval listed in a batch.",
                             body={"approvals": [{"id": f"{FIRST}/id",
                                                  "digest": f"{FIRST}/digest"}]}),
    FirstApprovalsRun=link(GET_RUN, "Read the run of the first approval listed.",
                           {"run_id": f"{FIRST}/run_id"}),
    NextPage=link(LIST_APPROVALS, "The next page (while next_cursor is not null).",
                  {"query.cursor": "$response.body#/next_cursor"}),
)

APPROVAL_LINKS = links(
    200,
    Decide=link(DECIDE_APPROVAL, "Decide this approval on the request just read.",
                {"approval_id": "$response.body#/id"},
                {"expected_digest": "$response.body#/digest"}),
    Run=link(GET_RUN, "Read this approval's run.", {"run_id": "$response.body#/run_id"}),
)

DECIDED_LINKS = links(
    200,
    Approval=link(GET_APPROVAL, "Read the approval again.", {"approval_id": "$response.body#/id"}),
    Run=link(GET_RUN, "Read the run the decision lets go on or ends.",
             {"run_id": "$response.body#/run_id"}),
)

BATCH_LINKS = links(
    200,
    FirstDecided=link(GET_APPROVAL, "Read the first approval the batch decided.",
                      {"approval_id": f"{FIRST}/id"}),
)

STARTED_LINKS = links(
    201,
    Run=link(GET_RUN, "Read the run just started.", {"run_id": "$response.body#/id"}),
    Events=link(LIST_RUN_EVENTS, "Read the started run's events.",
                {"run_id": "$response.body#/id"}),
)

RUN_LINKS = links(
    200,
    Events=link(LIST_RUN_EVENTS, "Read this run's events.", {"run_id": "$response.body#/id"}),
)

EVENTS_LINKS = links(
    200,
    NextPage=link(LIST_RUN_EVENTS, "The next page (while next_cursor is not null).",
                  {"run_id": "$request.path.run_id",
                   "query.cursor": "$response.body#/next_cursor"}),
)
