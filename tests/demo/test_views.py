"""The demo's outside world in the console: an approval links to it by idempotency key, and
the page shows what the provider and the mail server recorded (escaped)."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client

from demo import world
from demo.agents import AGENTS
from runtime.agents import registry
from runtime.models import Approval
from runtime.testkit import Crash, CrashPoint, InProcessKit


@pytest.fixture
def operator(rdb, settings, monkeypatch, tmp_path) -> Client:
    settings.STORAGES = {**settings.STORAGES, "staticfiles": {
        "BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"}}
    monkeypatch.setenv("RUNTIME_DEMO_DIR", str(tmp_path / "world"))
    world.setup()
    user = User.objects.create_user("olga")
    user.user_permissions.add(Permission.objects.get(codename="decide_approval"))
    client = Client()
    client.force_login(user)
    return client


def interrupted_refund(tmp_path, point: CrashPoint) -> Approval:
    kit = InProcessKit(tmp_path / "unused-ledger.jsonl")
    with registry.override(*AGENTS):
        small = next(o for o in world.order_ids()  # below the approval threshold
                     if world.lookup_order(o)["amount_cents"] <= 15000)
        run = kit.start("refund-desk", {"order_id": small})
        kit.crash(run, Crash(point, step_index=2))
        kit.take_over(run)
    return Approval.objects.get(run_id=run, status="pending")


def test_an_approval_links_to_the_outside_world_which_shows_the_refund(operator, tmp_path):
    approval = interrupted_refund(tmp_path, CrashPoint.AFTER_TOOL_EFFECT)  # it went through
    key = approval.step.idempotency_key
    page = operator.get(f"/approvals/{approval.pk}/").content.decode()
    assert f'href="/demo/world/?key={key}"' in page
    found = operator.get("/demo/world/", {"key": key})
    assert found.status_code == 200
    html = found.content.decode()
    assert key in html and "No refund recorded" not in html
    assert len(world.ledger(key)["refunds"]) == 1


def test_a_refund_that_never_reached_the_provider_shows_nothing_under_its_key(operator,
                                                                             tmp_path):
    approval = interrupted_refund(tmp_path, CrashPoint.AFTER_TOOL_DISPATCHED)  # never sent
    html = operator.get("/demo/world/", {"key": approval.step.idempotency_key}).content.decode()
    assert "No refund recorded under this key" in html


def test_the_world_page_escapes_what_it_shows_and_needs_a_login(operator, rdb):
    world.send_mail("<script>x</script>@example.com", "hi", "body", key="<b>k</b>")
    html = operator.get("/demo/world/").content.decode()
    assert "<script>x</script>" not in html and "&lt;script&gt;x&lt;/script&gt;" in html
    anonymous = Client().get("/demo/world/")
    assert anonymous.status_code == 302 and "/login/" in anonymous["Location"]


def test_the_world_page_answers_before_the_demo_ever_ran(rdb, settings, monkeypatch, tmp_path):
    settings.STORAGES = {**settings.STORAGES, "staticfiles": {
        "BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"}}
    monkeypatch.setenv("RUNTIME_DEMO_DIR", str(tmp_path / "never-set-up"))
    client = Client()
    client.force_login(User.objects.create_user("olga"))
    page = client.get("/demo/world/", {"key": "run1-step2-abc"})
    assert page.status_code == 200 and "No refund recorded under this key" in page.content.decode()
