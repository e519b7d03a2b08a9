"""Four-eyes (settings RUNTIME["FOUR_EYES"]): whoever started a run may not approve or resolve its
side effect. Enforced in runtime.approvals.decisions, so the console cannot bypass it; the console
shows why, with 403."""

from __future__ import annotations

import pytest

from runtime.approvals.decisions import approve, reject, resolve
from runtime.errors import FourEyesViolation
from runtime.models import Approval, Run
from tests.console.conftest import client_for


@pytest.fixture
def four_eyes(settings):
    settings.RUNTIME = {**settings.RUNTIME, "FOUR_EYES": True}


def test_runtime_refuses_the_starter_and_changes_nothing(four_eyes, interrupted):
    w = interrupted(created_by="sam")
    for decide in (lambda: approve(w.approval.pk, by="sam"),
                   lambda: resolve(w.approval.pk, by="sam", result={"sent": True})):
        with pytest.raises(FourEyesViolation) as info:
            decide()
        assert (info.value.approval_id, info.value.run_id, info.value.user) == (
            w.approval.pk, w.run.pk, "sam")
    assert Approval.objects.get(pk=w.approval.pk).status == "pending"
    assert Run.objects.get(pk=w.run.pk).status == "waiting"
    assert approve(w.approval.pk, by="someone-else").status == "approved"


def test_the_starter_may_still_reject(four_eyes, interrupted):
    w = interrupted(created_by="sam")
    assert reject(w.approval.pk, by="sam", note="I started it by mistake").status == "rejected"


def test_off_by_default(interrupted):
    w = interrupted(created_by="sam")
    assert approve(w.approval.pk, by="sam").status == "approved"


def test_console_hides_approve_and_resolve_and_answers_403(four_eyes, interrupted, make_user):
    w = interrupted(created_by="sam")
    sam = client_for(make_user("sam", "runtime.view_run", "runtime.decide_approval"))
    html = sam.get(f"/approvals/{w.approval.pk}/").content.decode()
    assert 'data-testid="four-eyes"' in html
    assert 'id="decide-approve"' not in html and 'id="decide-resolve"' not in html
    assert 'id="decide-reject"' in html
    response = sam.post(f"/approvals/{w.approval.pk}/",
                        {"decision": "approve", "approve-confirm": "on"})
    assert response.status_code == 403
    assert "so someone else must approve or resolve" in response.content.decode()
    assert Approval.objects.get(pk=w.approval.pk).status == "pending"
    other = client_for(make_user("tia", "runtime.view_run", "runtime.decide_approval"))
    assert 'id="decide-approve"' in other.get(f"/approvals/{w.approval.pk}/").content.decode()
