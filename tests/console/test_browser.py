"""The console in a real browser (Playwright driving Debian's chromium) against the real app
served by gunicorn on loopback, with real worker processes: the interrupted side effect comes
from a worker that SIGKILLs itself right after recording the tool's start, and a fresh worker
takes the run over. Side-effect counts come from the tool's own ledger, never from the
runtime's tables."""

from __future__ import annotations

import json
import re
import signal
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from django.test import Client
from playwright.sync_api import expect

from runtime.agents.agent import registry
from runtime.loop.control import start
from runtime.models import Approval, Step
from tests.console.agents import AGENTS, RECIPIENT
from tests.console.browser import AGENTS_ENV, shot, wait_for_run
from tests.kit import Ledger
from tests.procs import SpawnedWorker
from tests.waiting import wait_until

pytestmark = pytest.mark.slow

CRASH_AFTER_TOOL_STARTED = json.dumps([{"point": "after_tool_started"}])
DECIDE = "runtime.decide_approval"


@dataclass
class Interrupted:
    run_id: int
    approval_id: int
    heir: SpawnedWorker
    ledger: Ledger  # what the workers' `pay` tool wrote: the outside world's record


@pytest.fixture
def crashed(sqlite_path: Path, tmp_path: Path, spawn) -> Iterator[Callable[[], Interrupted]]:
    """A `payout` run whose worker was SIGKILLed right after recording the start of `pay`; a
    fresh worker (still running, so it executes whatever is decided) took it over and paused
    it on an ``interrupted_side_effect`` approval."""

    def make() -> Interrupted:
        run = start("payout", {"order": "A-1"})
        crasher = spawn("--lease-seconds", "2", "--poll-interval", "0.05", tag="crasher",
                        env={**AGENTS_ENV, "RUNTIME_CRASH_POINTS": CRASH_AFTER_TOOL_STARTED})
        assert crasher.wait(60) == -signal.SIGKILL, crasher.output()
        heir = spawn("--lease-seconds", "5", "--poll-interval", "0.1", tag="heir", env=AGENTS_ENV)
        approval = wait_until(
            lambda: Approval.objects.filter(run_id=run.pk, status="pending").first(),
            timeout=60, what="the takeover to ask for an approval")
        assert approval.kind == "interrupted_side_effect"
        ledger = Ledger(tmp_path / "ledger.jsonl")  # the workers' RUNTIME_TEST_DIR
        assert ledger.count("pay") == 0  # killed after the start's commit, before the call
        return Interrupted(run.pk, approval.pk, heir, ledger)

    with registry.override(*AGENTS):
        yield make


# -- scenarios -----------------------------------------------------------------------------------


def test_approve_from_the_keyboard_runs_the_tool_exactly_once_more(crashed, people, log_in):
    it = crashed()
    people("olga", DECIDE)
    page = log_in("olga")
    row = page.locator(f'tr[data-id="{it.approval_id}"]')
    expect(row).to_contain_text("payout")
    expect(row).to_contain_text("interrupted call")
    expect(page.get_by_test_id("pending-count")).to_have_text("1")
    shot(page, "queue.png")

    page.keyboard.press("j")
    expect(row).to_have_class("selected")
    with page.expect_response(lambda r: r.request.headers.get("hx-request") == "true"
                              and r.url.endswith("/")):
        pass  # the list's own 3-second poll replaces it...
    expect(page.locator(f'tr[data-id="{it.approval_id}"]')).to_have_class("selected")  # ...kept
    page.keyboard.press("o")
    expect(page).to_have_url(re.compile(rf"/approvals/{it.approval_id}/$"))
    expect(page.locator(".callout.warning")).to_contain_text(
        "stopped before its outcome was recorded, so whether it took effect is unknown")
    expect(page.get_by_test_id("arguments")).to_contain_text(RECIPIENT)  # shown as text...
    assert page.title() != "pwned"  # ...and never run
    shot(page, "approval.png")

    page.keyboard.press("a")  # opens the form; deciding still needs the box and the button
    expect(page.locator("#decide-approve")).to_have_attribute("open", "")
    page.keyboard.press("Enter")
    assert Approval.objects.get(pk=it.approval_id).status == "pending"
    page.check("#id_approve-confirm")
    page.locator("#decide-approve button[type=submit]").click()
    expect(page.get_by_test_id("outcome")).to_contain_text("by olga")
    expect(page.get_by_test_id("outcome")).to_contain_text("What happens next")

    run = wait_for_run(it.run_id, "succeeded")
    assert run.output == "paid"
    calls = it.ledger.calls("pay")
    assert len(calls) == 1 and calls[0]["to"] == RECIPIENT  # exactly once more, same request
    page.goto("/")
    expect(page.locator("#queue-list")).to_contain_text("Nothing waits for a decision")


def test_reject_fails_the_run_and_never_calls_the_tool(crashed, people, log_in):
    it = crashed()
    people("olga", DECIDE)
    page = log_in("olga")
    page.goto(f"/approvals/{it.approval_id}/")
    page.keyboard.press("r")
    page.fill("#id_reject-note", "the payee says it arrived twice before")
    page.check("#id_reject-confirm")
    page.locator("#decide-reject button[type=submit]").click()
    expect(page.get_by_test_id("outcome")).to_contain_text("will not be called again")
    run = wait_for_run(it.run_id, "failed")
    assert run.failure_code == "rejected"
    page.goto(f"/runs/{it.run_id}/")
    expect(page.get_by_test_id("failure-code")).to_have_text("rejected")
    assert it.ledger.count("pay") == 0


def test_resolve_validates_the_json_then_records_it_and_continues(crashed, people, log_in):
    it = crashed()
    people("olga", DECIDE)
    page = log_in("olga")
    page.goto(f"/approvals/{it.approval_id}/")
    page.keyboard.press("s")
    page.fill("#id_resolve-result", "{paid: 500")
    page.check("#id_resolve-confirm")
    page.locator("#decide-resolve button[type=submit]").click()
    expect(page.locator("#decide-resolve")).to_contain_text("Not valid JSON")
    assert Approval.objects.get(pk=it.approval_id).status == "pending"

    page.fill("#id_resolve-result", '{"paid": 500, "found": "bank statement"}')
    page.check("#id_resolve-confirm")
    page.locator("#decide-resolve button[type=submit]").click()
    expect(page.get_by_test_id("outcome")).to_contain_text("Recorded as happened")
    wait_for_run(it.run_id, "succeeded")
    step = Step.objects.get(run_id=it.run_id, index=1)
    assert step.result == {"paid": 500, "found": "bank statement"}
    assert Step.objects.get(run_id=it.run_id, index=2).tool == "check"  # it went on
    assert it.ledger.count("pay") == 0


def test_two_operators_race_one_wins_the_other_gets_409(crashed, people, log_in):
    it = crashed()
    people("olga", DECIDE)
    people("pat", DECIDE)
    olga, pat = log_in("olga"), log_in("pat")
    for page in (olga, pat):
        page.goto(f"/approvals/{it.approval_id}/")
    olga.keyboard.press("a")
    olga.check("#id_approve-confirm")
    pat.keyboard.press("r")
    pat.fill("#id_reject-note", "stop")
    pat.check("#id_reject-confirm")

    def is_post(response) -> bool:
        return response.request.method == "POST"

    with olga.expect_response(is_post) as first, pat.expect_response(is_post) as second:
        olga.locator("#decide-approve button[type=submit]").click(no_wait_after=True)
        pat.locator("#decide-reject button[type=submit]").click(no_wait_after=True)
    assert sorted([first.value.status, second.value.status]) == [200, 409]

    approval = Approval.objects.get(pk=it.approval_id)
    winner, loser = (olga, pat) if approval.decided_by == "olga" else (pat, olga)
    expect(winner.get_by_test_id("outcome")).to_contain_text(f"by {approval.decided_by}")
    expect(loser.get_by_test_id("conflict")).to_contain_text(
        f"already decided by {approval.decided_by} at")
    expect(loser.get_by_test_id("conflict")).to_contain_text("Nothing was changed")


def test_viewer_without_permission_sees_no_decision_controls(interrupted, people, log_in,
                                                             make_user):
    waiting = interrupted()  # an in-process crash and takeover; no worker needed to look
    people("victor")
    page = log_in("victor")
    page.goto(f"/approvals/{waiting.approval.pk}/")
    expect(page.get_by_test_id("no-permission")).to_be_visible()
    expect(page.locator("#decision-panel form")).to_have_count(0)
    expect(page.locator("#decision-panel button")).to_have_count(0)
    page.keyboard.press("a")
    expect(page.locator("details.decision")).to_have_count(0)

    forged = Client()
    forged.force_login(make_user("mallory"))
    response = forged.post(f"/approvals/{waiting.approval.pk}/",
                           {"decision": "approve", "approve-confirm": "on"})
    assert response.status_code == 403
    assert Approval.objects.get(pk=waiting.approval.pk).status == "pending"
