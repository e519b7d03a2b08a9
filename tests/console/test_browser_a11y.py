"""The console's accessibility in the real browser: axe-core (WCAG 2.0/2.1 A and AA, and its
best practices) finds no violation on any console page, admin page, error page or demo page,
at 1280 px and on a 390 px phone, with a decision form open, after a decision, with the queue
empty and full; and a keyboard-only pass: after a decision
focus lands on the announced outcome, Escape returns focus to the decision's opener, j/k move
real focus through the queue, and the single-key shortcuts can be turned off.
Screenshots: ``a11y-outcome-focused.png``, ``a11y-outcome-focused-phone.png``."""

from __future__ import annotations

import pytest
from axe_playwright_python.sync_playwright import Axe
from django.contrib.auth.models import User
from django.db.models import Model
from django.test import RequestFactory
from playwright.sync_api import Page, expect

from console.models import ApiToken
from runtime.approvals.decisions import approve
from runtime.models import Approval, AuditCheckpoint, Event, Run, RunCreation, Worker
from tests.console.browser import DESKTOP, PHONE, shot
from tests.console.conftest import PASSWORD
from tests.console.test_browser_schedules import MANAGE, VIEW, some_schedules
from tests.demo import test_browser as demo_browser

pytestmark = pytest.mark.slow
demo_world = demo_browser.demo_world  # the fixture, shared

DECIDE = "runtime.decide_approval"
WCAG_21_AA = ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa", "best-practice"]
AXE = Axe()


def axe_clean(page: Page, where: str) -> None:
    """Fail listing every violation (WCAG 2.1 A/AA and axe's best practices): its rule, and
    each element it was found on."""
    results = AXE.run(page, options={"runOnly": {"type": "tag", "values": WCAG_21_AA},
                                     "resultTypes": ["violations"]})
    found = [f"{v['id']} ({v['impact']}): {v['help']} at "
             + ", ".join(" ".join(n["target"]) for n in v["nodes"])
             for v in results.response["violations"]]
    assert not found, f"{where} at {page.viewport_size}:\n" + "\n".join(found)


@pytest.mark.parametrize("viewport", [DESKTOP, PHONE], ids=["desktop", "phone"])
def test_axe_finds_no_violation_on_any_console_page(viewport, interrupted, policy_paused,
                                                    people, make_user, log_in, browser, server):
    make_user("ada", DECIDE, VIEW, MANAGE, superuser=True, password=PASSWORD)
    page = log_in("ada", viewport=viewport)
    expect(page.locator(".empty")).to_be_visible()
    axe_clean(page, "the empty queue")

    anonymous = browser.new_context(base_url=server.url, viewport=viewport).new_page()
    try:
        anonymous.goto("/login/")
        axe_clean(anonymous, "the login page")
    finally:
        anonymous.context.close()

    waiting, policy, decided = interrupted(), policy_paused(), interrupted()
    approve(decided.approval.pk, by="olga", note="checked")
    nightly = some_schedules()
    Worker.objects.create(owner="runtime@host:1:abc", host="host", pid=1,
                          started_at=waiting.run.created_at, heartbeat_at=waiting.run.created_at,
                          concurrency=4, lease_seconds=30)
    page.goto("/")
    expect(page.get_by_test_id("batch-bar")).to_be_visible()
    page.get_by_test_id(f"pick-{waiting.approval.pk}").check()
    axe_clean(page, "the queue with a ticked row")

    for approval, key in ((waiting.approval, "s"), (policy.approval, "a"),
                          (waiting.approval, "r")):
        page.goto(f"/approvals/{approval.pk}/")
        page.keyboard.press(key)
        expect(page.locator("details.decision[open]")).to_have_count(1)
        axe_clean(page, f"approval {approval.pk} with the {key} decision open")
    page.goto(f"/approvals/{decided.approval.pk}/")
    expect(page.get_by_test_id("outcome")).to_be_visible()
    axe_clean(page, "a decided approval")

    run = Run.objects.get(pk=waiting.run.pk)
    for url in ("/runs/", f"/runs/{run.pk}/", "/workers/", "/schedules/",
                f"/schedules/{nightly.pk}/", "/schedules/new/", "/admin/runtime/event/",
                "/admin/runtime/event/?q=pay"):
        page.goto(url)
        axe_clean(page, url)
        if url.startswith("/admin/"):  # its search box has a label of its own, in words
            expect(page.locator("#searchbar")).to_have_accessible_name("Search events")
    page.goto(f"/schedules/{nightly.pk}/")
    page.locator("#edit-schedule summary").click()
    axe_clean(page, "a schedule's edit form")
    assert Approval.objects.get(pk=waiting.approval.pk).status == "pending"  # looked only


def admin_pages(superuser: User, *objects: Model) -> list[str]:
    """Every page the admin has: its index, each app's index, and for each registered model
    its list, its add form where it has one, and the page of one of ``objects``."""
    from django.contrib import admin

    request = RequestFactory().get("/admin/")
    request.user = superuser
    pages = ["/admin/", "/admin/password_change/"]
    for model, model_admin in admin.site._registry.items():
        meta = model._meta
        app = f"/admin/{meta.app_label}/"
        pages += [app] if app not in pages else []
        pages.append(f"{app}{meta.model_name}/")
        if model_admin.has_add_permission(request):
            pages.append(f"{app}{meta.model_name}/add/")
        one = next((o for o in objects if isinstance(o, model)), None)
        if one is not None:
            pages.append(f"{app}{meta.model_name}/{one.pk}/change/")
    return pages


@pytest.mark.parametrize("viewport", [DESKTOP, PHONE], ids=["desktop", "phone"])
def test_axe_finds_no_violation_on_any_admin_page(viewport, interrupted, policy_paused,
                                                  make_user, log_in):
    """The admin is Django's, dressed in the console's header; each of its pages, every model
    registered (one of each on its own page), a group's permission picker and the export
    form included."""
    from django.contrib.auth.models import Group

    ada = make_user("ada", DECIDE, VIEW, MANAGE, superuser=True, password=PASSWORD)
    waiting, policy = interrupted(), policy_paused()
    approve(policy.approval.pk, by="olga", note="checked")
    nightly = some_schedules()
    token = ApiToken.issue(ada, "ci")[0]
    group = Group.objects.create(name="operators-a11y")
    objects = [ada, group, token, nightly, Run.objects.get(pk=waiting.run.pk),
               waiting.approval, policy.approval.step, Event.objects.first(),
               Worker.objects.create(owner="runtime@host:1:abc", host="host", pid=1,
                                     started_at=waiting.run.created_at,
                                     heartbeat_at=waiting.run.created_at, concurrency=4,
                                     lease_seconds=30),
               *RunCreation.objects.all()[:1], *AuditCheckpoint.objects.all()[:1]]
    page = log_in("ada", viewport=viewport)
    pages = admin_pages(ada, *objects)
    assert len(pages) > 20, pages
    for url in [*pages, "/admin/runtime/auditexport/export/"]:
        response = page.goto(url)
        assert response is not None and response.status == 200, url
        axe_clean(page, url)
    page.goto(f"/admin/auth/group/{group.pk}/change/")
    expect(page.locator(".help-tooltip.search-label-icon").first).to_have_attribute(
        "role", "img")
    shot(page, f"a11y-admin-group-{viewport['width']}.png")
    page.goto(f"/admin/auth/user/{ada.pk}/change/")
    expect(page.locator(".field-last_login .readonly")).to_be_visible()  # read, not typed
    shot(page, f"a11y-admin-user-{viewport['width']}.png")


def test_axe_finds_no_violation_on_the_error_and_demo_pages(interrupted, people, log_in,
                                                            demo_world):
    """The pages a person lands on by mistake, and the demo's outside world and chat."""
    people("olga")
    page = log_in("olga")
    for url, status in (("/runs/999999/", 404), ("/schedules/new/", 403),
                        ("/demo/world/", 200), ("/demo/world/?key=no-such-key", 200),
                        ("/demo/notifications/", 200)):
        for viewport in (DESKTOP, PHONE):
            page.set_viewport_size(viewport)
            response = page.goto(url)
            assert response is not None and response.status == status, url
            axe_clean(page, url)


CONTRAST = """(el) => {
  const rgb = (c) => c.match(/\\d+(\\.\\d+)?/g).slice(0, 3).map(Number);
  const lum = (c) => { const [r, g, b] = rgb(c).map((v) => { v /= 255;
    return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4); });
    return 0.2126 * r + 0.7152 * g + 0.0722 * b; };
  const s = getComputedStyle(el), a = lum(s.color), b = lum(s.backgroundColor);
  return (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05); }"""


def test_the_pending_count_badge_reads_at_4_5_to_1(interrupted, people, make_user, log_in):
    """axe leaves a one-digit badge unjudged ("too short"), so its contrast is measured here,
    on the console's pages and in the admin's header."""
    interrupted()
    make_user("ada", DECIDE, superuser=True, password=PASSWORD)
    page = log_in("ada")
    for url in ("/", "/admin/runtime/event/"):
        page.goto(url)
        badge = page.locator("[data-testid=pending-count].count-waiting")
        expect(badge).to_have_text("1")
        assert badge.evaluate(CONTRAST) >= 4.5, (url, badge.evaluate(CONTRAST))


def decide_by_keyboard(page: Page, approval_id: int) -> None:
    page.goto(f"/approvals/{approval_id}/")
    page.keyboard.press("a")  # opens "approve", the focus in its note
    expect(page.locator("#decide-approve textarea")).to_be_focused()
    page.keyboard.type("checked the ledger")
    page.keyboard.press("Tab")
    expect(page.locator("#decide-approve input[name$=confirm]")).to_be_focused()
    page.keyboard.press("Space")
    page.keyboard.press("Tab")
    expect(page.locator("#decide-approve button[type=submit]")).to_be_focused()
    page.keyboard.press("Enter")


def test_after_a_decision_the_focus_is_on_its_announced_outcome(interrupted, people, log_in):
    first, second = interrupted(), interrupted()
    people("olga", DECIDE)
    page = log_in("olga")
    decide_by_keyboard(page, first.approval.pk)
    outcome = page.get_by_test_id("outcome")
    expect(outcome).to_be_focused()
    expect(outcome).to_have_attribute("role", "status")
    expect(outcome).to_contain_text("decided by olga")
    fresh = Approval.objects.get(pk=first.approval.pk)
    assert (fresh.status, fresh.decided_by, fresh.note) == ("approved", "olga",
                                                            "checked the ledger")
    shot(page, "a11y-outcome-focused.png")

    page.set_viewport_size(PHONE)  # by touch on a phone: the outcome takes the focus too
    page.goto(f"/approvals/{second.approval.pk}/")
    page.locator("#decide-reject summary").click()
    page.locator("#decide-reject textarea").fill("not ours")
    page.locator("#decide-reject input[name$=confirm]").check()
    page.locator("#decide-reject button[type=submit]").click()
    expect(page.get_by_test_id("outcome")).to_be_focused()
    expect(page.get_by_test_id("outcome")).to_be_in_viewport()
    assert Approval.objects.get(pk=second.approval.pk).status == "rejected"
    shot(page, "a11y-outcome-focused-phone.png")


def test_what_a_screen_reader_is_told_on_the_queue_and_after_a_decision(
        interrupted, policy_paused, people, log_in):
    """The accessibility tree (what a screen reader reads out): the pending count in words,
    the queue as a named table whose every checkbox says which approval it picks, the
    shortcuts' switch, and after a decision an announced status saying who decided what."""
    interrupted_title = "send was interrupted: did it take effect?"
    waiting, policy = interrupted(), policy_paused()
    people("olga", DECIDE)
    page = log_in("olga")
    expect(page.get_by_role("navigation", name="Console")).to_match_aria_snapshot(
        '- link "Approvals 2 waiting"')
    queue = page.get_by_role("table", name="Pending approvals")
    expect(queue).to_match_aria_snapshot(f"""
        - table "Pending approvals":
          - rowgroup:
            - row:
              - columnheader "Select"
              - columnheader "Waiting"
          - rowgroup:
            - row:
              - cell:
                - 'checkbox "Select approval #{waiting.approval.pk}: {interrupted_title}"'
              - cell "interrupted call"
              - 'cell "{interrupted_title}"':
                - 'link "{interrupted_title}"'
            - row:
              - cell:
                - 'checkbox "Select approval #{policy.approval.pk}: Charge a card?"'
              - cell "Charge a card?":
                - link "Charge a card?"
        """)
    expect(page.get_by_role("checkbox", name="Single-key shortcuts")).to_be_checked()

    decide_by_keyboard(page, policy.approval.pk)
    expect(page.get_by_role("status")).to_match_aria_snapshot("""
        - status:
          - paragraph:
            - strong: Allowed, not started yet
            - text: /— decided by olga at/
            - time
          - paragraph: "Note: checked the ledger"
        """)
    expect(page.get_by_role("navigation", name="Console")).to_match_aria_snapshot(
        '- link "Approvals 1 waiting"')
    page.goto(f"/runs/{policy.run.pk}/")
    expect(page.get_by_role("table", name=f"Steps of run #{policy.run.pk}")).to_be_visible()
    expect(page.get_by_role("table", name=f"Events of run #{policy.run.pk}")).to_be_visible()


def test_a_refused_decision_puts_the_focus_on_why(interrupted, people, log_in):
    waiting = interrupted()
    people("olga", DECIDE)
    page = log_in("olga")
    page.goto(f"/approvals/{waiting.approval.pk}/")
    page.keyboard.press("r")
    page.keyboard.type("not ours")
    page.locator("#decide-reject input[name$=confirm]").check()
    approve(waiting.approval.pk, by="ada")  # someone else was quicker
    page.locator("#decide-reject button[type=submit]").press("Enter")
    conflict = page.get_by_test_id("conflict")
    expect(conflict).to_contain_text("already decided by ada")
    expect(conflict).to_be_focused()
    expect(conflict).to_have_attribute("role", "alert")
    assert Approval.objects.get(pk=waiting.approval.pk).decided_by == "ada"


def test_escape_gives_the_focus_back_to_the_decision_that_opened(interrupted, people, log_in):
    waiting = interrupted()
    people("olga", DECIDE)
    page = log_in("olga")
    page.goto(f"/approvals/{waiting.approval.pk}/")
    page.keyboard.press("s")
    expect(page.locator("#id_resolve-result")).to_be_focused()
    page.keyboard.press("Escape")
    expect(page.locator("#decide-resolve")).not_to_have_attribute("open", "")
    expect(page.locator("#decide-resolve summary")).to_be_focused()

    reject = page.locator("#decide-reject summary")  # opened by pressing its summary
    reject.focus()
    page.keyboard.press("Enter")
    expect(page.locator("#decide-reject")).to_have_attribute("open", "")
    page.keyboard.press("Tab")
    page.keyboard.press("Escape")
    expect(page.locator("#decide-reject")).not_to_have_attribute("open", "")
    expect(reject).to_be_focused()
    page.keyboard.press("a")  # the page's keys still work from there
    expect(page.locator("#decide-approve")).to_have_attribute("open", "")


def test_j_and_k_move_the_focus_and_the_shortcuts_can_be_turned_off(interrupted, people,
                                                                      log_in):
    made = [interrupted() for _ in range(3)]
    people("olga", DECIDE)
    page = log_in("olga")

    def link(i: int):
        return page.locator(f'tr[data-id="{made[i].approval.pk}"] a.open')

    page.keyboard.press("j")
    expect(link(0)).to_be_focused()
    page.keyboard.press("j")
    page.keyboard.press("j")
    expect(link(2)).to_be_focused()
    page.keyboard.press("k")
    expect(link(1)).to_be_focused()
    expect(page.locator("tr[aria-selected]")).to_have_count(0)  # no ARIA a table can't hold
    expect(page.locator(".key-hint")).to_be_visible()
    shot(page, "a11y-queue-keys.png")

    toggle = page.get_by_test_id("shortcuts")
    toggle.uncheck()
    expect(page.locator(".key-hint")).to_be_hidden()  # the hints follow the setting
    page.reload()
    expect(page.get_by_test_id("shortcuts")).not_to_be_checked()  # remembered
    expect(page.locator(".key-hint")).to_be_hidden()
    page.keyboard.press("j")
    page.keyboard.press("x")
    for i in range(3):
        expect(link(i)).not_to_be_focused()
    expect(page.locator("tr.selected")).to_have_count(1)  # where it was, not moved
    expect(page.locator("input[data-pick]:checked")).to_have_count(0)
    page.goto(f"/approvals/{made[0].approval.pk}/")
    page.keyboard.press("a")
    expect(page.locator("details.decision[open]")).to_have_count(0)
    expect(page.locator("details.decision kbd").first).to_be_hidden()

    page.get_by_test_id("shortcuts").check()
    page.locator("h1").click()  # out of the box: keys typed in a field are the field's
    page.keyboard.press("a")
    expect(page.locator("#decide-approve")).to_have_attribute("open", "")
    assert Approval.objects.filter(status="pending").count() == 3


def test_after_a_batch_decision_the_focus_is_on_its_announced_outcome(interrupted, people,
                                                                       log_in):
    first, second = interrupted(), interrupted()
    people("olga", DECIDE)
    page = log_in("olga")
    for _ in range(2):  # both ticked from the keyboard
        page.keyboard.press("j")
        page.keyboard.press("x")
    page.get_by_test_id("batch-confirm").check()
    page.get_by_test_id("batch-approve").press("Enter")
    done = page.get_by_test_id("batch-done")
    expect(done).to_contain_text("2 approvals decided")
    expect(done).to_be_focused()
    expect(done).to_have_attribute("role", "status")
    assert {Approval.objects.get(pk=w.approval.pk).status for w in (first, second)} == {
        "approved"}


def test_a_poll_keeps_the_focus_on_the_queue_row(interrupted, people, log_in):
    first = interrupted()
    people("olga", DECIDE)
    page = log_in("olga")
    page.keyboard.press("j")
    link = page.locator(f'tr[data-id="{first.approval.pk}"] a.open')
    expect(link).to_be_focused()
    arrived = interrupted()  # the next poll re-renders the list
    expect(page.locator(f'tr[data-id="{arrived.approval.pk}"]')).to_be_visible()
    expect(link).to_be_focused()  # the same row's link, not the page's top
    page.keyboard.press("j")
    expect(page.locator(f'tr[data-id="{arrived.approval.pk}"] a.open')).to_be_focused()
