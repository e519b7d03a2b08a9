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

from console.models import ApiToken, hash_token
from runtime.canonical import parse_json

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
        return parse_json("request body", request.body)
