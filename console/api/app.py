"""The API object: django-ninja's ``NinjaAPI`` with its authentication, its body parser and
its error handlers (every error is ``{"code", "message", ...}`` JSON), and its URL patterns."""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import Http404, HttpRequest, HttpResponse
from django.urls import URLPattern, URLResolver
from ninja import NinjaAPI
from ninja.errors import AuthenticationError, HttpError, ValidationError

from console.api.auth import BearerToken, LimitedParser
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


def urls() -> tuple[list[URLPattern | URLResolver], str, str]:
    """The API's URL patterns, exempt from the console's login redirect: a token, not a
    session, authenticates them (and an unauthenticated call gets a 401, not a login page)."""
    patterns, app_name, namespace = api.urls
    for pattern in patterns:
        if isinstance(pattern, URLPattern):
            pattern.callback.login_required = False  # type: ignore[attr-defined]
    return patterns, app_name, namespace
