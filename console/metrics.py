"""``/metrics``: the runtime's shared numbers for Prometheus (``runtime.metrics``). Never
public by default: served only where ``RUNTIME_METRICS_TOKEN`` is set, and only to a request
that carries it as a bearer token; nobody else learns whether it is set beyond the 404."""

from __future__ import annotations

import hmac

from django.contrib.auth.decorators import login_not_required
from django.http import Http404, HttpRequest, HttpResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_http_methods

from runtime.clock import SYSTEM_CLOCK, Clock
from runtime.conf import setting
from runtime.metrics import CONTENT_TYPE, database_metrics_text

# The time a scrape is judged by (ages, live workers); tests move it by hand.
clock: Clock = SYSTEM_CLOCK


def _bearer(request: HttpRequest) -> str:
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


@login_not_required
@never_cache
@require_http_methods(["GET", "HEAD"])
def metrics(request: HttpRequest) -> HttpResponse:
    """Prometheus's text format for a scraper holding the token; 401 for anyone else (the
    body says no more), 404 where no token is configured."""
    expected = setting("METRICS_TOKEN")
    if not expected:
        raise Http404("no metrics here")
    if not hmac.compare_digest(_bearer(request).encode(), expected.encode()):
        response = HttpResponse("Unauthorized.\n", status=401,
                                content_type="text/plain; charset=utf-8")
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    return HttpResponse(database_metrics_text(clock), content_type=CONTENT_TYPE)
