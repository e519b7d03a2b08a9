"""The demo's outside world, as an operator checks it: what the payment provider and the mail
server recorded, optionally under one idempotency key."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_http_methods

from . import world


@require_http_methods(["GET"])
def outside_world(request: HttpRequest) -> HttpResponse:
    key = request.GET.get("key", "").strip()[:200]
    return render(request, "demo/world.html", {"key": key, "ledger": world.ledger(key)})
