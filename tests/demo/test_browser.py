"""The demo as a newcomer sees it, in a real browser: the queue filled by real worker crashes
and the refund policy, an interrupted refund's page, and the outside world it links to. Its
screenshots are the documentation's."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import Permission, User
from playwright.sync_api import expect

from console.wording import kind_word
from demo import world
from runtime.testkit import CrashPoint
from tests.console.browser import Server, shot
from tests.console.conftest import PASSWORD
from tests.demo.test_demo import demo
from tests.demo.test_views import interrupted_mail, interrupted_refund

pytestmark = pytest.mark.slow


def test_the_demo_queue_an_interrupted_refund_and_its_outside_world(tmp_path, demo_db,
                                                                    browser, static_root):
    filled = demo(tmp_path, "--runs", "16", "--chaos", "0.8", "--seed", "3")
    assert filled.returncode == 0, filled.stdout + filled.stderr
    server = Server(tmp_path / "runtime.sqlite3", tmp_path, static_root)
    context = None
    try:
        context = browser.new_context(base_url=server.ready(),
                                      viewport={"width": 1280, "height": 800})
        context.set_default_timeout(15_000)
        page = context.new_page()
        page.goto("/")
        page.fill("#id_username", "operator")
        page.fill("#id_password", "correct horse battery")
        page.click("button[type=submit]")
        rows = page.locator("tr[data-queue-row]")
        interrupted = rows.filter(has_text=kind_word("interrupted_side_effect"))
        expect(interrupted.first).to_be_visible()
        expect(rows.filter(has_text=kind_word("policy")).first).to_be_visible()
        shot(page, "demo-queue.png")

        interrupted.filter(has_text="issue_refund").first.locator("a.open").click()
        expect(page.get_by_text("Outcome unknown.")).to_be_visible()
        expect(page.locator("[data-testid=idempotency-key]")).to_contain_text("-step2-")
        shot(page, "demo-approval.png")

        key = page.locator("[data-testid=idempotency-key]").inner_text()
        page.click("[data-testid=check-outside]")
        expect(page).to_have_url(f"{server.url}/demo/world/?key={key}")
        expect(page.get_by_role("heading", name="Refunds at the payment provider")).to_be_visible()
    finally:
        if context is not None:
            context.close()
        server.stop()


@pytest.fixture
def demo_world(sqlite_path, monkeypatch, tmp_path):
    """The outside world in this test's directory; asked for before ``server``, so the server
    process reads the same files."""
    monkeypatch.setenv("RUNTIME_DEMO_DIR", str(tmp_path / "world"))
    world.setup()
    return tmp_path


def test_the_outside_world_on_a_phone_links_back_to_the_approval(demo_world, log_in):
    """390 px wide, a long recipient and idempotency keys: no sideways scrolling, amounts with
    their currency, and the refund's row leads back to the approval that asked about it."""
    approval = interrupted_refund(demo_world, CrashPoint.AFTER_TOOL_EFFECT)
    world.send_mail("barbara.liskov.refunds-department@example.com",
                    "Your refund for order 1001", "body", key=approval.step.idempotency_key)
    User.objects.create_user("olga", password=PASSWORD).user_permissions.add(
        Permission.objects.get(codename="view_run", content_type__app_label="runtime"))
    page = log_in("olga")
    page.set_viewport_size({"width": 390, "height": 844})
    page.goto("/demo/world/")
    refund = page.get_by_test_id("refund-row").filter(has_text=approval.step.idempotency_key)
    expect(refund.get_by_test_id("amount")).to_have_text(
        re.compile(r"^\d+\.\d\d EUR$"))
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= 390, f"/demo/world/ is {width}px wide at 390"
    shot(page, "demo-world-390.png")
    refund.get_by_test_id("approval-link").click()
    expect(page).to_have_url(re.compile(rf"/approvals/{approval.pk}/$"))


def test_a_mail_lookup_that_finds_nothing_says_so_and_leads_back(demo_world, log_in):
    """The outside-world link of an interrupted send that never left: the page says no mail
    went out under the key and offers the way back to the approval, on a phone too."""
    approval = interrupted_mail(demo_world)
    User.objects.create_user("olga", password=PASSWORD).user_permissions.add(
        Permission.objects.get(codename="view_run", content_type__app_label="runtime"))
    page = log_in("olga")
    for width, name in ((1280, "desktop"), (390, "phone")):
        page.set_viewport_size({"width": width, "height": 844})
        page.goto(f"/approvals/{approval.pk}/")
        page.click("[data-testid=check-outside]")
        expect(page.get_by_test_id("no-mail")).to_contain_text(
            "no send with it reached the mail server")
        width_now = page.evaluate("document.documentElement.scrollWidth")
        assert width_now <= width, f"/demo/world/ is {width_now}px wide at {width}"
        shot(page, f"demo-world-nothing-{name}.png")
        page.get_by_test_id("key-origin").get_by_test_id("approval-link").click()
        expect(page).to_have_url(re.compile(rf"/approvals/{approval.pk}/$"))


def test_a_notification_reaches_the_demo_chat_over_http(demo_world, log_in, server, settings):
    """The outbox posts to the demo's receiver on the real server; the chat page shows it once
    and links to the approval."""
    from datetime import UTC, datetime, timedelta

    from runtime.clock import ManualClock
    from runtime.models import Notification
    from runtime.notifications.delivery import outbox_deliver_due

    base = server.ready()
    settings.RUNTIME = {**settings.RUNTIME, "NOTIFY": [
        {"name": "chat", "kind": "webhook", "target": f"{base}/demo/notifications/hook/"}],
        "APPROVAL_URL": f"{base}/approvals/{{id}}/"}
    approval = interrupted_refund(demo_world, CrashPoint.AFTER_TOOL_EFFECT)
    # The kit's clock ran ahead of the wall clock while leases lapsed: deliver "later".
    assert outbox_deliver_due(ManualClock(datetime.now(UTC) + timedelta(hours=1))) == 1
    assert Notification.objects.get(approval_id=approval.pk).status == "delivered"
    User.objects.create_user("olga", password=PASSWORD).user_permissions.add(
        Permission.objects.get(codename="view_run", content_type__app_label="runtime"))
    page = log_in("olga")
    page.goto("/demo/notifications/")
    row = page.get_by_test_id("received-row")
    expect(row).to_have_count(1)
    expect(row).to_contain_text("approval.requested")
    shot(page, "demo-chat.png")
    row.get_by_role("link").click()
    expect(page).to_have_url(re.compile(rf"/approvals/{approval.pk}/$"))
