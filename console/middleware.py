"""Login for every page, answered in a way htmx understands."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import middleware
from django.http import HttpRequest, HttpResponse
from django.shortcuts import resolve_url
from django_htmx.http import HttpResponseClientRedirect


class LoginRequiredMiddleware(middleware.LoginRequiredMiddleware):
    """Django's LoginRequiredMiddleware, except that an htmx request (a poll, a swap) whose
    session has ended gets a client redirect to the login page instead of having the login
    page swapped into a fragment of the console."""

    def handle_no_permission(self, request: HttpRequest, view_func: Any) -> HttpResponse:
        if getattr(request, "htmx", False):
            return HttpResponseClientRedirect(resolve_url(self.get_login_url(view_func)))
        return super().handle_no_permission(request, view_func)
