"""The console as its users see it, in the real browser: after any decision every part of an
approval agrees with the database, in the decider's tab and in another person's; no page
scrolls sideways on a phone and the decision is in view on opening an approval; Escape
closes a decision; Back finds the queue selection; a corrected field loses its old error.
Screenshots of each page land in ``test-output/screenshots/``."""

from __future__ import annotations

import io
import re

import pytest
from playwright.sync_api import Page, expect

from runtime.agents.agent import registry
from runtime.crashpoints import CrashPoint
from runtime.loop.control import start
from runtime.models import Approval, Run, Step, Worker
from tests.console.browser import PHONE, shot
from tests.console.conftest import PASSWORD, crash_then_take_over, pay_agent
from tests.console.test_live import long_run
from tests.kit import Ledger

pytestmark = pytest.mark.slow

DECIDE = "runtime.decide_approval"


def agree_with_the_database(page: Page, approval_id: int) -> None:
    """Header, banner, step table and decision show what the database holds now."""
    approval = Approval.objects.select_related("run", "step").get(pk=approval_id)
    live = page.locator("#approval-live")
    expect(live.get_by_test_id("run-status")).to_have_text(approval.run.status)
    expect(live.locator("tr.current .status")).to_have_text(approval.step.status)
    expect(live.get_by_test_id("outcome-unknown")).to_have_count(0)
    expect(live.locator("details.decision")).to_have_count(0)
    expect(live.get_by_test_id("outcome")).to_contain_text(f"decided by {approval.decided_by}")


@pytest.mark.parametrize("decision", ["approve", "resolve", "reject"])
def test_after_a_decision_the_whole_approval_agrees_in_every_open_tab(
        decision, interrupted, people, log_in):
    waiting = interrupted()
    people("olga", DECIDE)
    people("pat", DECIDE)
    url = f"/approvals/{waiting.approval.pk}/"
    olga, pat = log_in("olga"), log_in("pat")
    for page in (olga, pat):
        page.goto(url)
        expect(page.get_by_test_id("outcome-unknown")).to_be_visible()
        expect(page.get_by_test_id("run-status")).to_have_text("waiting")

    key = {"approve": "a", "resolve": "s", "reject": "r"}[decision]
    olga.keyboard.press(key)
    if decision == "resolve":
        olga.fill("#id_resolve-result", '{"sent": true}')
    if decision == "reject":
        olga.fill("#id_reject-note", "sent twice before")
    olga.check(f"#id_{decision}-confirm")
    olga.locator(f"#decide-{decision} button[type=submit]").click()
    expect(olga.get_by_test_id("outcome")).to_be_visible()
    assert Approval.objects.get(pk=waiting.approval.pk).status != "pending"
    agree_with_the_database(olga, waiting.approval.pk)
    agree_with_the_database(pat, waiting.approval.pk)  # by its own poll, no reload
    olga.reload()
    agree_with_the_database(olga, waiting.approval.pk)
    expect(olga.get_by_test_id("pending-count")).to_have_text("0")
    shot(olga, {"approve": "approval-approved.png", "resolve": "approval-resolved.png",
                "reject": "approval-rejected.png"}[decision])


def wide_interrupted(tmp_path, clock) -> Approval:
    """An interrupted call whose arguments hold a long unbroken token and a long title."""
    ledger = Ledger(tmp_path / "wide-ledger")
    token = "tok_" + "9f8e7d6c5b4a" * 20
    with registry.override(pay_agent("wide", ledger, to=f"{token}@very-long-domain.example")):
        run = start("wide", {"order": "A-" + "7" * 80}, clock=clock)
        crash_then_take_over(run.pk, clock, CrashPoint.AFTER_TOOL_EFFECT, 1)
    return Approval.objects.get(run_id=run.pk, status="pending")


def no_sideways_scroll(page: Page, url: str) -> None:
    page.goto(url)
    widths = page.evaluate("() => [document.documentElement.scrollWidth, "
                           "document.documentElement.clientWidth]")
    assert widths[0] <= widths[1], f"{url} scrolls sideways on a phone: {widths}"
    assert page.evaluate("() => document.body.innerText").strip(), url  # and shows something


def test_no_console_page_scrolls_sideways_on_a_phone_and_the_decision_is_in_view(
        interrupted, policy_paused, people, log_in, tmp_path, clock, browser, server):
    waiting, policy = interrupted(), policy_paused()
    wide = wide_interrupted(tmp_path, clock)
    Worker.objects.create(owner="runtime@a-rather-long-host-name.internal:123456:abcdef12",
                          host="a-rather-long-host-name.internal", pid=123456,
                          started_at=waiting.run.created_at, heartbeat_at=waiting.run.created_at,
                          concurrency=4, lease_seconds=30)
    people("olga", DECIDE)
    page = log_in("olga", viewport=PHONE)
    pages = ["/", "/?kind=policy", "/runs/", "/runs/?status=bogus", "/workers/",
             f"/runs/{waiting.run.pk}/", f"/runs/{wide.run_id}/", "/no-such-page/",
             f"/approvals/{waiting.approval.pk}/", f"/approvals/{policy.approval.pk}/",
             f"/approvals/{wide.pk}/", "/demo/world/"]
    for width in (360, PHONE["width"], 420):
        page.set_viewport_size({"width": width, "height": PHONE["height"]})
        for url in pages:
            no_sideways_scroll(page, url)
    page.set_viewport_size(PHONE)
    for approval, name in ((wide, "approval-phone.png"), (policy.approval, "policy-phone.png")):
        page.goto(f"/approvals/{approval.pk}/")
        summary = page.locator("details.decision summary").first
        expect(summary).to_be_in_viewport()  # decidable without scrolling past the details
        shot(page, name)
    page.goto("/")
    expect(page.locator("header .who button")).to_be_in_viewport()  # Log out stays on the bar
    shot(page, "queue-phone.png")
    page.goto(f"/runs/{wide.run_id}/")
    shot(page, "run-phone.png")

    anonymous = browser.new_context(base_url=server.url, viewport=PHONE).new_page()
    try:
        no_sideways_scroll(anonymous, "/login/")
    finally:
        anonymous.context.close()


def test_escape_closes_a_decision_and_an_edited_field_loses_its_old_error(
        interrupted, people, log_in):
    waiting = interrupted()
    people("olga", DECIDE)
    page = log_in("olga")
    page.goto(f"/approvals/{waiting.approval.pk}/")
    page.keyboard.press("s")
    resolve = page.locator("#decide-resolve")
    expect(resolve).to_have_attribute("open", "")
    page.keyboard.press("Escape")  # from inside the result field, which has the focus
    expect(resolve).not_to_have_attribute("open", "")

    page.keyboard.press("s")
    page.fill("#id_resolve-result", "{sent: yes")
    page.check("#id_resolve-confirm")
    page.locator("#decide-resolve button[type=submit]").click()
    error = resolve.locator("[data-field-error]")
    expect(error).to_contain_text("Not valid JSON")
    page.fill("#id_resolve-result", '{"sent": true}')  # corrected: the old error goes
    expect(error).to_have_count(0)
    assert Approval.objects.get(pk=waiting.approval.pk).status == "pending"


def test_back_to_the_queue_finds_the_selection(interrupted, people, log_in):
    made = [interrupted() for _ in range(3)]
    people("olga", DECIDE)
    page = log_in("olga")
    page.keyboard.press("j")
    page.keyboard.press("j")
    second = page.locator(f'tr[data-id="{made[1].approval.pk}"]')
    expect(second).to_have_class(re.compile(r"\bselected\b"))
    page.keyboard.press("o")
    expect(page).to_have_url(re.compile(rf"/approvals/{made[1].approval.pk}/$"))
    page.go_back()
    expect(page.locator(f'tr[data-id="{made[1].approval.pk}"]')).to_have_class(
        re.compile(r"\bselected\b"))
    page.keyboard.press("j")  # and moving on goes on from there
    expect(page.locator(f'tr[data-id="{made[2].approval.pk}"]')).to_have_class(
        re.compile(r"\bselected\b"))


def test_a_long_run_page_in_the_browser(sqlite_path, people, log_in):
    run = long_run(5000)
    people("olga")
    page = log_in("olga")
    page.goto(f"/runs/{run.pk}/")
    expect(page.get_by_test_id("step-row")).to_have_count(50)
    expect(page.get_by_test_id("step-row").last).to_contain_text("5000")
    page.get_by_test_id("earlier-steps").click()
    expect(page.get_by_test_id("step-row").first).to_contain_text("4901")
    shot(page, "run-long.png")
    assert Step.objects.filter(run_id=run.pk).count() == 5000
    assert Run.objects.get(pk=run.pk).status == "succeeded"


def test_the_admin_audit_log_is_readable_at_1280(interrupted, make_user, log_in):
    for _ in range(3):
        interrupted()
    make_user("ada", superuser=True, password=PASSWORD)
    page = log_in("ada")
    page.goto("/admin/runtime/event/")
    payloads = page.locator("#result_list td.field-payload_short")
    expect(payloads.first).to_be_visible()
    sidebar = page.locator("#changelist-filter").bounding_box()
    rights = [box["x"] + box["width"] for box in
              (payloads.nth(i).bounding_box() for i in range(payloads.count()))]
    assert max(rights) <= sidebar["x"], (max(rights), sidebar)  # not behind the filters
    assert page.evaluate("() => { const r = document.querySelector('#changelist-form .results');"
                         " return r.scrollWidth <= r.clientWidth; }")
    expect(page.locator("#result_list td.field-at_ms time").first).to_have_text(
        re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} UTC$"))
    expect(page.get_by_test_id("pending-count")).to_have_text("3")  # the console's nav
    shot(page, "admin-events.png")


def test_the_admin_shows_the_global_audit_chain_and_the_checkpoints(interrupted, make_user,
                                                                     log_in, settings):
    from django.core.management import call_command

    runs = [interrupted() for _ in range(3)]
    settings.RUNTIME = {**settings.RUNTIME, "AUDIT_KEY": "a" * 40}
    call_command("auditcheckpoint", "--by", "ada", stdout=io.StringIO())
    make_user("ada", superuser=True, password=PASSWORD)
    page = log_in("ada")
    page.goto("/admin/runtime/runcreation/")
    rows = page.locator("#result_list tbody tr")
    expect(rows).to_have_count(3)
    expect(rows.first.locator("td.field-run_id")).to_have_text(str(runs[-1].run.pk))
    assert page.evaluate("() => document.documentElement.scrollWidth <= innerWidth")
    shot(page, "admin-run-creations.png")
    page.goto("/admin/runtime/auditcheckpoint/")
    expect(page.locator("#result_list tbody tr")).to_have_count(1)
    expect(page.locator("#result_list td.field-runs")).to_have_text("3")
    expect(page.locator("#result_list td.field-by")).to_have_text("ada")
    assert page.evaluate("() => document.documentElement.scrollWidth <= innerWidth")
    shot(page, "admin-checkpoints.png")


def test_the_approval_page_shows_who_was_told(interrupted, people, log_in, settings, clock):
    from runtime.clock import ManualClock
    from runtime.notifications.delivery import outbox_deliver_due

    settings.RUNTIME = {**settings.RUNTIME, "NOTIFY": [
        {"name": "ops-hook", "kind": "webhook", "target": "http://127.0.0.1:9/hook"},
        {"name": "mail", "kind": "email", "target": "ops@example.com, lead@example.com"}]}
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    waiting = interrupted()
    outbox_deliver_due(ManualClock(clock.now()))
    people("ada", DECIDE)
    for size, name in ((None, "approval-notified.png"), (PHONE, "approval-notified-phone.png")):
        page = log_in("ada")
        if size is not None:
            page.set_viewport_size(size)
        page.goto(f"/approvals/{waiting.approval.pk}/")
        rows = page.get_by_test_id("notification")
        expect(rows).to_have_count(2)
        expect(page.get_by_test_id("notifications")).to_contain_text("delivered")
        assert page.evaluate("() => document.documentElement.scrollWidth <= innerWidth")
        page.get_by_test_id("notifications").scroll_into_view_if_needed()
        shot(page, name)


def test_a_page_whose_session_ended_goes_to_the_login_page_on_its_next_poll(interrupted, people,
                                                                           log_in):
    from django.contrib.sessions.models import Session

    interrupted()
    people("olga", DECIDE)
    page = log_in("olga")
    expect(page.locator("tr[data-id]")).to_have_count(1)
    Session.objects.all().delete()  # the session ends (idle timeout, logout elsewhere)
    expect(page).to_have_url(re.compile(r"/login/"), timeout=15_000)  # the poll's 401 took it
