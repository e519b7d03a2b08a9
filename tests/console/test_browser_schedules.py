"""Schedules and expiring approvals in the real browser, at 1280 px and on a phone: the list,
creating a schedule (a bad field answered next to it, then created), turning the standing
authorization on through its confirmation, and the queue with an approval that expires.
No page scrolls sideways. Screenshots land in ``test-output/screenshots/``."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
from playwright.sync_api import Page, expect

from runtime import Agent, Allow, FinalAnswer, RequireApproval, ScriptedLLM, ToolCall, resume
from runtime.agents.agent import registry
from runtime.approvals.deadlines import approvals_near_deadline
from runtime.clock import ManualClock
from runtime.loop.control import start
from runtime.models import Approval, Schedule, ScheduleEvent
from runtime.schedules.changes import schedule_authorize, schedule_create
from runtime.schedules.firing import schedules_fire_due
from tests.console.agents import AGENTS
from tests.console.browser import DESKTOP, PHONE, shot
from tests.kit import Ledger, make_tools

pytestmark = pytest.mark.slow

VIEW, MANAGE = "runtime.view_schedule", "runtime.manage_schedule"
DECIDE = "runtime.decide_approval"
LONG_NAME = "quarterly-reconciliation-of-every-merchant-account-" + "x" * 40


def no_sideways_scroll(page: Page) -> None:
    widths = page.evaluate("() => [document.documentElement.scrollWidth, "
                           "document.documentElement.clientWidth]")
    assert widths[0] <= widths[1], f"{page.url} scrolls sideways: {widths}"


def some_schedules() -> Schedule:
    """Three schedules as an operator meets them: one authorized with runs, one on an
    interval, one disabled with a long name."""
    now = datetime.now(UTC)
    with registry.override(*AGENTS):
        nightly = schedule_create("nightly payout", "payout", {"batch": "eu", "limit": 500},
                                  by="ada", now=now - timedelta(days=8), cron="0 3 * * *",
                                  timezone="Europe/Berlin")
        at = nightly.next_fire_at
        for _ in range(7):
            schedules_fire_due(at + timedelta(seconds=1))
            at += timedelta(days=1)
        schedule_authorize(nightly.pk, True, by="ada", now=now)
        schedule_create("hello every 5 minutes", "hello", {"name": "Ada"}, by="ada", now=now,
                        interval_seconds=300)
        schedule_create(LONG_NAME, "payout", {"note": "y" * 300}, by="ada", now=now,
                        cron="15 6 1 */3 *", enabled=False)
    return nightly


def expiring_approval(ledger: Ledger) -> Approval:
    """A run paused by its policy now, its approval due in 12 minutes."""
    agent = Agent("charger", ScriptedLLM([ToolCall("charge", {"amount": 9}), FinalAnswer("ok")]),
                  make_tools(ledger), policy=lambda request, run: RequireApproval(
                      "Charge a card?", "Over the limit.", expires_in=12 * 60)
                  if request.tool == "charge" else Allow())
    with registry.override(agent):
        clock = ManualClock(datetime.now(UTC))
        run = resume(start("charger", {}, clock=clock).pk, clock=clock, lease_seconds=1)
    return Approval.objects.get(run_id=run.pk, status="pending")


def test_the_schedules_pages_at_1280_and_on_a_phone(people, log_in, interrupted):
    nightly = some_schedules()
    people("olga", VIEW, MANAGE)
    for viewport, suffix in ((DESKTOP, "desktop"), (PHONE, "phone")):
        page = log_in("olga", viewport=viewport)
        page.goto("/schedules/")
        rows = page.get_by_test_id("schedule-row")
        expect(rows).to_have_count(3)
        nightly_row = page.locator(f'tr[data-id="{nightly.pk}"]')
        expect(nightly_row.get_by_test_id("authorization")).to_contain_text("authorized by ada")
        expect(nightly_row.locator("ul.runs-mini li")).to_have_count(5)
        no_sideways_scroll(page)
        shot(page, f"schedules-{suffix}.png")

        page.goto(f"/schedules/{nightly.pk}/")
        expect(page.get_by_test_id("schedule-run")).to_have_count(7)
        no_sideways_scroll(page)
        shot(page, f"schedule-{suffix}.png")
        page.locator("#edit-schedule summary").click()
        expect(page.locator("#id_edit-cron")).to_have_value("0 3 * * *")
        no_sideways_scroll(page)
        shot(page, f"schedule-edit-{suffix}.png")


def test_create_a_schedule_then_authorize_it_through_its_confirmation(people, log_in):
    people("olga", VIEW, MANAGE)
    for viewport, suffix in ((DESKTOP, "desktop"), (PHONE, "phone")):
        name = f"payout {suffix}"
        page = log_in("olga", viewport=viewport)
        page.goto("/schedules/")
        page.get_by_test_id("new-schedule").click()
        expect(page).to_have_url(re.compile(r"/schedules/new/$"))
        page.fill("#id_name", name)
        page.select_option("#id_agent", "payout")
        page.fill("#id_input", '{"batch": "eu"}')
        page.fill("#id_cron", "0 25 * * *")  # no 25th hour: the runtime says so
        page.fill("#id_timezone", "Europe/Berlin")
        page.click("#schedule-form button[type=submit]")
        error = page.get_by_test_id("field-error-cron")
        expect(error).to_contain_text("is not a cron expression")
        assert not Schedule.objects.filter(name=name).exists()
        no_sideways_scroll(page)
        shot(page, f"schedule-new-error-{suffix}.png")
        page.fill("#id_cron", "0 3 * * *")
        expect(error).to_have_count(0)  # an edited field loses its old error
        page.click("#schedule-form button[type=submit]")
        expect(page).to_have_url(re.compile(r"/schedules/\d+/$"))
        expect(page.get_by_test_id("messages")).to_contain_text(f"Schedule {name} created.")
        schedule = Schedule.objects.get(name=name)
        assert schedule.created_by == "olga"

        page.get_by_test_id("authorize").click()
        expect(page).to_have_url(re.compile(rf"/schedules/{schedule.pk}/authorize/$"))
        what = page.get_by_test_id("what-it-authorizes")
        expect(what).to_contain_text("agent payout")
        expect(what).to_contain_text(f"schedule {name}")
        expect(what).to_contain_text("without asking")
        expect(what).to_contain_text("never covers an interrupted call")
        no_sideways_scroll(page)
        shot(page, f"schedule-authorize-{suffix}.png")
        page.get_by_test_id("confirm-authorize").click()  # without the box: not sent
        expect(page).to_have_url(re.compile(rf"/schedules/{schedule.pk}/authorize/$"))
        assert page.evaluate("() => !document.querySelector('#id_confirm').checkValidity()")
        assert not Schedule.objects.get(pk=schedule.pk).authorize_side_effects
        page.check("#id_confirm")
        page.get_by_test_id("confirm-authorize").click()
        expect(page).to_have_url(re.compile(rf"/schedules/{schedule.pk}/$"))
        expect(page.get_by_test_id("authorization")).to_contain_text("authorized by olga")
        assert ScheduleEvent.objects.filter(schedule=schedule, kind="schedule.authorized",
                                            actor="olga").count() == 1
        no_sideways_scroll(page)
        shot(page, f"schedule-authorized-{suffix}.png")

        page.get_by_test_id("unauthorize").click()  # off: no confirmation
        expect(page.get_by_test_id("notice")).to_contain_text("turned off")
        expect(page.get_by_test_id("authorization")).to_contain_text("off")
        assert not Schedule.objects.get(pk=schedule.pk).authorize_side_effects


def test_the_queue_with_an_expiring_approval(interrupted, people, log_in, tmp_path):
    older = interrupted()  # waiting longer, no deadline
    expiring = expiring_approval(Ledger(tmp_path / "charger-ledger"))
    people("olga", DECIDE)
    for viewport, suffix in ((DESKTOP, "desktop"), (PHONE, "phone")):
        page = log_in("olga", viewport=viewport)
        page.goto("/")
        rows = page.locator("tr[data-queue-row]")
        expect(rows).to_have_count(2)
        expect(rows.first).to_have_attribute("data-id", str(older.approval.pk))
        page.select_option("select[name=sort]", "expiring")  # the htmx filter
        expect(page).to_have_url(re.compile(r"sort=expiring"))
        expect(rows.first).to_have_attribute("data-id", str(expiring.pk))
        left = rows.first.get_by_test_id("deadline-left")
        expect(left).to_contain_text(re.compile(r"expires in 1[12]m \d+s"))
        expect(left.locator("time")).to_have_attribute("datetime",
                                                        expiring.expires_at.isoformat())
        no_sideways_scroll(page)
        shot(page, f"queue-expiring-{suffix}.png")
        approvals_near_deadline(datetime.now(UTC))  # inside the warning window: warned once
        page.goto(f"/approvals/{expiring.pk}/")
        expect(page.get_by_test_id("deadline")).to_contain_text("Decide by")
        expect(page.get_by_test_id("deadline-reminders")).to_contain_text(
            "no channel takes reminders for this agent")
        expect(page.get_by_test_id("approval-deadline")).to_contain_text(
            f"{expiring.expires_at:%Y-%m-%d %H:%M:%S} UTC")
        no_sideways_scroll(page)
        shot(page, f"approval-deadline-{suffix}.png")
