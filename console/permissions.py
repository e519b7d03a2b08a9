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


VIEW_SCHEDULE = "runtime.view_schedule"
MANAGE_SCHEDULE = "runtime.manage_schedule"


def viewing_schedules(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """A schedules page: 403 without ``runtime.view_schedule`` (the "viewers" and "operators"
    groups have it). Changing a schedule needs ``runtime.manage_schedule`` as well
    (``require_manage``)."""

    @wraps(view)
    def guarded(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not request.user.has_perm(VIEW_SCHEDULE):
            raise PermissionDenied("Seeing schedules needs the view_schedule permission "
                                   "(the viewers or operators group).")
        return view(request, *args, **kwargs)

    return guarded


def require_manage(request: HttpRequest) -> None:
    """403 unless the person may create, edit, enable, disable, authorize and remove
    schedules."""
    if not request.user.has_perm(MANAGE_SCHEDULE):
        raise PermissionDenied("Changing schedules needs the manage_schedule permission.")
