"""Console views that belong to no section: health and the login/logout pages."""

from __future__ import annotations

from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_not_required
from django.db import connection
from django.http import HttpRequest, HttpResponseRedirect, JsonResponse
from django.templatetags.static import static
from django.views.decorators.http import require_http_methods


@login_not_required
@require_http_methods(["GET", "HEAD"])
def healthz(request: HttpRequest) -> JsonResponse:
    """Liveness for load balancers: ``{"database": "ok"}`` once the database answers. Staff
    also see its durability settings (SQLite's journal mode and synchronous level); nobody
    else learns anything about the installation."""
    with connection.cursor() as cur:
        if connection.vendor == "sqlite" and request.user.is_staff:
            mode = cur.execute("PRAGMA journal_mode").fetchone()[0]
            sync = cur.execute("PRAGMA synchronous").fetchone()[0]
            return JsonResponse({"database": "ok", "journal_mode": mode, "synchronous": sync})
        cur.execute("SELECT 1")
    return JsonResponse({"database": "ok"})


@login_not_required
@require_http_methods(["GET", "HEAD"])
def favicon(request: HttpRequest) -> HttpResponseRedirect:
    """The icon, for pages that do not link it (the admin's, error pages)."""
    return HttpResponseRedirect(static("console/favicon.svg"))


login = auth_views.LoginView.as_view(redirect_authenticated_user=True)
logout = auth_views.LogoutView.as_view()
