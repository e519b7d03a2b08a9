"""Reading needs a permission (runs hold customers' data), the two groups a migration makes
give what their names say, and an approval whose stored request no longer matches its digest
says so and can only be rejected."""

from __future__ import annotations

from django.contrib.auth.models import Group, User
from django.test import Client

from runtime.models import Approval, Event, Run
from tests.console.conftest import XSS
from tests.console.test_approvals import HTMX, decide, snapshot


def pages(w) -> list[str]:
    return ["/", "/pending-count/", f"/approvals/{w.approval.pk}/", "/runs/",
            f"/runs/{w.run.pk}/", "/workers/", "/demo/world/"]


def test_without_view_run_no_page_shows_anything_of_a_run(interrupted, stranger):
    w = interrupted()
    for url in pages(w):
        for extra in ({}, HTMX):
            response = stranger.get(url, **extra)
            html = response.content.decode()
            assert response.status_code == 403, url
            assert XSS not in html and "&lt;script&gt;" not in html, url
            assert "needs the view_run permission" in html or extra, url
    home = stranger.get("/").content.decode()
    assert 'href="/runs/"' not in home and "pending-count" not in home  # no nav into it
    before = snapshot(w.run.pk)
    assert decide(stranger, w.approval, "reject", note="x").status_code == 403
    assert stranger.post(f"/runs/{w.run.pk}/", {"confirm": "on"}).status_code == 403
    assert snapshot(w.run.pk) == before


def test_the_viewers_and_operators_groups(interrupted):
    w = interrupted()
    viewers, operators = Group.objects.get(name="viewers"), Group.objects.get(name="operators")
    vera, otto = User.objects.create_user("vera"), User.objects.create_user("otto")
    vera.groups.add(viewers)
    otto.groups.add(operators)
    as_vera, as_otto = Client(), Client()
    as_vera.force_login(vera)
    as_otto.force_login(otto)
    for url in pages(w):
        assert as_vera.get(url).status_code == 200, url
        assert as_otto.get(url).status_code == 200, url
    assert 'id="decide-' not in as_vera.get(f"/approvals/{w.approval.pk}/").content.decode()
    assert decide(as_vera, w.approval, "approve").status_code == 403
    assert decide(as_otto, w.approval, "approve").status_code == 302
    assert Approval.objects.get(pk=w.approval.pk).decided_by == "otto"


def test_an_approval_whose_stored_request_was_changed_can_only_be_rejected(interrupted,
                                                                          operator):
    w = interrupted()
    # Someone with write access to the database shows a harmless request; the step (what
    # would run, and what the digest is checked against) still holds the real one.
    Approval.objects.filter(pk=w.approval.pk).update(arguments={"to": "nobody@example.com"})
    html = operator.get(f"/approvals/{w.approval.pk}/").content.decode()
    assert 'data-testid="tampered"' in html and "does not match its digest" in html
    assert 'id="decide-reject"' in html
    assert 'id="decide-approve"' not in html and 'id="decide-resolve"' not in html
    before = snapshot(w.run.pk)
    for decision, fields in (("approve", {}), ("resolve", {"result": '{"sent": true}'})):
        refused = decide(operator, w.approval, decision, **fields)
        assert refused.status_code == 409, decision
        assert "does not match its digest" in refused.content.decode()
    assert snapshot(w.run.pk) == before
    assert decide(operator, w.approval, "reject", note="tampered").status_code == 302
    assert Run.objects.get(pk=w.run.pk).status == "failed"
    assert Event.objects.filter(run_id=w.run.pk, kind="approval.rejected").count() == 1
