"""The pages this project's wording and formats touch, in the real browser at 1280 px and on
a 390 px phone: a run's page (cost with its unit, times to the second, a denial in its
approval's words), the runs list, the schedule form with every error at once, and the key
hints, shown with a keyboard and hidden on a phone. No page scrolls sideways."""

from __future__ import annotations

from decimal import Decimal

import pytest
from playwright.sync_api import Page, expect

from runtime.models import Run
from tests.console.browser import DESKTOP, PHONE, shot

pytestmark = pytest.mark.slow

DECIDE = "runtime.decide_approval"
SIZES = ((DESKTOP, "desktop"), (PHONE, "phone"))


def no_sideways_scroll(page: Page) -> None:
    widths = page.evaluate("() => [document.documentElement.scrollWidth, "
                           "document.documentElement.clientWidth]")
    assert widths[0] <= widths[1], f"{page.url} scrolls sideways: {widths}"


def test_run_pages_and_key_hints_at_both_widths(policy_paused, people, log_in):
    waiting = policy_paused()
    Run.objects.filter(pk=waiting.run.pk).update(cost=Decimal("0.0123"))
    people("olga", DECIDE)
    for viewport, suffix in SIZES:
        page = log_in("olga", viewport=viewport)
        page.goto(f"/approvals/{waiting.approval.pk}/")
        hint = page.locator("#decide-approve summary kbd")
        if viewport is PHONE:
            expect(hint).to_be_hidden()
        else:
            expect(hint).to_be_visible()
        no_sideways_scroll(page)
        shot(page, f"consistency-approval-{suffix}.png")
        page.goto("/runs/")
        expect(page.get_by_test_id("cost").first).to_have_text("$0.0123")
        no_sideways_scroll(page)
        shot(page, f"consistency-runs-{suffix}.png")
    page.goto(f"/approvals/{waiting.approval.pk}/")
    page.locator("#decide-reject summary").click()
    page.fill("#id_reject-note", "over the limit")
    page.check("#id_reject-confirm")
    page.locator("#decide-reject button[type=submit]").click()
    expect(page.get_by_test_id("outcome")).to_contain_text("by olga")
    for viewport, suffix in SIZES:
        page.set_viewport_size(viewport)
        page.goto(f"/runs/{waiting.run.pk}/")
        expect(page.get_by_test_id("failure-message")).to_have_text(
            "denied by olga: over the limit")
        expect(page.get_by_test_id("cost")).to_have_text("$0.0123")
        no_sideways_scroll(page)
        shot(page, f"consistency-run-{suffix}.png")


def test_the_schedule_form_shows_every_error_at_once(people, log_in):
    people("olga", "runtime.view_schedule", "runtime.manage_schedule")
    for viewport, suffix in SIZES:
        page = log_in("olga", viewport=viewport)
        page.goto("/schedules/new/")
        page.fill("#id_name", f"report {suffix}")
        page.fill("#id_input", "{not json")
        page.fill("#id_cron", "every day")
        page.fill("#id_interval_seconds", "60")
        page.fill("#id_timezone", "Mars/Olympus")
        page.click("#schedule-form button[type=submit]")
        expect(page.get_by_test_id("field-error-input")).to_contain_text("Not valid JSON")
        expect(page.get_by_test_id("field-error-cron")).to_contain_text("not both")
        expect(page.get_by_test_id("field-error-cron")).to_contain_text(
            "is not a cron expression")
        expect(page.get_by_test_id("field-error-timezone")).to_contain_text(
            "is not a time zone name")
        no_sideways_scroll(page)
        shot(page, f"consistency-schedule-form-{suffix}.png")
