"""The demo as a newcomer sees it, in a real browser: the queue filled by real worker crashes
and the refund policy, an interrupted refund's page, and the outside world it links to. Its
screenshots are the README's."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from tests.console.test_browser import Server, shot
from tests.demo.test_demo import demo

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
        expect(rows.filter(has_text="interrupted_side_effect").first).to_be_visible()
        expect(rows.filter(has_text="policy").first).to_be_visible()
        shot(page, "demo-queue.png")

        rows.filter(has_text="interrupted_side_effect").filter(
            has_text="issue_refund").first.locator("a.open").click()
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
