"""The console's own tables: API tokens and the answers to idempotent API requests.

Neither is a runtime table: they say who may call the JSON API (``console.api``) and what it
answered, never what a run did.
"""

from __future__ import annotations

import hashlib
import secrets
from typing import TYPE_CHECKING

from django.conf import settings
from django.db import models
from django.utils import timezone

if TYPE_CHECKING:
    from django.contrib.auth.models import User  # settings.AUTH_USER_MODEL, as the stubs see it

TOKEN_PREFIX = "art_"  # so a leaked token is recognisable in logs and secret scanners


def hash_token(token: str) -> str:
    """What is stored for a token: its SHA-256. The token is 32 random bytes, so a fast hash
    suffices (nothing to brute-force), and a stolen table lets nobody call the API."""
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


class ApiToken(models.Model):
    """A person's token for the JSON API, stored only as a hash; the token is shown once."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE,
                             related_name="api_tokens")
    name = models.CharField(max_length=100, help_text="What the token is for, e.g. 'ci-bot'.")
    token_hash = models.CharField(max_length=64, unique=True, editable=False)
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    last_used_at = models.DateTimeField(null=True, blank=True, editable=False)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = "API token"

    def __str__(self) -> str:
        return f"{self.name} ({self.user}){' revoked' if self.revoked_at else ''}"

    @classmethod
    def issue(cls, user: User, name: str) -> tuple[ApiToken, str]:
        """A new token for ``user``: the row, and the token itself (never stored)."""
        row = cls(user=user, name=name)
        token = row.set_new_token()
        row.save()
        return row, token

    def set_new_token(self) -> str:
        """Give this (unsaved) row a fresh token of 32 random bytes; returns the token."""
        token = TOKEN_PREFIX + secrets.token_urlsafe(32)
        self.token_hash = hash_token(token)
        return token

    def revoke(self) -> None:
        """From now on the token authenticates nothing (kept, for the record)."""
        if self.revoked_at is None:
            self.revoked_at = timezone.now()
            self.save(update_fields=["revoked_at"])


class IdempotentRequest(models.Model):
    """The first answer to an API request sent with an ``Idempotency-Key``: a repeat by the
    same person gets this answer again instead of deciding (or starting a run) twice.
    ``status`` 0 means the first request is still being answered."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE,
                             related_name="+")
    key = models.CharField(max_length=200)
    method_path = models.CharField(max_length=300)
    request_digest = models.CharField(max_length=64)
    status = models.IntegerField(default=0)
    body = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["user", "key"],
                                               name="idempotent_request_user_key")]

    def __str__(self) -> str:
        return f"{self.key} ({self.method_path})"
