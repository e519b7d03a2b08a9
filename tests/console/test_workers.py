"""Workers page (console/workers.py): live versus dead by heartbeat age against the lease."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from runtime.api import start
from runtime.models import Run, Worker


def worker(owner: str, heartbeat_age: float, lease: float = 30) -> Worker:
    now = timezone.now()
    return Worker.objects.create(owner=owner, name="w", host="host-1", pid=4242,
                                 lease_seconds=lease, started_at=now - timedelta(hours=1),
                                 heartbeat_at=now - timedelta(seconds=heartbeat_age),
                                 concurrency=4)


def test_workers_live_and_dead_with_heartbeat_age_and_runs_held(rdb, clock, viewer):
    live, dead = worker("w-live", 3), worker("w-dead", 45)
    for _ in range(2):
        run = start("hello", {"name": "n"}, clock=clock)
        Run.objects.filter(pk=run.pk).update(status="running", lease_owner=live.owner,
                                             lease_expires_at=timezone.now())
    page = viewer.get("/workers/")
    assert page.status_code == 200
    rows = {r["worker"].owner: r for r in page.context["rows"]}
    assert rows["w-live"]["live"] and not rows["w-dead"]["live"]
    assert rows["w-live"]["runs_held"] == 2 and rows["w-dead"]["runs_held"] == 0
    assert [r["worker"].owner for r in page.context["rows"]] == ["w-live", "w-dead"]
    html = page.content.decode()
    assert "1 live of 2." in html
    assert ">3s<" in html and ">45s<" in html
    assert dead.owner in html


def test_workers_poll_renders_the_list_partial(rdb, viewer):
    html = viewer.get("/workers/", HTTP_HX_REQUEST="true").content.decode().strip()
    assert html.startswith('<div id="worker-list"') and "No worker has registered" in html
