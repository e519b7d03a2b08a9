"""The endpoints: programs read the queue, decide approvals and start runs, with the console's
permissions and the runtime's rules (nothing here restates them). Decisions and starts go
through ``runtime.approvals`` and ``runtime.loop.control``; reads through
``runtime.selectors``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.http import HttpRequest, HttpResponse
from ninja import Query, Schema

from console.api.app import api
from console.api.cursors import CURSOR, approval_cursor, cursor_encode, event_cursor
from console.api.errors import ApiError, conflict
from console.api.idempotency import IDEMPOTENCY_KEY, idempotent
from console.api.links import (
    APPROVAL_LINKS,
    APPROVALS_LINKS,
    BATCH_LINKS,
    DECIDE_APPROVAL,
    DECIDE_APPROVALS,
    DECIDED_LINKS,
    EVENTS_LINKS,
    GET_APPROVAL,
    GET_RUN,
    LIST_APPROVALS,
    LIST_RUN_EVENTS,
    RUN_LINKS,
    START_RUN,
    STARTED_LINKS,
)
from console.api.schemas import (
    ERRORS,
    STEPS_SHOWN,
    ApprovalOut,
    ApprovalPage,
    BatchDecideIn,
    BatchOut,
    DecideIn,
    EventPage,
    RunIn,
    RunOut,
    StepOut,
)
from console.batch import batch_status, item_code, item_message
from console.permissions import DECIDE, VIEW
from runtime import selectors
from runtime.approvals.batch import approvals_decide
from runtime.approvals.decisions import approval_decide
from runtime.approvals.rules import Decision
from runtime.canonical import check_payload
from runtime.errors import (
    ApprovalConflict,
    BatchRefused,
    FourEyesViolation,
    InvalidArguments,
    InvalidDecision,
    InvalidEdit,
    InvalidPayload,
    UnknownAgent,
)
from runtime.loop.control import start
from runtime.models import Approval, ApprovalStatus, Event, Run, Step

if TYPE_CHECKING:
    from django.contrib.auth.models import User  # settings.AUTH_USER_MODEL, as the stubs see it

START = "runtime.add_run"  # Django's default "add" permission of the Run model
MAX_LIMIT = 200


# -- helpers ---------------------------------------------------------------------------------

def _user(request: HttpRequest, perm: str) -> User:
    user = request.auth  # type: ignore[attr-defined]
    if not user.has_perm(perm):
        raise ApiError("forbidden", f"this needs the permission {perm}")
    return user


def _steps(run_id: int) -> tuple[list[StepOut], int]:
    tail = selectors.steps_tail(run_id, limit=STEPS_SHOWN)
    return [_step(s) for s in tail.rows], tail.total


def _step(step: Step) -> StepOut:
    return StepOut(index=step.index, status=step.status, tool=step.tool, effect=step.effect,
                   arguments=step.arguments, result=step.result, error=step.error,
                   attempt=step.attempt, started_at=step.started_at,
                   finished_at=step.finished_at)


def _summary(a: Approval) -> dict[str, Any]:
    return {"id": a.pk, "run_id": a.run_id, "agent": a.run.agent, "step_index": a.step.index,
            "kind": a.kind, "status": a.status, "tool": a.tool, "effect": a.effect,
            "title": a.title, "digest": a.digest, "created_at": a.created_at,
            "expires_at": a.expires_at}


def _approval(a: Approval, by: str) -> ApprovalOut:
    steps, total = _steps(a.run_id)
    return ApprovalOut(**_summary(a), arguments=a.arguments, detail=a.detail,
                       decided_by=a.decided_by or None, decided_at=a.decided_at, note=a.note,
                       result=a.result, decisions=selectors.approval_decisions(a, by),
                       editable=selectors.approval_editable(a, by), edited_by=a.edited_by or None,
                       effective_arguments=a.effective_arguments,
                       effective_digest=a.effective_digest or None,
                       steps=steps, steps_total=total)


def _run(run: Run) -> RunOut:
    steps, total = _steps(run.pk)
    return RunOut(id=run.pk, agent=run.agent, status=run.status, input=run.input,
                  output=run.output, failure_code=run.failure_code,
                  failure_message=run.failure_message, created_by=run.created_by,
                  created_at=run.created_at, updated_at=run.updated_at,
                  event_seq=run.event_seq, steps=steps, steps_total=total)


def _text(what: str, value: str) -> str:
    """Free text within the payload rules (no NUL, no lone surrogate: both engines store it)."""
    try:
        return check_payload(what, value)
    except InvalidPayload as exc:
        raise ApiError("invalid", str(exc)) from None


def _json(model: Schema) -> dict[str, Any]:
    return model.model_dump(mode="json")


# -- endpoints -------------------------------------------------------------------------------


@api.get("/approvals/", response={200: ApprovalPage, **ERRORS}, url_name="approvals",
         operation_id=LIST_APPROVALS, openapi_extra=APPROVALS_LINKS,
         summary="Pending approvals, oldest first")
def list_approvals(request: HttpRequest, cursor: str | None = CURSOR,
                   limit: int = Query(50, ge=1, le=MAX_LIMIT)) -> dict[str, Any]:
    """The queue, oldest first, a page at a time: keyset pagination, so no approval is
    skipped or repeated while others are added or decided."""
    _user(request, VIEW)
    rows, more = selectors.approvals_after(approval_cursor(cursor), limit)
    last = rows[-1] if rows else None
    return {"items": [_summary(a) for a in rows],
            "next_cursor": cursor_encode([last.created_at.isoformat(), last.pk])
            if more and last else None}


# Before "/approvals/{approval_id}": Django tries the paths in order, and that one would
# take "decide" for an id.
@api.post("/approvals/decide", response={200: BatchOut, **ERRORS}, url_name="decide-batch",
          operation_id=DECIDE_APPROVALS, openapi_extra=BATCH_LINKS,
          summary="Approve or reject several approvals at once: all of them or none")
def decide_batch(request: HttpRequest, payload: BatchDecideIn,
                 idempotency_key: str | None = IDEMPOTENCY_KEY) -> HttpResponse:
    """Decides every listed approval on the request whose digest is given, in one commit.
    Refused whole, nothing decided, when any one may not be decided as asked (already
    decided, expired, stale, four-eyes, no such approval): 409, 403 or 422 with ``items``
    naming each refused approval. Resolve is one approval at a time."""
    user = _user(request, DECIDE)
    by = user.get_username()
    body = payload.model_dump(mode="json")

    def answer() -> tuple[int, dict[str, Any]]:
        note = _text("note", payload.note)
        items = [(item.id, item.digest) for item in payload.approvals]
        try:
            decided = approvals_decide(items, payload.decision, by, note)
        except BatchRefused as exc:
            raise batch_refused(exc) from None
        rows = [{**_summary(a), "decided_by": a.decided_by or None,
                 "decided_at": a.decided_at, "note": a.note} for a in decided]
        return 200, _json(BatchOut(decided=len(rows), items=rows))  # type: ignore[arg-type]

    return idempotent(request, user, body, answer)


def batch_refused(exc: BatchRefused) -> ApiError:
    """A refused batch as one error naming each refused approval (the console's codes)."""
    items = [{"id": pk, "code": item_code(why), "message": item_message(why)}
             for pk, why in sorted(exc.refusals.items())]
    status = batch_status(exc)
    codes = {i["code"] for i in items}
    if status == 422:
        code = "invalid"
    elif status == 403:
        code = "forbidden"
    else:
        code = next(c for c in ("already_decided", "stale", "retry") if c in codes)
    return ApiError(code, exc.reason, items=items)


@api.get("/approvals/{approval_id}", response={200: ApprovalOut, **ERRORS},
         url_name="approval", operation_id=GET_APPROVAL, openapi_extra=APPROVAL_LINKS,
         summary="One approval: the request and its run's steps")
def get_approval(request: HttpRequest, approval_id: int) -> ApprovalOut:
    user = _user(request, VIEW)
    approval = selectors.approval_for_page(approval_id)
    if approval is None:
        raise ApiError("not_found", f"no approval {approval_id}")
    return _approval(approval, user.get_username())


@api.post("/approvals/{approval_id}/decide", response={200: ApprovalOut, **ERRORS},
          url_name="decide", operation_id=DECIDE_APPROVAL, openapi_extra=DECIDED_LINKS,
          summary="Approve, resolve or reject an approval")
def decide(request: HttpRequest, approval_id: int, payload: DecideIn,
           idempotency_key: str | None = IDEMPOTENCY_KEY) -> HttpResponse:
    """Decides on the request whose digest is ``expected_digest`` and no other. Of two callers
    deciding at once exactly one wins; the other gets 409 ``already_decided``."""
    user = _user(request, DECIDE)
    by = user.get_username()
    body = payload.model_dump(mode="json", exclude_unset=True)

    def answer() -> tuple[int, dict[str, Any]]:
        approval = selectors.approval_for_page(approval_id)
        if approval is None:
            raise ApiError("not_found", f"no approval {approval_id}")
        if payload.decision == Decision.RESOLVE and "result" not in payload.model_fields_set:
            raise ApiError("invalid", "resolve needs the call's result",
                           errors=[{"loc": ["body", "payload", "result"], "msg": "required",
                                    "type": "missing"}])
        note = _text("note", payload.note)
        if approval.digest != payload.expected_digest \
                and approval.status == ApprovalStatus.PENDING:
            raise ApiError("stale", "the approval's request is not the one you decided on "
                           "(expected_digest differs); read it again", status=approval.status)
        try:
            approval_decide(approval.pk, payload.decision, by, note, result=payload.result,
                            arguments=payload.arguments)
        except ApprovalConflict as exc:
            raise conflict(exc) from None
        except FourEyesViolation as exc:
            raise ApiError("forbidden", str(exc)) from None
        except InvalidEdit as exc:  # each argument at fault, where a form would show it
            raise ApiError("invalid", exc.reason, errors=[
                {"loc": ["body", "payload", "arguments", *([name] if name else [])],
                 "msg": message, "type": "value_error"}
                for name, message in exc.fields.items()] or None) from None
        except InvalidDecision as exc:
            raise ApiError("invalid", exc.reason) from None
        fresh = selectors.approval_for_page(approval.pk)
        assert fresh is not None, "approvals are never deleted"
        return 200, _json(_approval(fresh, by))

    return idempotent(request, user, {"approval": approval_id, **body}, answer)


@api.post("/runs", response={201: RunOut, **ERRORS}, url_name="runs", operation_id=START_RUN,
          openapi_extra=STARTED_LINKS,
          summary="Start a run (needs runtime.add_run)")
def start_run(request: HttpRequest, payload: RunIn,
              idempotency_key: str | None = IDEMPOTENCY_KEY) -> HttpResponse:
    """Queues a run of ``agent`` started by the caller (who four-eyes then bars from letting
    its side effects through)."""
    user = _user(request, START)
    body = payload.model_dump(mode="json")

    def answer() -> tuple[int, dict[str, Any]]:
        agent = _text("agent", payload.agent)
        try:
            run = start(agent, payload.input, created_by=user.get_username())
        except UnknownAgent as exc:
            raise ApiError("invalid", str(exc), errors=[
                {"loc": ["body", "payload", "agent"], "msg": "unknown agent",
                 "type": "value_error"}]) from None
        except (InvalidPayload, InvalidArguments) as exc:
            raise ApiError("invalid", str(exc)) from None
        created = selectors.run_for_page(run.pk)
        assert created is not None, "runs are never deleted"
        return 201, _json(_run(created))

    return idempotent(request, user, body, answer)


@api.get("/runs/{run_id}", response={200: RunOut, **ERRORS}, url_name="run", operation_id=GET_RUN,
         openapi_extra=RUN_LINKS,
         summary="One run and its latest steps")
def get_run(request: HttpRequest, run_id: int) -> RunOut:
    _user(request, VIEW)
    run = selectors.run_for_page(run_id)
    if run is None:
        raise ApiError("not_found", f"no run {run_id}")
    return _run(run)


@api.get("/runs/{run_id}/events", response={200: EventPage, **ERRORS}, url_name="events",
         operation_id=LIST_RUN_EVENTS, openapi_extra=EVENTS_LINKS,
         summary="A run's events in order (its audit log), a page at a time")
def run_events(request: HttpRequest, run_id: int,
               cursor: str | None = CURSOR,
               limit: int = Query(100, ge=1, le=MAX_LIMIT)) -> dict[str, Any]:
    _user(request, VIEW)
    if selectors.run_for_page(run_id) is None:
        raise ApiError("not_found", f"no run {run_id}")
    rows, more = selectors.events_after(run_id, event_cursor(cursor), limit)
    return {"items": [_event(e) for e in rows],
            "next_cursor": cursor_encode([rows[-1].seq]) if more and rows else None}


def _event(e: Event) -> dict[str, Any]:
    return {"seq": e.seq, "kind": e.kind, "step_index": e.step_index, "payload": e.payload,
            "actor": e.actor, "at": e.at}
