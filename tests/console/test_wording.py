"""Each kind of approval in its own words: a policy approval is allowed or denied before a
first call; an interrupted call is run once more, recorded as having happened, or the run
ends. Buttons, confirmations, outcomes and 409 messages all follow the kind."""

from __future__ import annotations

import re
from html import unescape

from runtime import resume
from runtime.models import Approval
from tests.console.conftest import client_for
from tests.console.test_approvals import decide


def text(response) -> str:
    """The page as a person reads it: tags dropped, entities decoded, spaces collapsed."""
    return re.sub(r"\s+", " ", unescape(re.sub(r"<[^>]+>", " ", response.content.decode())))


def test_a_policy_approval_is_allowed_or_denied_never_re_run(policy_paused, operator):
    w = policy_paused()
    page = text(operator.get(f"/approvals/{w.approval.pk}/"))
    for words in ("Allow this call", "Yes: allow this call, once, with these arguments.",
                  "Deny", "Yes: deny this call and end the run.", "policy check",
                  "waiting for a decision", "Attempt 0 (not called yet)"):
        assert words in page, words
    for words in ("once more", "re-run", "It happened", "Outcome unknown", "consumed"):
        assert words not in page, words


def test_an_interrupted_call_is_run_once_more_recorded_or_ends_the_run(interrupted, operator):
    w = interrupted()
    page = text(operator.get(f"/approvals/{w.approval.pk}/"))
    for words in ("Run it once more", "Yes: run this exact request once more.",
                  "It happened: record the result", "Record the result",
                  "Yes: it happened; record this result and continue.", "End the run",
                  "Yes: end the run; do not call the tool again.", "interrupted call",
                  "Outcome unknown"):
        assert words in page, words
    for words in ("Allow this call", "Deny", "consumed"):
        assert words not in page, words


def test_the_details_say_what_happened_without_repeating_the_request(interrupted, operator):
    w = interrupted()
    detail = Approval.objects.get(pk=w.approval.pk).detail
    assert "stopped before its outcome was recorded" in detail
    step = w.approval.step
    assert step.idempotency_key not in detail and "Arguments" not in detail


def test_a_started_policy_call_reads_allowed_and_started_and_a_late_decision_says_so(
        policy_paused, operator, make_user, clock):
    w = policy_paused()
    assert decide(operator, w.approval, "approve").status_code == 302
    allowed = text(operator.get(f"/approvals/{w.approval.pk}/"))
    assert "Allowed, not started yet — decided by olga" in allowed
    assert "the next worker to claim it calls charge on step" in allowed.lower()
    resume(w.run.pk, clock=clock)  # a worker picks it up: the allowed call runs
    approval = Approval.objects.get(pk=w.approval.pk)
    assert approval.status == "consumed" and approval.consumed_at is not None
    started = text(operator.get(f"/approvals/{w.approval.pk}/"))
    assert f"Allowed, started at {approval.consumed_at:%Y-%m-%d %H:%M:%S} UTC" in started
    assert "consumed" not in started

    late = client_for(make_user("pat", "runtime.view_run", "runtime.decide_approval"))
    refused = decide(late, w.approval, "reject", note="too late")
    assert refused.status_code == 409
    message = text(refused)
    assert "This approval was already decided by olga at" in message
    assert "(allowed, started at" in message and "consumed" not in message
    assert "Nothing was changed" in message


def test_a_denied_policy_call_says_it_was_never_called(policy_paused, operator):
    w = policy_paused()
    decide(operator, w.approval, "reject", note="over budget")
    page = text(operator.get(f"/approvals/{w.approval.pk}/"))
    assert "Denied — decided by olga" in page
    assert "The run ended failed; charge was never called." in page
    assert w.ledger.count("charge") == 0


def test_an_interrupted_call_run_once_more_reads_so(interrupted, operator, clock):
    w = interrupted()
    decide(operator, w.approval, "approve")
    resume(w.run.pk, clock=clock)
    approval = Approval.objects.get(pk=w.approval.pk)
    page = text(operator.get(f"/approvals/{w.approval.pk}/"))
    assert (f"Approved, run once more at {approval.consumed_at:%Y-%m-%d %H:%M:%S} UTC"
            in page)
    assert "send was run once more at" in page
    run_page = text(operator.get(f"/runs/{w.run.pk}/"))
    approvals = run_page[run_page.index(" Approvals #"):run_page.index(" Steps ")]
    assert "approved, run once more at" in approvals and "consumed" not in approvals
