"""Who calls: a per-user token in ``Authorization: Bearer``, never a cookie (a session alone
authenticates nothing here, so there is no CSRF to forge); and request bodies parsed within
the runtime's payload limits."""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any

from django.http import HttpRequest
from django.utils import timezone
from ninja.parser import Parser
from ninja.security import HttpBearer

from console.api.errors import ApiError
from console.models import ApiToken, hash_token
from runtime.canonical import max_payload_bytes, parse_json
from runtime.errors import InvalidPayload

if TYPE_CHECKING:
    from django.contrib.auth.models import User  # settings.AUTH_USER_MODEL, as the stubs see it

LAST_USED_RESOLUTION = timedelta(seconds=60)  # last_used_at is written at most this often


class BearerToken(HttpBearer):
    """``Authorization: Bearer <token>``: the token's hash names an unrevoked token of an
    active user, who is then ``request.auth``. Nothing else (cookie, query string, session)
    is looked at."""

    def authenticate(self, request: HttpRequest, token: str) -> User | None:
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
        kind = request.META.get("CONTENT_TYPE", "").split(";")[0].strip().lower()
        if kind != "application/json":
            raise ApiError("unsupported_media_type", "send the body as JSON, with "
                           f"'Content-Type: application/json' (not {kind or 'none'})")
        if getattr(request, TRUNCATED, False):
            limit = max_payload_bytes()
            raise InvalidPayload("request body", f"more than {limit} bytes is larger than "
                                 f"the limit of {limit} bytes")
        return parse_json("request body", request.body)


TRUNCATED = "_api_body_truncated"
READ_SIZE = 64 * 1024


def read_chunked(request: HttpRequest) -> None:
    """A body sent without a Content-Length (``Transfer-Encoding: chunked``) read as the
    body, at most one byte past the payload limit (the parser then refuses it as too large):
    Django reads ``wsgi.input`` only up to a Content-Length, so would see it as empty. Only
    where the server ends the stream at the body's end (``wsgi.input_terminated``, as
    gunicorn does); elsewhere such a body is refused, never read without a bound."""
    meta = request.META
    if meta.get("CONTENT_LENGTH") or "chunked" not in meta.get(
            "HTTP_TRANSFER_ENCODING", "").lower():
        return
    if not meta.get("wsgi.input_terminated"):
        raise ApiError("invalid", "this server cannot read a chunked body; send a "
                       "Content-Length")
    stream, cap = meta["wsgi.input"], max_payload_bytes() + 1
    chunks: list[bytes] = []
    size = 0
    while size < cap:
        chunk = stream.read(min(READ_SIZE, cap - size))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    request._body = b"".join(chunks)  # what .body returns
    setattr(request, TRUNCATED, size >= cap)
