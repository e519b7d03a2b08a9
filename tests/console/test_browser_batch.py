"""Batch decisions in the real browser (Playwright, chromium, gunicorn on loopback): tick
approvals in the queue (by mouse and by keyboard), allow them together, and see the result; a
poll never drops the ticked boxes; on a 390 px phone nothing scrolls sideways and a refused
batch lists which approval was refused. Screenshots: ``queue-batch.png``,
``queue-batch-done.png``, ``queue-batch-phone.png``, ``queue-batch-refused-phone.png``."""

from __future__ import annotations

import re

import pytest
from django.utils import timezone
from playwright.sync_api import Page, expect

from runtime.approvals.decisions import approve
from runtime.models import Approval
from tests.console.browser import PHONE, shot

pytestmark = pytest.mark.slow

DECIDE = "runtime.decide_approval"
COUNT_POLLS = """() => { window.queuePolls = 0;
  document.addEventListener("htmx:beforeRequest", (e) => {
    if (e.detail.elt.id === "queue-list") { window.queuePolls += 1; } }); }"""


def status(approval: Approval) -> tuple[str, str]:
    fresh = Approval.objects.get(pk=approval.pk)
    return fresh.status, fresh.decided_by


def no_sideways_scroll(page: Page) -> None:
    assert page.evaluate("() => document.documentElement.scrollWidth <= innerWidth")


def test_tick_two_keep_them_through_a_poll_and_allow_them(interrupted, policy_paused, people,
                                                          log_in, clock, settings):
    clock.advance((timezone.now() - clock.now()).total_seconds())  # deadlines from now
    settings.RUNTIME = {**settings.RUNTIME, "APPROVAL_EXPIRES_SECONDS": {"pay": 720,
                                                                        "refund": 1800}}
    first, second, third = interrupted(), policy_paused(), interrupted("refund")
    people("olga", DECIDE)
    page = log_in("olga")
    for w in (first, second, third):
        expect(page.locator(f'tr[data-id="{w.approval.pk}"]')).to_be_visible()
    # each deadline counts down, the closest in red; the effect in words
    soon = page.locator(f'tr[data-id="{first.approval.pk}"] td.expires .urgency-urgent')
    expect(soon).to_contain_text(re.compile(r"expires in 1[12]m \d+s"))
    expect(page.locator(f'tr[data-id="{third.approval.pk}"] td.expires .urgency-near')
           ).to_contain_text("expires in")
    expect(page.locator(f'tr[data-id="{second.approval.pk}"] td.expires')).to_have_text(
        "no deadline")
    expect(page.locator(f'tr[data-id="{first.approval.pk}"]')).to_contain_text(
        "changes things outside; may already have happened")
    bar = page.get_by_test_id("batch-bar")
    expect(bar.get_by_role("button", name="Allow / Run it once more")).to_be_visible()

    page.keyboard.press("j")  # the first row, ticked from the keyboard
    page.keyboard.press("x")
    expect(page.get_by_test_id(f"pick-{first.approval.pk}")).to_be_checked()
    page.get_by_label(f"Select approval #{second.approval.pk}:").check()  # by its label
    expect(bar).to_contain_text("2 of 3 selected")
    expect(page).to_have_url(page.url)  # ticking opened no approval

    # An approval arrives meanwhile: the poll waits while boxes are ticked.
    page.evaluate(COUNT_POLLS)
    arrived = interrupted()
    page.wait_for_function("() => window.queuePolls >= 2", timeout=15_000)
    expect(page.locator(f'tr[data-id="{arrived.approval.pk}"]')).to_have_count(0)
    expect(page.get_by_test_id(f"pick-{first.approval.pk}")).to_be_checked()
    expect(page.get_by_test_id(f"pick-{second.approval.pk}")).to_be_checked()
    shot(page, "queue-batch.png")

    page.get_by_test_id("batch-confirm").check()
    page.get_by_test_id("batch-approve").click()
    done = page.get_by_test_id("batch-done")
    expect(done).to_contain_text("2 approvals decided")
    expect(done.get_by_role("link", name=f"#{first.approval.pk}")).to_be_visible()
    assert status(first.approval) == status(second.approval) == ("approved", "olga")
    assert status(third.approval) == ("pending", "")
    # the list now shows what is still waiting, the newcomer too, nothing ticked
    expect(page.locator(f'tr[data-id="{first.approval.pk}"]')).to_have_count(0)
    expect(page.locator(f'tr[data-id="{arrived.approval.pk}"]')).to_be_visible()
    expect(page.locator("input[data-pick]:checked")).to_have_count(0)
    expect(page.get_by_test_id("pending-count")).to_have_text("2")
    shot(page, "queue-batch-done.png")


def test_on_a_phone_a_refused_batch_says_which_and_decides_nothing(interrupted, people, log_in):
    first, second = interrupted(), interrupted()
    people("olga", DECIDE)
    page = log_in("olga", viewport=PHONE)
    page.get_by_test_id("batch-bar").get_by_label("Select every approval listed").check()
    expect(page.get_by_test_id(f"pick-{first.approval.pk}")).to_be_checked()
    expect(page.get_by_test_id(f"pick-{second.approval.pk}")).to_be_checked()
    page.get_by_test_id("batch-note").fill("both were sent already")
    page.get_by_test_id("batch-confirm").check()
    no_sideways_scroll(page)
    shot(page, "queue-batch-phone.png")

    approve(second.approval.pk, "bob")  # someone else decides one meanwhile
    page.get_by_test_id("batch-reject").click()
    error = page.get_by_test_id("batch-error")
    expect(error).to_contain_text("Nothing was decided.")
    refused = error.get_by_test_id("batch-refused")
    expect(refused).to_have_count(1)
    expect(refused).to_contain_text(f"Approval #{second.approval.pk}")
    expect(refused).to_contain_text("This approval was already decided by bob at ")
    assert status(first.approval) == ("pending", "")
    # the one not refused stays ticked, the note kept, for another try
    expect(page.get_by_test_id(f"pick-{first.approval.pk}")).to_be_checked()
    expect(page.get_by_test_id("batch-note")).to_have_value("both were sent already")
    no_sideways_scroll(page)
    shot(page, "queue-batch-refused-phone.png")
