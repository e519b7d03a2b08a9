"""The API object: django-ninja's ``NinjaAPI`` with its authentication, its body parser and
its error handlers (every error is ``{"code", "message", ...}`` JSON), and its URL patterns."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import Http404, HttpRequest, HttpResponse
from django.urls import Resolver404, URLPattern, URLResolver, re_path, resolve
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET
from ninja import NinjaAPI
from ninja.errors import AuthenticationError, HttpError, ValidationError

from console.api.auth import BearerToken, LimitedParser, read_chunked
from console.api.errors import ApiError
from runtime.errors import (
    InvalidPayload,
)

if TYPE_CHECKING:
    from ninja.main import ExcHandler

api = NinjaAPI(
    title="agent-runtime",
    version="1",
    description="Decide approvals and start runs. Authenticate with `Authorization: Bearer "
                "<token>` (`manage.py apitoken create USER --name N`).",
    auth=BearerToken(),
    parser=LimitedParser(),
    docs_url="/docs" if settings.DEBUG else None,
    urls_namespace="api",
)


def _error(request: HttpRequest, exc: ApiError) -> HttpResponse:
    response = api.create_response(request, exc.body(), status=exc.status)
    if exc.code == "unauthorized":
        response["WWW-Authenticate"] = 'Bearer realm="api"'
    return response


def _unauthorized(request: HttpRequest, exc: Exception) -> HttpResponse:
    return _error(request, ApiError("unauthorized", "send a valid API token as "
                                    "'Authorization: Bearer <token>'"))


def _invalid(request: HttpRequest, exc: ValidationError) -> HttpResponse:
    errors = [{"loc": [str(part) for part in e.get("loc", ())], "msg": str(e.get("msg", "")),
               "type": str(e.get("type", ""))} for e in exc.errors]
    return _error(request, ApiError("invalid", "the request is not valid", errors=errors))


def _http_error(request: HttpRequest, exc: HttpError) -> HttpResponse:
    cause = exc.__cause__
    if isinstance(cause, ApiError):  # raised by the parser (ninja wraps what it raises)
        return _error(request, cause)
    if isinstance(cause, InvalidPayload):
        return _error(request, ApiError("invalid", str(cause)))
    if exc.status_code == 400 or isinstance(cause, ValueError):
        return _error(request, ApiError("invalid", "the request body is not JSON"))
    code = {401: "unauthorized", 403: "forbidden", 404: "not_found"}.get(exc.status_code)
    if code is None:
        return api.create_response(request, {"code": "error", "message": str(exc)},
                                   status=exc.status_code)
    return _error(request, ApiError(code, str(exc)))


# ninja types a handler's argument as the exception or its class; it passes the exception.
api.add_exception_handler(ApiError, cast("ExcHandler[ApiError]", _error))
api.add_exception_handler(AuthenticationError,
                          cast("ExcHandler[AuthenticationError]", _unauthorized))
api.add_exception_handler(ValidationError, cast("ExcHandler[ValidationError]", _invalid))
api.add_exception_handler(HttpError, cast("ExcHandler[HttpError]", _http_error))
api.add_exception_handler(Http404, lambda request, exc: _error(
    request, ApiError("not_found", "no such object")))
api.add_exception_handler(RequestDataTooBig, lambda request, exc: _error(
    request, ApiError("invalid", "the request body is larger than allowed")))


def _api_view(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """``view``, with ninja's plain 405 (a method the path does not serve) answered as JSON,
    a chunked body read within the limit, and HEAD answered as GET is (status and headers)
    without a body, as HTTP asks of a path that serves GET."""

    @functools.wraps(view)  # keeps csrf_exempt and the other marks on the view
    def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        head = request.method == "HEAD"
        try:
            read_chunked(request)
            if head:
                request.method = "GET"
            try:
                response = view(request, *args, **kwargs)
            finally:
                if head:
                    request.method = "HEAD"
        except ApiError as exc:
            response = _error(request, exc)
        if response.status_code == 405 and not response.get("Content-Type", "").startswith(
                "application/json"):
            allowed = response.get("Allow", "")
            if "GET" in allowed.split(", "):
                allowed += ", HEAD"
            response = _error(request, ApiError(
                "method_not_allowed", f"{request.method} is not served at {request.path}; "
                f"it serves {allowed or 'no method'}"))
            response["Allow"] = allowed
        if head:
            response.content = b""
        return response

    return wrapped


@csrf_exempt
def _unknown_path(request: HttpRequest, rest: str) -> HttpResponse:
    """Any other path under /api/: a JSON 404, naming the path meant when only its trailing
    slash differs (the API's paths are exact; nothing under /api/ is redirected)."""
    path = request.path
    other = path[:-1] if path.endswith("/") else path + "/"
    try:
        match = resolve(other)
    except Resolver404:
        match = None
    if match is not None and match.func is not _unknown_path and match.namespace == "api":
        return _error(request, ApiError("not_found", f"no API path {path}; did you mean "
                                        f"{other}?", url=other))
    return _error(request, ApiError("not_found", f"no API path {path} (the paths are listed "
                                    "in /api/openapi.json)"))


_unknown_path.login_required = False  # type: ignore[attr-defined]


def urls() -> tuple[list[URLPattern | URLResolver], str, str]:
    """The API's URL patterns, exempt from the console's login redirect: a token, not a
    session, authenticates them (and an unauthenticated call gets a 401, not a login page).
    Last comes every other path under /api/, answered with a JSON 404, so an error under
    /api/ is never the console's HTML page nor a redirect (``APPEND_SLASH``)."""
    patterns, app_name, namespace = api.urls
    for pattern in patterns:
        if isinstance(pattern, URLPattern):
            if pattern.name in ("openapi-json", "openapi-view"):  # ninja serves any method
                pattern.callback = require_GET(pattern.callback)
            pattern.callback = _api_view(pattern.callback)
            pattern.callback.login_required = False  # type: ignore[attr-defined]
    patterns = [*patterns, re_path(r"^(?P<rest>.*)$", _unknown_path)]
    return patterns, app_name, namespace
