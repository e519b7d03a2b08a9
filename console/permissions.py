"""Who may do what in the console. Reading needs a permission too: runs and approvals hold
arguments and results (customer names, emails, amounts)."""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any

from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse

VIEW = "runtime.view_run"
DECIDE = "runtime.decide_approval"
CANCEL = "runtime.cancel_run"


def viewing(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """A page that shows runs: 403 without ``runtime.view_run`` (the "viewers" and "operators"
    groups have it), saying which permission is missing."""

    @wraps(view)
    def guarded(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not request.user.has_perm(VIEW):
            raise PermissionDenied("Seeing runs and approvals needs the view_run permission "
                                   "(the viewers or operators group).")
        return view(request, *args, **kwargs)

    return guarded
