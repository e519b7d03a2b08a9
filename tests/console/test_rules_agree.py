"""Each rule is written once, so the console, the JSON API and the runtime cannot disagree on
it: the decisions a page offers, the decisions the API lists and accepts and the decisions the
runtime carries out are one list (``runtime.approvals.rules``); a run's page offers to cancel
exactly the runs ``runtime.cancel`` cancels; the decision names are one enum everywhere."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.db import transaction
from django.test import Client
from django.utils import timezone
from ninja.openapi.schema import get_schema

from console.api import api as json_api
from console.forms import DECISION_FORMS
from console.models import ApiToken
from console.wording import POLICY_CHOICES, RERUN_CHOICES
from runtime import selectors
from runtime.approvals.decisions import approval_decide
from runtime.approvals.rules import Decision, approval_decisions, approval_past_deadline
from runtime.errors import AgentRuntimeError, RunNotResumable
from runtime.loop.control import cancel
from runtime.models import CANCELLABLE_RUN_STATUSES, Approval, Run, RunStatus
from runtime.testkit.operator import APPROVE, REJECT, resolve_with
from tests.console.conftest import client_for

DECIDER = ("runtime.view_run", "runtime.decide_approval", "runtime.cancel_run")


class _Undo(Exception):
    """Raised to roll a trial decision back."""


def runtime_accepts(approval: Approval, by: str) -> list[Decision]:
    """The decisions the runtime carries out on ``approval`` for ``by``: each tried in a
    transaction that is then rolled back."""
    accepted = []
    for decision in Decision:
        try:
            with transaction.atomic():
                approval_decide(approval.pk, decision, by, "a note", result={"sent": True})
                raise _Undo
        except _Undo:
            accepted.append(decision)
        except AgentRuntimeError:
            pass
    return accepted


def page_offers(client: Client, approval: Approval) -> list[str]:
    response = client.get(f"/approvals/{approval.pk}/")
    assert response.status_code == 200
    return [d["name"] for d in response.context["decisions"]]


def api_lists(token: str, approval: Approval) -> list[str]:
    response = Client().get(f"/api/approvals/{approval.pk}",
                            headers={"Authorization": f"Bearer {token}"})
    assert response.status_code == 200
    return response.json()["decisions"]


def _settle(approval: Approval) -> Approval:
    return Approval.objects.select_related("run", "step").get(pk=approval.pk)


def _as_is(approval: Approval) -> None:
    """The approval as it came."""


def _tampered(approval: Approval) -> None:
    Approval.objects.filter(pk=approval.pk).update(arguments={"to": "someone else"})


def _past_deadline(approval: Approval) -> None:
    Approval.objects.filter(pk=approval.pk).update(
        expires_at=timezone.now() - timedelta(seconds=1))


def _decided(approval: Approval) -> None:
    approval_decide(approval.pk, Decision.APPROVE, "someone-else")


CASES: dict[str, tuple[str, Callable[[Approval], None], bool]] = {
    # name: (kind of approval, what is done to it, four-eyes on and the person started it)
    "interrupted": ("interrupted", _as_is, False),
    "policy": ("policy", _as_is, False),
    "interrupted under four-eyes": ("interrupted", _as_is, True),
    "policy under four-eyes": ("policy", _as_is, True),
    "tampered": ("interrupted", _tampered, False),
    "past its deadline": ("interrupted", _past_deadline, False),
    "already decided": ("policy", _decided, False),
}


@pytest.mark.parametrize("case", CASES)
def test_page_api_and_runtime_agree_on_the_decisions(case, interrupted, policy_paused,
                                                      make_user, settings):
    kind, change, four_eyes = CASES[case]
    settings.RUNTIME = {**settings.RUNTIME, "FOUR_EYES": four_eyes}
    user = make_user("olga", *DECIDER)
    waiting = interrupted(created_by="olga") if kind == "interrupted" else policy_paused()
    if four_eyes and kind == "policy":  # the policy fixture's runs are started by nobody
        Run.objects.filter(pk=waiting.run.pk).update(created_by="olga")
    change(waiting.approval)
    approval = _settle(waiting.approval)
    token = ApiToken.issue(User.objects.get(username="olga"), "test")[1]

    ruled = approval_decisions(approval, "olga")
    assert page_offers(client_for(user), approval) == ruled
    assert api_lists(token, approval) == ruled
    assert runtime_accepts(approval, "olga") == ruled
    assert _settle(approval).status == approval.status  # every trial was rolled back


def test_a_decision_the_rules_refuse_is_refused_by_the_api_and_changes_nothing(
        policy_paused, make_user):
    make_user("olga", *DECIDER)
    token = ApiToken.issue(User.objects.get(username="olga"), "test")[1]
    approval = policy_paused().approval
    assert Decision.RESOLVE not in approval_decisions(_settle(approval), "olga")
    response = Client().post(f"/api/approvals/{approval.pk}/decide",
                             data={"decision": "resolve", "expected_digest": approval.digest,
                                   "result": 1},
                             content_type="application/json",
                             headers={"Authorization": f"Bearer {token}"})
    assert response.status_code == 422
    assert _settle(approval).status == "pending"


def test_the_decisions_are_one_enum_everywhere():
    schema = get_schema(json_api)
    decide = schema["components"]["schemas"]["DecideIn"]["properties"]["decision"]
    ref = decide.get("$ref", "").rsplit("/", 1)[-1]
    values = schema["components"]["schemas"][ref]["enum"] if ref else decide["enum"]
    assert values == [d.value for d in Decision]
    assert set(DECISION_FORMS) == set(Decision)
    assert set(POLICY_CHOICES) | set(RERUN_CHOICES) == set(Decision)
    assert {APPROVE.action, REJECT.action, resolve_with(1).action} == set(Decision)


def test_the_deadline_rule_is_one_function():
    assert selectors.approval_past_deadline is approval_past_deadline
    assert selectors.approval_decisions is approval_decisions


@pytest.mark.parametrize("status", list(RunStatus))
def test_page_and_runtime_agree_on_what_may_be_cancelled(status, policy_paused, make_user):
    user = make_user("olga", *DECIDER)
    run = policy_paused().run
    Run.objects.filter(pk=run.pk).update(status=status)
    run = selectors.run_for_page(run.pk)
    offered = client_for(user).get(f"/runs/{run.pk}/").context["can_cancel"]
    try:
        with transaction.atomic():
            cancel(run.pk, by="olga")
            raise _Undo
    except _Undo:
        accepted = True
    except RunNotResumable:
        accepted = False
    assert offered == accepted == selectors.run_cancellable(run) == (
        status in CANCELLABLE_RUN_STATUSES)
