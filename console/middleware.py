"""Login for every page (answered in a way htmx understands), idle sessions, the security
headers, and the client's address behind a proxy."""

from __future__ import annotations

import ipaddress
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.contrib.auth import logout, middleware
from django.http import HttpRequest, HttpResponse
from django.shortcuts import resolve_url

if TYPE_CHECKING:
    from django_htmx.middleware import HtmxDetails

# Where the session keeps the time of its person's last request (seconds since the epoch).
LAST_SEEN = "console_last_seen"
# A session's last-seen time is written at most this often, so a busy console does not write
# its session row on every request.
SEEN_RESOLUTION_SECONDS = 60


class LoginRequiredMiddleware(middleware.LoginRequiredMiddleware):
    """Django's LoginRequiredMiddleware, except that an htmx request (a poll, a swap, a
    decision) whose session has ended gets a 401 carrying a client redirect to the login page:
    htmx follows ``HX-Redirect`` whatever the status, and a script posting as htmx can never
    take the answer for success (a 200 with a redirect header it might ignore)."""

    # Django answers with whatever this returns; the stubs narrow it to Django's own redirect.
    def handle_no_permission(  # type: ignore[override]
        self, request: HttpRequest, view_func: Any
    ) -> HttpResponse:
        if getattr(request, "htmx", False):
            response = HttpResponse("Your session has ended: log in again.\n", status=401,
                                    content_type="text/plain; charset=utf-8")
            response["HX-Redirect"] = resolve_url(self.get_login_url(view_func))
            return response
        return super().handle_no_permission(request, view_func)


def is_background_poll(request: HttpRequest) -> bool:
    """A request the page made on its own: an htmx GET of an element that replaces itself
    (``hx-trigger="every 3s"``, the nav's count), as opposed to a filter, a link or a form."""
    htmx: HtmxDetails | None = getattr(request, "htmx", None)
    if not htmx:
        return False
    return request.method in ("GET", "HEAD") and bool(htmx.trigger) and htmx.trigger == htmx.target


def start_idle_clock(sender: Any, request: HttpRequest | None, user: Any, **kwargs: Any) -> None:
    """On login (``user_logged_in``, connected in console/apps.py): the person was just seen."""
    if request is not None and hasattr(request, "session"):
        request.session[LAST_SEEN] = int(time.time())


class IdleSessionMiddleware:
    """Ends a session whose person made no request of their own for
    ``CONSOLE_SESSION_IDLE_SECONDS``. The pages poll every few seconds; those polls neither
    count as activity nor keep the session alive, so a console left open on an unattended
    screen logs itself out (the next poll is redirected to the login page). Activity is
    written to the session at most once a minute, which also moves the session's expiry in
    the database (``SESSION_COOKIE_AGE``) forward."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        user = getattr(request, "user", None)
        if user is not None and user.is_authenticated:
            now = int(time.time())
            seen = request.session.get(LAST_SEEN)
            if isinstance(seen, int) and now - seen > settings.CONSOLE_SESSION_IDLE_SECONDS:
                logout(request)  # flushes the session; the request goes on as anonymous
            elif not isinstance(seen, int) or (
                    now - seen >= SEEN_RESOLUTION_SECONDS and not is_background_poll(request)):
                request.session[LAST_SEEN] = now
        return self.get_response(request)


class SecurityHeadersMiddleware:
    """``Content-Security-Policy`` from ``SECURE_CSP`` and ``Permissions-Policy`` from
    ``PERMISSIONS_POLICY``, on every response that does not set its own. Django's debug pages
    (DEBUG on: a 404 or 500 with inline styles and scripts) are left alone."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response
        self.csp = "; ".join(f"{name} {' '.join(values)}".strip()
                             for name, values in settings.SECURE_CSP.items())
        self.permissions = ", ".join(f"{feature}=()" for feature in settings.PERMISSIONS_POLICY)

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if settings.DEBUG and response.status_code in (404, 500):
            return response
        if self.csp:
            response.headers.setdefault("Content-Security-Policy", self.csp)
        if self.permissions:
            response.headers.setdefault("Permissions-Policy", self.permissions)
        return response


def client_ip(request: HttpRequest) -> str:
    """The client's address for login throttling (``AXES_CLIENT_IP_CALLABLE``). With
    ``DJANGO_PROXY_COUNT=N`` (N proxies in front of gunicorn, each appending the address it
    saw to ``X-Forwarded-For``) it is the Nth entry from the right: entries further left were
    sent by the client and prove nothing. Without it, or when the header has fewer entries
    (a request that did not come through the proxies), the socket's peer."""
    remote = request.META.get("REMOTE_ADDR", "")
    count = settings.CONSOLE_PROXY_COUNT
    if count <= 0:
        return remote
    hops = [h.strip() for h in request.META.get("HTTP_X_FORWARDED_FOR", "").split(",")]
    hops = [h for h in hops if h]
    if len(hops) < count:
        return remote
    candidate = hops[-count]
    try:
        return str(ipaddress.ip_address(candidate))
    except ValueError:
        return remote
