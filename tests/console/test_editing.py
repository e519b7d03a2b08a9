"""Edit, then allow (console/approvals.py, console/forms.py, the JSON API's decide): the form is
built from the tool's argument schema, what the schema refuses is shown next to its field and
changes nothing, the run executes the edited request, and an interrupted call offers no edit.
What the tool did comes from the outside ledger."""

from __future__ import annotations

import json
import re
from html import unescape
from typing import Annotated, Literal

import pytest
from django import forms
from pydantic import Field

from runtime import Agent, Allow, FinalAnswer, RequireApproval, ScriptedLLM, ToolCall, resume, tool
from runtime.agents.agent import registry
from runtime.agents.tools import ToolContext
from runtime.loop.control import start
from runtime.models import Approval, Event
from tests.console.conftest import Waiting
from tests.console.test_api import DECIDER, call, decide_body, token_for  # noqa: F401 (fixture)
from tests.console.test_approvals import snapshot
from tests.kit import Ledger, verifyaudit

PROPOSED = {"account": "ACME-1", "amount": 900, "currency": "EUR", "rate": 1.5,
            "urgent": False, "tags": ["q4"]}


def make_transfer(ledger: Ledger, editable: bool = True):
    @tool(effect="side_effect", editable=editable)
    def transfer(ctx: ToolContext, account: str, amount: Annotated[int, Field(gt=0)],
                 currency: Literal["EUR", "USD"] = "EUR", rate: float = 1.0,
                 urgent: bool = False, tags: list[str] | None = None) -> dict:
        """Move money to an account."""
        ledger.record_call("transfer", ctx, account=account, amount=amount, currency=currency,
                           rate=rate, urgent=urgent, tags=tags)
        return {"moved": amount, "to": account}

    return transfer


def _agent(name: str, ledger: Ledger, editable: bool = True) -> Agent:
    def policy(request, run):
        return RequireApproval("Move money?", "Every transfer asks first.") \
            if request.tool == "transfer" else Allow()

    return Agent(name, ScriptedLLM([ToolCall("transfer", PROPOSED), FinalAnswer("ok")]),
                 [make_transfer(ledger, editable)], policy=policy)


@pytest.fixture
def transfer_paused(sqlite_path, tmp_path, clock):
    """Make runs paused by their policy before `transfer` starts; ``editable=False`` makes
    the tool forbid editing."""
    ledger = Ledger(tmp_path / "ledger")
    agents = [_agent("payer", ledger), _agent("strict", ledger, editable=False)]

    def make(agent: str = "payer") -> Waiting:
        run = resume(start(agent, {}, clock=clock).pk, clock=clock, lease_seconds=1)
        assert run.status == "waiting"
        return Waiting(run, Approval.objects.get(run_id=run.pk, status="pending"), ledger)

    with registry.override(*agents):
        yield make


def edit(client, approval: Approval, htmx: bool = False, **values):
    """Post the edit form with the proposed values, changed by ``values``."""
    data = {"decision": "approve", "edit": "1", "edit-confirm": "on",
            "edit-arg-account": PROPOSED["account"], "edit-arg-amount": str(PROPOSED["amount"]),
            "edit-arg-currency": json.dumps(PROPOSED["currency"]),
            "edit-arg-rate": str(PROPOSED["rate"]), "edit-arg-tags": json.dumps(PROPOSED["tags"])}
    for name, value in values.items():
        key = "edit-confirm" if name == "confirm" else f"edit-arg-{name}"
        if value is None:
            data.pop(key, None)
        else:
            data[key] = value
    extra = {"HTTP_HX_REQUEST": "true"} if htmx else {}
    return client.post(f"/approvals/{approval.pk}/", data, **extra)


def field_error(html: str, name: str) -> str:
    """The error shown in the paragraph of argument ``name`` ("" if none)."""
    found = re.search(rf'<p data-argument="{name}">(.*?)</p>', html, re.S)
    assert found, f"no field for {name}"
    error = re.search(r'data-field-error>([^<]*)<', found.group(1))
    return unescape(error.group(1)) if error else ""


def test_the_form_is_built_from_the_tools_schema(transfer_paused, operator):
    w = transfer_paused()
    page = operator.get(f"/approvals/{w.approval.pk}/")
    assert page.status_code == 200
    form = page.context["edit_form"]
    kinds = {name: type(f).__name__ for name, f in form.fields.items()}
    assert kinds == {"arg-account": "CharField", "arg-amount": "IntegerField",
                     "arg-currency": "ChoiceField", "arg-rate": "FloatField",
                     "arg-urgent": "BooleanField", "arg-tags": "CharField",
                     "note": "CharField", "confirm": "BooleanField"}
    assert isinstance(form.fields["arg-tags"].widget, forms.Textarea)  # JSON for the rest
    assert [c for c, _ in form.fields["arg-currency"].choices] == ["", '"EUR"', '"USD"']
    html = page.content.decode()
    assert 'data-testid="edit-form"' in html
    assert re.search(r'name="edit-arg-amount" value="900"', html)  # pre-filled
    assert re.search(r'name="edit-arg-account" value="ACME-1"', html)
    assert '<option value="&quot;EUR&quot;" selected>EUR</option>' in html
    assert "[\n  &quot;q4&quot;\n]" in html
    assert re.search(r'data-argument="amount">.*?\(required\)', html, re.S)
    assert re.search(r'data-argument="rate">.*?\(optional\)', html, re.S)


def test_allowing_an_edit_runs_the_edited_call_and_the_page_shows_the_diff(
        transfer_paused, operator, clock):
    w = transfer_paused()
    answer = edit(operator, w.approval, amount="90", account="ACME-2", urgent="on",
                  tags="[]", rate="")
    assert answer.status_code == 302
    a = Approval.objects.get(pk=w.approval.pk)
    assert a.status == "approved" and a.edited_by == "olga" and a.arguments == PROPOSED
    assert a.effective_arguments == {"account": "ACME-2", "amount": 90, "currency": "EUR",
                                     "urgent": True, "tags": []}  # an empty rate: its default
    run = resume(w.run.pk, clock=clock, lease_seconds=1)
    assert run.status == "succeeded"
    (call,) = w.ledger.calls("transfer")
    assert (call["account"], call["amount"], call["rate"], call["urgent"], call["tags"]) == (
        "ACME-2", 90, 1.0, True, [])

    html = unescape(operator.get(f"/approvals/{w.approval.pk}/").content.decode())
    assert 'data-testid="edit-form"' not in html
    assert "Edited by olga before it was allowed" in html
    assert "Allowed with arguments edited by olga" in html
    diff = re.search(r'data-testid="edit-diff">(.*?)</table>', html, re.S).group(1)
    rows = re.findall(r"<tr><td[^>]*><code>(\w+)</code></td>\s*<td[^>]*>(.*?)</td>\s*"
                      r"<td[^>]*>(.*?)</td></tr>", diff, re.S)
    cells = {name: (re.sub("<[^>]+>", "", was), re.sub("<[^>]+>", "", now))
             for name, was, now in rows}
    assert cells == {"account": ('"ACME-1"', '"ACME-2"'), "amount": ("900", "90"),
                     "rate": ("1.5", "left out"), "tags": ('["q4"]', "[]"),
                     "urgent": ("false", "true")}
    assert a.effective_digest in html and a.digest in html
    assert "problem" not in verifyaudit("--run", str(run.pk))


@pytest.mark.parametrize("values, field, message", [
    ({"amount": "0"}, "amount", "Input should be greater than 0."),  # the tool's schema
    ({"amount": "lots"}, "amount", "Enter a whole number."),  # the field's own shape
    ({"tags": "[1, 2"}, "tags", "Not valid JSON"),
    ({"tags": '"one"'}, "tags", "Input should be a valid list."),
    ({"account": ""}, "account", "This field is required."),
])
def test_an_edit_the_schema_refuses_shows_next_to_its_field_and_changes_nothing(
        transfer_paused, operator, values, field, message):
    w = transfer_paused()
    before = snapshot(w.run.pk)
    answer = edit(operator, w.approval, htmx=True, **values)
    assert answer.status_code == 422
    html = answer.content.decode()
    assert field_error(html, field).startswith(message)
    assert 'id="decide-edit" class="decision decision-edit" data-testid="edit-form"\n' \
           '                   open' in html  # the form stays open, with what was typed
    others = {"account", "amount", "currency", "rate", "urgent", "tags"} - {field}
    assert all(field_error(html, other) == "" for other in others)
    assert snapshot(w.run.pk) == before
    assert w.ledger.count("transfer") == 0


def test_an_unconfirmed_edit_changes_nothing(transfer_paused, operator):
    w = transfer_paused()
    before = snapshot(w.run.pk)
    answer = edit(operator, w.approval, confirm=None, amount="5")
    assert answer.status_code == 422 and "Tick the box to confirm." in answer.content.decode()
    assert snapshot(w.run.pk) == before


def test_interrupted_approvals_offer_no_edit(interrupted, operator):
    w = interrupted()
    page = operator.get(f"/approvals/{w.approval.pk}/")
    assert page.context["edit_form"] is None
    assert 'data-testid="edit-form"' not in page.content.decode()
    before = snapshot(w.run.pk)
    forged = operator.post(f"/approvals/{w.approval.pk}/", {
        "decision": "approve", "edit": "1", "edit-confirm": "on", "edit-arg-to": "x@y.z"})
    assert forged.status_code == 422
    assert "may already have happened as proposed" in unescape(forged.content.decode())
    assert snapshot(w.run.pk) == before


def test_a_tool_that_forbids_editing_says_so_and_offers_no_form(transfer_paused, operator):
    w = transfer_paused("strict")
    page = operator.get(f"/approvals/{w.approval.pk}/")
    html = unescape(page.content.decode())
    assert page.context["edit_form"] is None and 'data-testid="edit-form"' not in html
    assert "tool 'transfer' does not allow its arguments to be edited" in html
    before = snapshot(w.run.pk)
    assert edit(operator, w.approval, amount="5").status_code == 422
    assert snapshot(w.run.pk) == before


def test_who_may_not_decide_gets_no_edit_form(transfer_paused, viewer):
    w = transfer_paused()
    page = viewer.get(f"/approvals/{w.approval.pk}/")
    assert page.context["edit_form"] is None
    assert 'data-testid="edit-form"' not in page.content.decode()
    before = snapshot(w.run.pk)
    assert edit(viewer, w.approval, amount="5").status_code == 403
    assert snapshot(w.run.pk) == before


# -- the JSON API agrees -------------------------------------------------------------------------

class Api:
    """A program with a token that may decide (as the API's own tests make one)."""

    def __init__(self, token: str) -> None:
        self.token = token

    def get(self, path: str):
        return call("get", path, self.token)


@pytest.fixture
def api(token_for) -> Api:  # noqa: F811 (the API tests' fixture)
    return Api(token_for("ada", *DECIDER))


def _decide(client: Api, approval: Approval, **body):
    return call("post", f"/api/approvals/{approval.pk}/decide", client.token,
                json=decide_body(approval, **body))


def test_the_api_allows_an_edit_and_the_run_executes_it(transfer_paused, api, clock):
    w = transfer_paused()
    shown = api.get(f"/api/approvals/{w.approval.pk}").json()
    assert shown["editable"] is True and shown["edited_by"] is None
    answer = _decide(api, w.approval, arguments={**PROPOSED, "amount": 75})
    assert answer.status_code == 200, answer.content
    body = answer.json()
    assert body["arguments"] == PROPOSED and body["edited_by"] == "ada"
    assert body["effective_arguments"]["amount"] == 75 and body["effective_digest"]
    assert resume(w.run.pk, clock=clock, lease_seconds=1).status == "succeeded"
    assert [c["amount"] for c in w.ledger.calls("transfer")] == [75]
    (edited,) = Event.objects.filter(run_id=w.run.pk, kind="approval.edited")
    assert edited.payload["changes"] == [{"field": "amount", "from": 900, "to": 75}]


def test_the_api_names_the_fields_the_schema_refuses(transfer_paused, api):
    w = transfer_paused()
    before = snapshot(w.run.pk)
    answer = _decide(api, w.approval, arguments={"account": "A", "amount": 0, "bogus": 1})
    assert answer.status_code == 422
    body = answer.json()
    assert body["code"] == "invalid" and "schema" in body["message"]
    assert sorted(e["loc"][-1] for e in body["errors"]) == ["amount", "bogus"]
    assert all(e["loc"][:3] == ["body", "payload", "arguments"] for e in body["errors"])
    assert snapshot(w.run.pk) == before


def test_the_api_refuses_an_edit_of_an_interrupted_call(interrupted, api):
    w = interrupted()
    before = snapshot(w.run.pk)
    answer = _decide(api, w.approval, arguments={"to": "someone@example.com"})
    assert answer.status_code == 422 and answer.json()["code"] == "invalid"
    assert "may already have happened as proposed" in answer.json()["message"]
    assert api.get(f"/api/approvals/{w.approval.pk}").json()["editable"] is False
    assert snapshot(w.run.pk) == before


def test_the_form_follows_schema_references_and_optionals():
    """An Enum argument is a reference into ``$defs``; ``int | None`` is an ``anyOf`` with
    null: each still gets its own kind of field, and an empty optional is left out."""
    import enum

    import pydantic

    from console.forms import EditForm

    class Speed(enum.Enum):
        SLOW = "slow"
        FAST = "fast"

    model = pydantic.create_model("m", speed=(Speed, ...), limit=(int | None, None),
                                  extra=(dict[str, int], {}))
    schema = model.model_json_schema()
    form = EditForm({"edit-arg-speed": '"fast"', "edit-arg-limit": "", "edit-arg-extra": '{"a": 1}',
                     "edit-confirm": "on"}, schema=schema, proposed={"speed": "slow"})
    kinds = {k: type(f).__name__ for k, f in form.fields.items() if k.startswith("arg-")}
    assert kinds == {"arg-speed": "ChoiceField", "arg-limit": "IntegerField",
                     "arg-extra": "CharField"}
    assert form.fields["arg-speed"].required and not form.fields["arg-limit"].required
    assert form.is_valid(), form.errors
    assert form.arguments() == {"speed": "fast", "extra": {"a": 1}}
    model.model_validate(form.arguments())  # what the tool's own schema accepts
