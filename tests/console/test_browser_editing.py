"""Edit, then allow, in the real browser (Playwright driving Debian's chromium against the app
served by gunicorn on loopback): the form built from the tool's schema, the schema's refusal
next to its field, the edited call run and shown as a diff, on a desktop and on a 390 px phone.
Screenshots land in ``test-output/screenshots/``. What the tool did comes from its ledger."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from django.db import connection
from playwright.sync_api import Page, expect

from runtime.agents.agent import registry
from runtime.loop.control import resume, start
from runtime.models import Approval, Run
from tests.console import browser
from tests.console.browser import PHONE, shot
from tests.console.editing_agents import AGENTS, PROPOSED
from tests.kit import Ledger

pytestmark = pytest.mark.slow

DECIDE = "runtime.decide_approval"


@pytest.fixture
def transfers(monkeypatch, sqlite_path: Path, tmp_path: Path, clock):
    """The served console knows the ``transfers`` agent (its tool's schema builds the form);
    returns a function that starts a run of it and lets it pause on its policy."""
    served = f"{browser.AGENTS_ENV['RUNTIME_AGENTS']},tests.console.editing_agents.AGENTS"
    monkeypatch.setitem(browser.AGENTS_ENV, "RUNTIME_AGENTS", served)
    monkeypatch.setenv("RUNTIME_TEST_DIR", str(tmp_path))  # the tool's ledger, run here

    def run(run_id: int | None = None) -> Run:
        try:  # on a thread of its own: the browser's driver keeps a loop running on this one
            with registry.override(*AGENTS):
                if run_id is None:
                    run_id = start("transfers", {}, clock=clock).pk
                return resume(run_id, clock=clock, lease_seconds=5)
        finally:
            connection.close()

    with ThreadPoolExecutor(1) as pool:
        yield lambda run_id=None: pool.submit(run, run_id).result()


def _field(page: Page, name: str):
    return page.locator(f'#decide-edit p[data-argument="{name}"]')


def test_edit_then_allow_in_the_browser_desktop_and_phone(transfers, people, log_in,
                                                          tmp_path):
    run = transfers()
    assert run.status == "waiting"
    approval = Approval.objects.get(run_id=run.pk, status="pending")
    ledger = Ledger(tmp_path / "ledger.jsonl")
    people("olga", DECIDE)
    page = log_in("olga")
    page.goto(f"/approvals/{approval.pk}/")

    page.keyboard.press("e")  # opens the edit form, pre-filled with the proposed call
    expect(page.locator("#decide-edit")).to_have_attribute("open", "")
    expect(page.locator("#id_edit-arg-amount")).to_have_value(str(PROPOSED["amount"]))
    expect(page.locator("#id_edit-arg-account")).to_have_value(PROPOSED["account"])
    expect(page.locator("#id_edit-arg-currency")).to_have_value('"EUR"')
    expect(page.locator("#id_edit-arg-urgent")).to_be_checked()
    expect(page.locator("#id_edit-arg-tags")).to_have_value('[\n  "supplier",\n  "q4"\n]')
    expect(_field(page, "amount")).to_contain_text("(required)")
    expect(_field(page, "memo")).to_contain_text("(optional)")

    # The tool's own schema refuses a zero amount: said next to the field, nothing changes.
    page.fill("#id_edit-arg-amount", "0")
    page.select_option("#id_edit-arg-currency", '"GBP"')
    page.check("#id_edit-confirm")
    page.locator("#decide-edit button[type=submit]").click()
    expect(_field(page, "amount").locator("[data-field-error]")).to_contain_text(
        "Input should be greater than 0")
    expect(_field(page, "currency").locator("[data-field-error]")).to_have_count(0)
    expect(page.locator("#id_edit-arg-currency")).to_have_value('"GBP"')  # what was typed stays
    assert Approval.objects.get(pk=approval.pk).status == "pending"
    shot(page, "approval-edit.png")

    phone = log_in("olga", PHONE)
    phone.goto(f"/approvals/{approval.pk}/")
    phone.locator("#decide-edit summary").click()
    expect(phone.locator("#id_edit-arg-amount")).to_be_visible()
    widths = phone.evaluate("() => [document.documentElement.scrollWidth, "
                            "document.documentElement.clientWidth]")
    assert widths[0] <= widths[1], f"the edit form scrolls sideways on a phone: {widths}"
    box = phone.locator("#id_edit-arg-tags").bounding_box()
    assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= PHONE["width"]
    shot(phone, "approval-edit-phone.png")

    page.fill("#id_edit-arg-amount", "45000")
    page.check("#id_edit-confirm")
    page.locator("#decide-edit button[type=submit]").click()
    expect(page.get_by_test_id("outcome")).to_contain_text(
        "Allowed with arguments edited by olga")
    diff = page.get_by_test_id("edit-diff")
    expect(diff).to_contain_text("amount")
    expect(diff).to_contain_text("90000")
    expect(diff).to_contain_text("45000")
    expect(diff).to_contain_text('"GBP"')
    expect(page.get_by_test_id("effective-arguments")).to_contain_text('"amount": 45000')
    shot(page, "approval-edit-allowed.png")
    phone.goto(f"/approvals/{approval.pk}/")
    expect(phone.get_by_test_id("edit-diff")).to_be_visible()
    widths = phone.evaluate("() => [document.documentElement.scrollWidth, "
                            "document.documentElement.clientWidth]")
    assert widths[0] <= widths[1], f"the edit's diff scrolls sideways on a phone: {widths}"
    shot(phone, "approval-edit-allowed-phone.png")

    assert ledger.count("transfer") == 0  # allowing alone runs nothing
    assert transfers(run.pk).status == "succeeded"
    (call,) = ledger.calls("transfer")
    assert (call["amount"], call["currency"]) == (45000, "GBP")  # the edit, not the proposal
