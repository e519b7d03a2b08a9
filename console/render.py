"""One view per page: a full page, or only the named partial when htmx asks for it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils.cache import patch_cache_control, patch_vary_headers

if TYPE_CHECKING:
    from django_htmx.middleware import HtmxDetails


class HtmxHttpRequest(HttpRequest):
    """A request that went through django-htmx's middleware (``settings.MIDDLEWARE``), for
    views that read ``request.htmx`` (falsy unless htmx sent the request)."""

    htmx: HtmxDetails


def page(
    request: HttpRequest,
    template: str,
    context: dict[str, Any],
    *,
    partial: str,
    status: int = 200,
) -> HttpResponse:
    """Render ``template``, or ``template#partial`` for an htmx request (a poll or a swap).

    ``Vary: HX-Request`` keeps a browser or proxy cache from serving a fragment as a page;
    ``no-store`` keeps arguments and results out of caches once the operator has logged out.
    """
    htmx: HtmxDetails | None = getattr(request, "htmx", None)
    # A history restore (Back after a pushed URL that htmx no longer has cached) needs the page.
    fragment = bool(htmx and not htmx.history_restore_request)
    name = f"{template}#{partial}" if fragment else template
    response = render(request, name, context, status=status)
    patch_vary_headers(response, ("HX-Request",))
    patch_cache_control(response, private=True, no_store=True)
    return response


def unchanged(request: HttpRequest, version: str) -> bool:
    """Whether an htmx poll already shows ``version`` of what it polls (``?seen=``)."""
    return bool(getattr(request, "htmx", None)) and request.GET.get("seen") == version


def no_change() -> HttpResponse:
    """A poll's answer when nothing changed: htmx swaps nothing on a 204."""
    response = HttpResponse(status=204)
    patch_vary_headers(response, ("HX-Request",))
    patch_cache_control(response, private=True, no_store=True)
    return response
