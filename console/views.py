"""Console views."""

from __future__ import annotations

from django.db import connection
from django.http import HttpRequest, JsonResponse


def healthz(request: HttpRequest) -> JsonResponse:
    """Liveness for load balancers: the database answers, with its durability settings."""
    with connection.cursor() as cur:
        if connection.vendor == "sqlite":
            mode = cur.execute("PRAGMA journal_mode").fetchone()[0]
            sync = cur.execute("PRAGMA synchronous").fetchone()[0]
            return JsonResponse({"database": "ok", "journal_mode": mode, "synchronous": sync})
        cur.execute("SELECT 1")
    return JsonResponse({"database": "ok"})
