"""What every console page shows: the number of approvals waiting for a person."""

from __future__ import annotations

from functools import cache
from typing import Any

from django.http import HttpRequest

from console.permissions import VIEW
from runtime.selectors.approvals import pending


def console(request: HttpRequest) -> dict[str, Any]:
    """The pending count for the nav, computed only if a template actually shows it (the admin
    and the login page do not), and at most once per request."""
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated or not user.has_perm(VIEW):
        return {}

    @cache
    def pending_count() -> int:
        return pending().count()

    return {"pending_count": pending_count}
