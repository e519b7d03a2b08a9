"""``Idempotency-Key``: the same key again (same path, same body) gets the first answer back
instead of acting twice."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from django.db import IntegrityError, transaction
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils import timezone
from ninja import Header

from console.api.errors import ApiError
from console.models import IdempotentRequest
from runtime.canonical import check_payload, digest
from runtime.errors import InvalidPayload

if TYPE_CHECKING:
    from django.contrib.auth.models import User  # settings.AUTH_USER_MODEL, as the stubs see it


def idempotent(request: HttpRequest, user: User, body: dict[str, Any],
                answer: Callable[[], tuple[int, dict[str, Any]]]) -> HttpResponse:
    """``answer()``, or, when the request carries an ``Idempotency-Key`` this person used
    before, the first answer to it (same status, same body) without acting again. The key is
    reserved before acting, so two requests with one key never both act; a key reused for
    another path or body is refused."""
    key = request.headers.get("Idempotency-Key")
    if key is None:
        return respond(*_answer(answer))
    if not key or len(key) > 200 or not key.isascii() or not key.isprintable():
        raise ApiError("invalid", "Idempotency-Key must be 1 to 200 printable ASCII characters")
    where = f"{request.method} {request.path}"[:300]
    try:  # checked before it is hashed: a lone surrogate, say, has no UTF-8 to hash
        fingerprint = digest(check_payload("request body", body))
    except InvalidPayload as exc:
        raise ApiError("invalid", str(exc)) from None
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
        return respond(first.status, first.body, replayed=True)
    try:
        status, data = _answer(answer)
    except BaseException:
        row.delete()
        raise
    if data.get("code") == "retry":
        row.delete()  # a transient answer: the same request may succeed when sent again
    else:
        IdempotentRequest.objects.filter(pk=row.pk).update(status=status, body=data)
    return respond(status, data)


# A reservation this old was left by a process that died while answering (no request takes a
# minute): the key is free again. If that process had already decided, deciding again is
# answered by the runtime itself (already decided, by whom and when), never done twice.
ABANDONED_AFTER = timedelta(seconds=60)


def _release_abandoned(user: User, key: str) -> None:
    IdempotentRequest.objects.filter(user=user, key=key, status=0,
                                     created_at__lt=timezone.now() - ABANDONED_AFTER).delete()


def _answer(answer: Callable[[], tuple[int, dict[str, Any]]]) -> tuple[int, dict[str, Any]]:
    try:
        return answer()
    except ApiError as exc:
        return exc.status, exc.body()


def respond(status: int, body: Any, *, replayed: bool = False) -> HttpResponse:
    response = JsonResponse(body, status=status, safe=False)
    if replayed:
        response["Idempotent-Replayed"] = "true"
    if status == 401:
        response["WWW-Authenticate"] = 'Bearer realm="api"'
    return response


IDEMPOTENCY_KEY = Header(None, alias="Idempotency-Key", min_length=1, max_length=200,
                         pattern=r"^[ -~]+$", description=(
    "Send the same key again (same path, same body) to get the first answer back instead of "
    "acting twice."))
