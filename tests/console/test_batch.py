"""Deciding several approvals at once from the queue (console/batch.py) and the JSON API
(POST /api/approvals/decide): both give the same answer for the same situation, refuse the
whole batch naming each refused approval, and check the permission. Also the queue's
deadline and effect columns."""

from __future__ import annotations

import re
from html import unescape

import pytest
from django.test import Client
from django.utils import timezone

from console.models import ApiToken
from runtime.approvals.decisions import approve
from runtime.models import Approval, Event
from tests.console.conftest import client_for
from tests.kit import snapshot

HTMX = {"HTTP_HX_REQUEST": "true"}
DECIDER = ("runtime.view_run", "runtime.decide_approval")


def pick(a: Approval, digest: str | None = None) -> str:
    return f"{a.pk}.{digest if digest is not None else a.digest}"


def post_batch(client: Client, approvals: list[Approval], decision: str = "approve",
               note: str = "", confirm: bool = True, digests: dict[int, str] | None = None,
               **extra):
    data = {"decision": decision, "note": note,
            "pick": [pick(a, (digests or {}).get(a.pk)) for a in approvals]}
    if confirm:
        data["confirm"] = "on"
    return client.post("/approvals/decide/", data, **HTMX, **extra)


def api_batch(token: str, approvals: list[Approval], decision: str = "approve", note: str = "",
              digests: dict[int, str] | None = None, **headers: str):
    body = {"decision": decision, "note": note,
            "approvals": [{"id": a.pk, "digest": (digests or {}).get(a.pk, a.digest)}
                          for a in approvals]}
    return Client().post("/api/approvals/decide", body, content_type="application/json",
                         headers={"Authorization": f"Bearer {token}", **headers})


def refused_on_page(response) -> dict[int, str]:
    html = response.content.decode()
    return {int(pk): code for pk, code in
            re.findall(r'data-testid="batch-refused" data-id="(\d+)" data-code="([a-z_]+)"', html)}


def statuses(approvals: list[Approval]) -> list[str]:
    return [Approval.objects.get(pk=a.pk).status for a in approvals]


def decisions(a: Approval) -> list[tuple[str, str]]:
    return list(Event.objects.filter(run_id=a.run_id, kind__in=(
        "approval.granted", "approval.rejected")).values_list("kind", "actor"))


@pytest.fixture
def token(make_user):
    def make(username: str, *perms: str) -> str:
        from django.contrib.auth.models import User

        user = User.objects.filter(username=username).first() or make_user(username, *perms)
        return ApiToken.issue(user, "test")[1]

    return make


# -- the queue -----------------------------------------------------------------------------


def test_deciders_get_a_box_per_row_and_the_bar_viewers_do_not(interrupted, policy_paused,
                                                                operator, viewer):
    rerun, policy = interrupted(), policy_paused()
    html = operator.get("/").content.decode()
    for a in (rerun.approval, policy.approval):
        assert f'name="pick" value="{a.pk}.{a.digest}"' in html
        assert f"Select approval #{a.pk}:" in html  # each box has its label
    assert 'data-testid="batch-bar"' in html and "data-pick-all" in html
    # the buttons in the words of the kinds listed
    assert ">Allow / Run it once more</button>" in html
    assert ">Deny / End the runs</button>" in html
    page = viewer.get("/").content.decode()
    assert 'name="pick"' not in page and 'data-testid="batch-bar"' not in page


def test_the_queue_shows_each_deadline_and_effect_in_words(interrupted, policy_paused, operator,
                                                           settings, clock):
    clock.advance((timezone.now() - clock.now()).total_seconds())  # the console's "now"
    settings.RUNTIME = {**settings.RUNTIME, "APPROVAL_EXPIRES_SECONDS": {"pay": 720,
                                                                        "refund": 1800}}
    soon, later, policy = interrupted("pay"), interrupted("refund"), policy_paused()
    html = operator.get("/").content.decode()

    def row(a: Approval) -> str:
        return html[html.index(f'data-id="{a.pk}"'):].split("</tr>")[0]

    assert re.search(r'urgency urgency-urgent">.*expires in .*1[12]m \d+s', row(soon.approval))
    assert re.search(r'urgency urgency-near">.*expires in .*(29|30)m \d+s', row(later.approval))
    assert "no deadline" in row(policy.approval)
    assert 'data-label="Expires"' in row(soon.approval)  # labelled on a phone's card too
    assert "changes things outside; may already have happened" in row(soon.approval)
    assert "changes things outside; not run yet" in row(policy.approval)


def test_a_batch_from_the_queue_decides_every_ticked_one(interrupted, policy_paused, operator):
    rerun, policy, untouched = interrupted(), policy_paused(), interrupted("refund")
    response = post_batch(operator, [rerun.approval, policy.approval], note="checked both")
    assert response.status_code == 200, response.content
    html = unescape(response.content.decode())
    assert html.lstrip().startswith('<div id="queue-list"')  # the list, re-rendered
    assert "2 approvals decided" in html and response["HX-Trigger"] == "pending-changed"
    assert statuses([rerun.approval, policy.approval, untouched.approval]) == [
        "approved", "approved", "pending"]
    assert decisions(rerun.approval) == [("approval.granted", "olga")]
    assert f'data-id="{untouched.approval.pk}"' in html  # still listed
    assert f'data-id="{rerun.approval.pk}" data-href' not in html  # decided: gone


def test_without_javascript_a_batch_that_went_through_redirects_to_the_queue(
        interrupted, operator):
    """A plain form post (no htmx) that decided is answered with a redirect to the queue, its
    filters kept, so reloading sends nothing again; the outcome is a message there. A refused
    one is answered in place (there is nothing to send twice)."""
    first, second, third = interrupted(), interrupted(), interrupted()
    data = {"decision": "approve", "confirm": "on", "kind": "interrupted_side_effect",
            "pick": [pick(first.approval), pick(second.approval)]}
    response = operator.post("/approvals/decide/", data)
    assert response.status_code == 302
    assert response["Location"] == "/?kind=interrupted_side_effect"
    queue = unescape(operator.get(response["Location"]).content.decode())
    assert (f"2 approvals decided (#{first.approval.pk}, #{second.approval.pk}): allowed or "
            "queued to run once more.") in queue
    assert statuses([first.approval, second.approval, third.approval]) == [
        "approved", "approved", "pending"]
    again = operator.post("/approvals/decide/", data)  # the browser's "send again"
    assert again.status_code == 409 and "Nothing was decided" in again.content.decode()
    assert decisions(first.approval) == [("approval.granted", "olga")]


def test_a_refused_batch_decides_nothing_and_lists_which_and_why(interrupted, operator):
    a, b, c = interrupted(), interrupted(), interrupted()
    approve(b.approval.pk, "bob")
    before = [snapshot(w.run.pk) for w in (a, c)]
    response = post_batch(operator, [a.approval, b.approval, c.approval], note="go")
    assert response.status_code == 409
    assert refused_on_page(response) == {b.approval.pk: "already_decided"}
    html = unescape(response.content.decode())
    assert "Nothing was decided." in html and "1 of the 3 approvals cannot be decided" in html
    assert "This approval was already decided by bob at " in html and " UTC (approved" in html
    assert f'href="/approvals/{b.approval.pk}/"' in html  # the refused one, linked
    assert [snapshot(w.run.pk) for w in (a, c)] == before
    # the boxes not refused stay ticked for another try; the refused one is not offered
    assert f'value="{pick(a.approval)}" data-pick data-testid="pick-{a.approval.pk}" checked' \
        in html


def test_ending_runs_needs_a_note_and_every_batch_a_confirmation(interrupted, operator):
    a = interrupted()
    before = snapshot(a.run.pk)
    no_note = post_batch(operator, [a.approval], "reject")
    assert no_note.status_code == 422 and "needs a note" in unescape(no_note.content.decode())
    unconfirmed = post_batch(operator, [a.approval], confirm=False)
    assert unconfirmed.status_code == 422 and "Tick the box" in unconfirmed.content.decode()
    nothing = post_batch(operator, [])
    assert nothing.status_code == 422 and "at least one" in nothing.content.decode()
    resolve = post_batch(operator, [a.approval], "resolve")
    assert resolve.status_code == 422 and "one at a time" in resolve.content.decode()
    nul = post_batch(operator, [a.approval], "reject", note="no\x00")
    assert nul.status_code == 422 and "NUL" in unescape(nul.content.decode())
    assert snapshot(a.run.pk) == before


def test_deciding_a_batch_needs_the_permission_and_the_csrf_token(interrupted, viewer, stranger,
                                                                   make_user):
    a = interrupted()
    before = snapshot(a.run.pk)
    assert post_batch(viewer, [a.approval]).status_code == 403
    assert post_batch(stranger, [a.approval]).status_code == 403
    checked = Client(enforce_csrf_checks=True)
    checked.force_login(make_user("cora", *DECIDER))
    assert post_batch(checked, [a.approval]).status_code == 403
    assert checked.get("/approvals/decide/").status_code == 405
    assert snapshot(a.run.pk) == before


# -- the console and the API agree ---------------------------------------------------------


SITUATIONS = ["fine", "decided_meanwhile", "stale", "four_eyes", "four_eyes_reject"]


@pytest.mark.parametrize("situation", SITUATIONS)
def test_the_console_and_the_api_give_the_same_answer(situation, interrupted, make_user, token,
                                                      settings):
    settings.RUNTIME = {**settings.RUNTIME, "FOUR_EYES": True}
    olga = make_user("olga", *DECIDER)
    api_token = token("olga")
    answers = []
    for via in ("console", "api"):
        batch = [interrupted(created_by="olga" if situation.startswith("four_eyes") and i == 1
                             else "").approval for i in range(3)]
        digests: dict[int, str] = {}
        if situation == "decided_meanwhile":
            approve(batch[2].pk, "bob")
        if situation == "stale":
            digests[batch[0].pk] = "f" * 64
        decision, note = ("reject", "no") if situation == "four_eyes_reject" else ("approve", "")
        if via == "console":
            response = post_batch(client_for(olga), batch, decision, note, digests=digests)
            refused = refused_on_page(response)
        else:
            response = api_batch(api_token, batch, decision, note, digests=digests)
            refused = {i["id"]: i["code"] for i in response.json().get("items", [])
                       if "code" in i}
        answers.append((response.status_code,
                        {batch.index(next(a for a in batch if a.pk == pk)): code
                         for pk, code in refused.items()},
                        statuses(batch)))
    console, api = answers
    assert console == api, answers
    expected = {"fine": (200, {}), "decided_meanwhile": (409, {2: "already_decided"}),
                "stale": (409, {0: "stale"}), "four_eyes": (403, {1: "forbidden"}),
                "four_eyes_reject": (200, {})}[situation]
    assert console[:2] == expected


def test_the_api_answers_a_batch_with_every_decided_approval(interrupted, token):
    a, b = interrupted(), interrupted()
    response = api_batch(token("ann", *DECIDER), [a.approval, b.approval], "reject", "no")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["decided"] == 2
    assert [(i["id"], i["status"], i["decided_by"], i["note"]) for i in body["items"]] == [
        (a.approval.pk, "rejected", "ann", "no"), (b.approval.pk, "rejected", "ann", "no")]


def test_the_api_refusal_names_each_item_and_changes_nothing(interrupted, token):
    a, b = interrupted(), interrupted()
    approve(a.approval.pk, "bob")
    before = snapshot(b.run.pk)
    response = api_batch(token("ann", *DECIDER), [a.approval, b.approval])
    assert response.status_code == 409
    body = response.json()
    assert body["code"] == "already_decided" and "nothing was decided" in body["message"]
    (item,) = body["items"]
    assert (item["id"], item["code"]) == (a.approval.pk, "already_decided")
    assert "already decided by bob at " in item["message"]
    assert snapshot(b.run.pk) == before


def test_the_api_checks_the_permission_the_body_and_replays_an_idempotent_batch(
        interrupted, token):
    a = interrupted()
    before = snapshot(a.run.pk)
    assert api_batch(token("vic", "runtime.view_run"), [a.approval]).status_code == 403
    decider = token("ann", *DECIDER)
    resolve = api_batch(decider, [a.approval], "resolve")
    assert resolve.status_code == 422 and "one approval at a time" in resolve.json()["message"]
    too_many = Client().post("/api/approvals/decide", {"decision": "approve", "approvals": [
        {"id": i, "digest": "a"} for i in range(101)]}, content_type="application/json",
        headers={"Authorization": f"Bearer {decider}"})
    assert too_many.status_code == 422 and too_many.json()["code"] == "invalid"
    assert snapshot(a.run.pk) == before
    first = api_batch(decider, [a.approval], **{"Idempotency-Key": "k1"})
    again = api_batch(decider, [a.approval], **{"Idempotency-Key": "k1"})
    assert first.status_code == again.status_code == 200
    assert again["Idempotent-Replayed"] == "true" and again.json() == first.json()
    assert decisions(a.approval) == [("approval.granted", "ann")]


@pytest.mark.parametrize("bad", ["\u00b2.abc", "\u0661.abc", "1.", ".abc", "x1.abc"])
def test_a_pick_that_is_not_an_id_is_refused_clearly(interrupted, operator, bad):
    """Only ASCII digits name an approval: "²" passes ``str.isdigit`` but not ``int``, and
    an Arabic-Indic one would quietly name approval 1."""
    a = interrupted()
    before = snapshot(a.run.pk)
    response = operator.post("/approvals/decide/", {"decision": "approve", "confirm": "on",
                                                    "pick": [bad, pick(a.approval)]}, **HTMX)
    assert response.status_code == 422
    assert "was not understood" in response.content.decode()
    assert snapshot(a.run.pk) == before
