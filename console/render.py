"""One view per page: a full page, or only the named partial when htmx asks for it."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils.cache import patch_vary_headers


def page(
    request: HttpRequest,
    template: str,
    context: dict[str, Any],
    *,
    partial: str,
    status: int = 200,
) -> HttpResponse:
    """Render ``template``, or ``template#partial`` for an htmx request (a poll or a swap).

    ``Vary: HX-Request`` keeps a browser or proxy cache from serving a fragment as a page.
    """
    name = f"{template}#{partial}" if getattr(request, "htmx", False) else template
    response = render(request, name, context, status=status)
    patch_vary_headers(response, ("HX-Request",))
    return response
