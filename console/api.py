"""The JSON API under ``/api/``: programs read the queue, decide approvals and start runs, with
the console's permissions and the runtime's rules (nothing here restates them).

django-ninja builds the OpenAPI schema (``/api/openapi.json``) from the typed schemas below.
Callers authenticate with a per-user token in ``Authorization: Bearer``, never a cookie: a
session alone authenticates nothing here, so there is no CSRF to forge. Every error is
``{"code", "message", ...}`` with a stable ``code`` (``ERROR_CODES``). Decisions and starts
go through ``runtime.approvals`` and ``runtime.loop.control``; reads through ``runtime.selectors``.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any, Literal

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import RequestDataTooBig
from django.db import IntegrityError, transaction
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.urls import URLPattern, URLResolver
from django.utils import timezone
from ninja import Field, Header, NinjaAPI, Query, Schema
from ninja.errors import AuthenticationError, HttpError, ValidationError
from ninja.parser import Parser
from ninja.security import HttpBearer

from console.models import ApiToken, IdempotentRequest, hash_token
from console.permissions import DECIDE, VIEW
from runtime import selectors
from runtime.approvals import decisions as approvals
from runtime.canonical import check_payload, digest, parse_json
from runtime.errors import (
    ApprovalConflict,
    FourEyesViolation,
    InvalidArguments,
    InvalidDecision,
    InvalidPayload,
    UnknownAgent,
)
from runtime.loop.control import start
from runtime.models import Approval, ApprovalStatus, Event, Run, Step

START = "runtime.add_run"  # Django's default "add" permission of the Run model
STEPS_SHOWN = 50  # a run's or an approval's latest steps; the events endpoint pages all
MAX_LIMIT = 200
LAST_USED_RESOLUTION = timedelta(seconds=60)  # last_used_at is written at most this often

# Every error's code and its HTTP status (README "JSON API").
ERROR_CODES = {
    "unauthorized": 401, "forbidden": 403, "not_found": 404, "already_decided": 409,
    "stale": 409, "retry": 409, "invalid": 422,
}


class ApiError(Exception):
    """An answer with an error: its stable ``code`` sets the status; ``extra`` joins the body."""

    def __init__(self, code: str, message: str, **extra: Any) -> None:
        self.code, self.message, self.extra = code, message, extra
        self.status = ERROR_CODES[code]
        super().__init__(message)

    def body(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, **self.extra}


# -- authentication ------------------------------------------------------------------------

class BearerToken(HttpBearer):
    """``Authorization: Bearer <token>``: the token's hash names an unrevoked token of an
    active user, who is then ``request.auth``. Nothing else (cookie, query string, session)
    is looked at."""

    def authenticate(self, request: HttpRequest, token: str) -> AbstractBaseUser | None:
        if not token or len(token) > 200:
            return None
        row = (ApiToken.objects.select_related("user")
               .filter(token_hash=hash_token(token), revoked_at__isnull=True).first())
        if row is None or not row.user.is_active:
            return None
        now = timezone.now()
        if row.last_used_at is None or now - row.last_used_at >= LAST_USED_RESOLUTION:
            ApiToken.objects.filter(pk=row.pk).update(last_used_at=now)
        return row.user


class LimitedParser(Parser):
    """Request bodies within the runtime's payload limits (size and depth) before they are
    parsed any further (``runtime.canonical.parse_json``)."""

    def parse_body(self, request: HttpRequest) -> Any:
        return parse_json("request body", request.body)


api = NinjaAPI(
    title="agent-runtime",
    version="1",
    description="Decide approvals and start runs. Authenticate with `Authorization: Bearer "
                "<token>` (`manage.py apitoken create USER --name N`).",
    auth=BearerToken(),
    parser=LimitedParser(),
    docs_url="/docs" if settings.DEBUG else None,
    urls_namespace="api",
)


# -- schemas ---------------------------------------------------------------------------------

class ErrorOut(Schema):
    code: str
    message: str
    status: str | None = None
    decided_by: str | None = None
    decided_at: datetime | None = None
    errors: list[dict[str, Any]] | None = None


ERRORS = {401: ErrorOut, 403: ErrorOut, 404: ErrorOut, 409: ErrorOut, 422: ErrorOut}


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
    decisions: list[str] = Field(description="What the caller may decide now.")
    steps: list[StepOut] = Field(description=f"The run's latest {STEPS_SHOWN} steps.")
    steps_total: int


class DecideIn(Schema):
    decision: Literal["approve", "resolve", "reject"]
    expected_digest: str = Field(max_length=128, description="The digest of the request you "
                                 "decided on; another one is refused as stale.")
    note: str = Field("", max_length=10_000)
    result: Any = Field(None, description="For resolve: the call's outcome, as JSON.")


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


# -- errors ----------------------------------------------------------------------------------

def _error(request: HttpRequest, exc: ApiError) -> HttpResponse:
    response = api.create_response(request, exc.body(), status=exc.status)
    if exc.code == "unauthorized":
        response["WWW-Authenticate"] = 'Bearer realm="api"'
    return response


def _unauthorized(request: HttpRequest, exc: Exception) -> HttpResponse:
    return _error(request, ApiError("unauthorized", "send a valid API token as "
                                    "'Authorization: Bearer <token>'"))


def _invalid(request: HttpRequest, exc: ValidationError) -> HttpResponse:
    errors = [{"loc": [str(part) for part in e.get("loc", ())], "msg": str(e.get("msg", "")),
               "type": str(e.get("type", ""))} for e in exc.errors]
    return _error(request, ApiError("invalid", "the request is not valid", errors=errors))


def _http_error(request: HttpRequest, exc: HttpError) -> HttpResponse:
    cause = exc.__cause__
    if isinstance(cause, InvalidPayload):
        return _error(request, ApiError("invalid", str(cause)))
    if exc.status_code == 400 or isinstance(cause, ValueError):
        return _error(request, ApiError("invalid", "the request body is not JSON"))
    code = {401: "unauthorized", 403: "forbidden", 404: "not_found"}.get(exc.status_code)
    if code is None:
        return api.create_response(request, {"code": "error", "message": str(exc)},
                                   status=exc.status_code)
    return _error(request, ApiError(code, str(exc)))


api.add_exception_handler(ApiError, _error)
api.add_exception_handler(AuthenticationError, _unauthorized)
api.add_exception_handler(ValidationError, _invalid)
api.add_exception_handler(HttpError, _http_error)
api.add_exception_handler(Http404, lambda request, exc: _error(
    request, ApiError("not_found", "no such object")))
api.add_exception_handler(RequestDataTooBig, lambda request, exc: _error(
    request, ApiError("invalid", "the request body is larger than allowed")))


def _conflict(exc: ApprovalConflict) -> ApiError:
    """The runtime's conflict by its ``reason_code``, never by its wording."""
    if exc.reason_code in ("decided", "expired"):
        return ApiError("already_decided", exc.reason, status=exc.status,
                        decided_by=exc.decided_by or None,
                        decided_at=exc.decided_at.isoformat() if exc.decided_at else None)
    return ApiError("stale" if exc.reason_code == "stale" else "retry", exc.reason,
                    status=exc.status)


# -- helpers ---------------------------------------------------------------------------------

def _user(request: HttpRequest, perm: str) -> AbstractBaseUser:
    user = request.auth  # type: ignore[attr-defined]
    if not user.has_perm(perm):
        raise ApiError("forbidden", f"this needs the permission {perm}")
    return user


def _encode(value: list[Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(value).encode()).decode().rstrip("=")


def _decode(cursor: str) -> list[Any]:
    try:
        value = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
    except (binascii.Error, ValueError, UnicodeDecodeError):
        value = None
    if not isinstance(value, list):
        raise ApiError("invalid", "cursor is not one this API gave out",
                       errors=[{"loc": ["query", "cursor"], "msg": "unknown cursor",
                                "type": "value_error"}])
    return value


def _approval_cursor(cursor: str | None) -> tuple[datetime, int] | None:
    if not cursor:
        return None
    value = _decode(cursor)
    try:
        created, pk = value
        when = datetime.fromisoformat(created)
        if when.tzinfo is None or not isinstance(pk, int) or isinstance(pk, bool):
            raise ValueError
    except (ValueError, TypeError):
        raise ApiError("invalid", "cursor is not one this API gave out") from None
    return when, pk


def _event_cursor(cursor: str | None) -> int:
    if not cursor:
        return 0
    value = _decode(cursor)
    if len(value) != 1 or not isinstance(value[0], int) or isinstance(value[0], bool):
        raise ApiError("invalid", "cursor is not one this API gave out")
    return value[0]


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


def _idempotent(request: HttpRequest, user: AbstractBaseUser, body: dict[str, Any],
                answer: Callable[[], tuple[int, dict[str, Any]]]) -> HttpResponse:
    """``answer()``, or, when the request carries an ``Idempotency-Key`` this person used
    before, the first answer to it (same status, same body) without acting again. The key is
    reserved before acting, so two requests with one key never both act; a key reused for
    another path or body is refused."""
    key = request.headers.get("Idempotency-Key")
    if key is None:
        return _respond(*_answer(answer))
    if not key or len(key) > 200 or not key.isascii() or not key.isprintable():
        raise ApiError("invalid", "Idempotency-Key must be 1 to 200 printable ASCII characters")
    where = f"{request.method} {request.path}"[:300]
    fingerprint = digest(body)
    _release_abandoned(user, key)
    try:
        with transaction.atomic():
            row = IdempotentRequest.objects.create(user=user, key=key, method_path=where,
                                                   request_digest=fingerprint)
    except IntegrityError:
        first = IdempotentRequest.objects.filter(user=user, key=key).first()
        if first is None:  # pragma: no cover - rows are not deleted while in use
            raise ApiError("retry", "the first request with this key failed; send it "
                           "again") from None
        if first.method_path != where or first.request_digest != fingerprint:
            raise ApiError("invalid", "this Idempotency-Key was used for another request "
                           f"({first.method_path}); use a new key") from None
        if first.status == 0:
            raise ApiError("retry", "the first request with this key is still being "
                           "answered; send it again shortly") from None
        return _respond(first.status, first.body, replayed=True)
    try:
        status, data = _answer(answer)
    except BaseException:
        row.delete()
        raise
    if data.get("code") == "retry":
        row.delete()  # a transient answer: the same request may succeed when sent again
    else:
        IdempotentRequest.objects.filter(pk=row.pk).update(status=status, body=data)
    return _respond(status, data)


# A reservation this old was left by a process that died while answering (no request takes a
# minute): the key is free again. If that process had already decided, deciding again is
# answered by the runtime itself (already decided, by whom and when), never done twice.
ABANDONED_AFTER = timedelta(seconds=60)


def _release_abandoned(user: AbstractBaseUser, key: str) -> None:
    IdempotentRequest.objects.filter(user=user, key=key, status=0,
                                     created_at__lt=timezone.now() - ABANDONED_AFTER).delete()


def _answer(answer: Callable[[], tuple[int, dict[str, Any]]]) -> tuple[int, dict[str, Any]]:
    try:
        return answer()
    except ApiError as exc:
        return exc.status, exc.body()


def _respond(status: int, body: Any, *, replayed: bool = False) -> HttpResponse:
    response = JsonResponse(body, status=status, safe=False)
    if replayed:
        response["Idempotent-Replayed"] = "true"
    if status == 401:
        response["WWW-Authenticate"] = 'Bearer realm="api"'
    return response


def _json(model: Schema) -> dict[str, Any]:
    return model.model_dump(mode="json")


# -- endpoints -------------------------------------------------------------------------------

IDEMPOTENCY_KEY = Header(None, alias="Idempotency-Key", max_length=200, description=(
    "Send the same key again (same path, same body) to get the first answer back instead of "
    "acting twice."))


@api.get("/approvals/", response={200: ApprovalPage, **ERRORS}, url_name="approvals",
         summary="Pending approvals, oldest first")
def list_approvals(request: HttpRequest, cursor: str | None = Query(None, max_length=500),
                   limit: int = Query(50, ge=1, le=MAX_LIMIT)) -> dict[str, Any]:
    """The queue, oldest first, a page at a time: keyset pagination, so no approval is
    skipped or repeated while others are added or decided."""
    _user(request, VIEW)
    rows, more = selectors.approvals_after(_approval_cursor(cursor), limit)
    last = rows[-1] if rows else None
    return {"items": [_summary(a) for a in rows],
            "next_cursor": _encode([last.created_at.isoformat(), last.pk])
            if more and last else None}


@api.get("/approvals/{approval_id}", response={200: ApprovalOut, **ERRORS},
         url_name="approval", summary="One approval: the request and its run's steps")
def get_approval(request: HttpRequest, approval_id: int) -> ApprovalOut:
    user = _user(request, VIEW)
    approval = selectors.approval_for_page(approval_id)
    if approval is None:
        raise ApiError("not_found", f"no approval {approval_id}")
    return _approval(approval, user.get_username())


@api.post("/approvals/{approval_id}/decide", response={200: ApprovalOut, **ERRORS},
          url_name="decide", summary="Approve, resolve or reject an approval")
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
        if payload.decision == "resolve" and "result" not in payload.model_fields_set:
            raise ApiError("invalid", "resolve needs the call's result",
                           errors=[{"loc": ["body", "payload", "result"], "msg": "required",
                                    "type": "missing"}])
        note = _text("note", payload.note)
        if approval.digest != payload.expected_digest \
                and approval.status == ApprovalStatus.PENDING:
            raise ApiError("stale", "the approval's request is not the one you decided on "
                           "(expected_digest differs); read it again", status=approval.status)
        try:
            if payload.decision == "approve":
                approvals.approve(approval.pk, by, note)
            elif payload.decision == "resolve":
                approvals.resolve(approval.pk, by, payload.result, note)
            else:
                approvals.reject(approval.pk, by, note)
        except ApprovalConflict as exc:
            raise _conflict(exc) from None
        except FourEyesViolation as exc:
            raise ApiError("forbidden", str(exc)) from None
        except InvalidDecision as exc:
            raise ApiError("invalid", exc.reason) from None
        fresh = selectors.approval_for_page(approval.pk)
        return 200, _json(_approval(fresh, by))

    return _idempotent(request, user, {"approval": approval_id, **body}, answer)


@api.post("/runs", response={201: RunOut, **ERRORS}, url_name="runs",
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
        return 201, _json(_run(selectors.run_for_page(run.pk)))

    return _idempotent(request, user, body, answer)


@api.get("/runs/{run_id}", response={200: RunOut, **ERRORS}, url_name="run",
         summary="One run and its latest steps")
def get_run(request: HttpRequest, run_id: int) -> RunOut:
    _user(request, VIEW)
    run = selectors.run_for_page(run_id)
    if run is None:
        raise ApiError("not_found", f"no run {run_id}")
    return _run(run)


@api.get("/runs/{run_id}/events", response={200: EventPage, **ERRORS}, url_name="events",
         summary="A run's events in order (its audit log), a page at a time")
def run_events(request: HttpRequest, run_id: int,
               cursor: str | None = Query(None, max_length=500),
               limit: int = Query(100, ge=1, le=MAX_LIMIT)) -> dict[str, Any]:
    _user(request, VIEW)
    if selectors.run_for_page(run_id) is None:
        raise ApiError("not_found", f"no run {run_id}")
    rows, more = selectors.events_after(run_id, _event_cursor(cursor), limit)
    return {"items": [_event(e) for e in rows],
            "next_cursor": _encode([rows[-1].seq]) if more and rows else None}


def _event(e: Event) -> dict[str, Any]:
    return {"seq": e.seq, "kind": e.kind, "step_index": e.step_index, "payload": e.payload,
            "actor": e.actor, "at": e.at}


def urls() -> tuple[list[URLPattern | URLResolver], str, str]:
    """The API's URL patterns, exempt from the console's login redirect: a token, not a
    session, authenticates them (and an unauthenticated call gets a 401, not a login page)."""
    patterns, app_name, namespace = api.urls
    for pattern in patterns:
        if isinstance(pattern, URLPattern):
            pattern.callback.login_required = False  # type: ignore[attr-defined]
    return patterns, app_name, namespace
