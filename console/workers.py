"""Worker processes: which are alive (heartbeat within their lease), and what each holds."""

from __future__ import annotations

from datetime import timedelta

from django.db.models import Count
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from django.views.decorators.http import require_http_methods

from runtime.models import Run, RunStatus, Worker

from .render import page


@require_http_methods(["GET"])
def worker_list(request: HttpRequest) -> HttpResponse:
    """A worker is live while its last heartbeat is younger than its lease; a dead one's row
    stays until another worker on its host or the lease expiry takes its runs over."""
    now = timezone.now()
    workers = list(Worker.objects.order_by("host", "started_at"))
    held = dict(
        Run.objects.filter(status=RunStatus.RUNNING, lease_owner__in=[w.owner for w in workers])
        .values_list("lease_owner").annotate(n=Count("id")).order_by())
    rows = []
    for w in workers:
        heartbeat_age = now - w.heartbeat_at
        rows.append({
            "worker": w,
            "live": heartbeat_age < timedelta(seconds=w.lease_seconds),
            "heartbeat_age": heartbeat_age,
            "runs_held": held.get(w.owner, 0),
        })
    rows.sort(key=lambda r: (not r["live"], r["worker"].host, r["worker"].started_at))
    context = {"rows": rows, "live_count": sum(r["live"] for r in rows), "now": now}
    return page(request, "console/workers.html", context, partial="worker-list")
