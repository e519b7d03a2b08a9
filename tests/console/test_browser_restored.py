"""A run held by a restore, as the person deciding it sees it in the real browser: the
approval names the backup's moment and offers the decisions of a call that may have happened.
Screenshots land in ``test-output/screenshots/``."""

from __future__ import annotations

from datetime import timedelta

import pytest
from playwright.sync_api import expect

from runtime.agents.agent import registry
from runtime.backups.fence import restore_fence
from runtime.loop.control import resume, start
from runtime.models import Approval
from tests.console.browser import PHONE, shot
from tests.console.conftest import pay_agent
from tests.console.test_browser_pages import no_sideways_scroll
from tests.kit import Ledger

pytestmark = pytest.mark.slow


def test_a_restored_approval_names_the_backup_and_offers_a_rerun_a_record_or_an_end(
        sqlite_path, tmp_path, clock, people, log_in):
    ledger = Ledger(tmp_path / "ledger")
    with registry.override(pay_agent("pay", ledger, to="ann@example.com")):
        run = start("pay", {"order": "A-1"}, clock=clock)
        restore_fence(by="ops", now=clock.now(), taken_at=clock.now() - timedelta(hours=3))
        resume(run.pk, owner="w", clock=clock)
    approval = Approval.objects.get(run_id=run.pk)
    assert approval.kind == "restored" and ledger.count("send") == 0
    people("olga", "runtime.decide_approval")
    page = log_in("olga")
    page.goto(f"/approvals/{approval.pk}/")
    expect(page.locator("h1, h2").first).to_contain_text("Restored from a backup taken at")
    body = page.locator("main")
    expect(body).to_contain_text(approval.step.idempotency_key)
    shot(page, "approval-restored.png")
    for decision, words in (("approve", "Run it once more"),
                            ("resolve", "It happened: record the result"),
                            ("reject", "End the run")):
        expect(page.locator(f"#decide-{decision} summary")).to_contain_text(words)
    page.goto("/?kind=restored")
    expect(page.locator("main")).to_contain_text("restored from a backup")
    shot(page, "queue-restored.png")
    phone = log_in("olga", PHONE)
    no_sideways_scroll(phone, f"/approvals/{approval.pk}/")
    shot(phone, "approval-restored-phone.png")
