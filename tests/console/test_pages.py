"""Every console page, in every state its data can be in, renders without stray template text
(a ``{# #}`` spanning lines, a tag left open) and answers with the status it should."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.test import Client

from runtime import resume
from runtime.models import Approval
from tests.console.conftest import client_for
from tests.console.test_approvals import HTMX, decide

TEMPLATE_TEXT = ("{#", "#}", "{%", "%}")  # ({{ and }} can be JSON: {"a": {"b": 1}})


def walk(client: Client, url: str, status: int = 200, method: str = "get",
         **extra) -> Iterator[str]:
    """The full page and, for htmx, its fragment."""
    for headers in ({}, HTMX):
        response = getattr(client, method)(url, **{**extra, **headers})
        assert response.status_code in (status, 204), (url, headers, response.status_code)
        yield response.content.decode()


def clean(html: str, where: str) -> None:
    for text in TEMPLATE_TEXT:
        assert text not in html, f"{where}: {text!r} in the page"


@pytest.fixture
def every_state(interrupted, policy_paused, operator, make_user, clock) -> dict[str, list[str]]:
    """Approvals and runs in each state a person can meet them in."""
    other = client_for(make_user("pat", "runtime.view_run", "runtime.decide_approval",
                                 "runtime.cancel_run"))
    pending, policy = interrupted(), policy_paused()
    approved = interrupted()
    decide(operator, approved.approval, "approve")
    consumed_policy = policy_paused()
    decide(operator, consumed_policy.approval, "approve")
    resume(consumed_policy.run.pk, clock=clock)
    rerun = interrupted("refund")
    decide(operator, rerun.approval, "approve")
    resume(rerun.run.pk, clock=clock)
    resolved = interrupted()
    decide(other, resolved.approval, "resolve", result='{"paid": 1}')
    rejected, denied = interrupted(), policy_paused()
    decide(operator, rejected.approval, "reject", note="no")
    decide(operator, denied.approval, "reject", note="no")
    cancelled = interrupted()
    other.post(f"/runs/{cancelled.run.pk}/", {"confirm": "on"})
    statuses = set(Approval.objects.values_list("status", flat=True))
    assert statuses == {"pending", "approved", "consumed", "resolved", "rejected", "cancelled"}
    everything = [pending, policy, approved, consumed_policy, rerun, resolved, rejected, denied,
                  cancelled]
    return {
        "approvals": [f"/approvals/{w.approval.pk}/" for w in everything],
        "runs": [f"/runs/{w.run.pk}/" for w in everything],
        "pending": [f"/approvals/{pending.approval.pk}/", f"/approvals/{policy.approval.pk}/"],
        "decided": [f"/approvals/{rejected.approval.pk}/"],
    }


def test_no_console_page_in_any_state_shows_template_text(every_state, operator, viewer):
    urls = ["/", "/?kind=policy", "/?agent=pay", "/?agent=retired", "/runs/",
            "/runs/?status=failed", "/runs/?q=1", "/runs/?q=abc", "/runs/?before=3",
            "/runs/?after=1", "/workers/", "/pending-count/"]
    urls += every_state["approvals"] + every_state["runs"]
    for url in urls:
        for client in (operator, viewer):
            for html in walk(client, url):
                clean(html, url)
    for url, status in (("/?kind=bogus", 400), ("/runs/?status=bogus", 400),
                        ("/approvals/99999/", 404), ("/runs/99999/", 404)):
        for html in walk(operator, url, status):
            clean(html, url)


def test_refusals_and_errors_render_clean(every_state, operator, viewer):
    pending_url = every_state["pending"][0]
    decided_url = every_state["decided"][0]
    cases = [
        (operator, pending_url, {"decision": "approve"}, 422),  # the box not ticked
        (operator, pending_url, {"decision": "resolve", "resolve-result": "{bad",
                                 "resolve-confirm": "on"}, 422),
        (operator, decided_url, {"decision": "approve", "approve-confirm": "on"}, 409),
        (viewer, pending_url, {"decision": "approve", "approve-confirm": "on"}, 403),
    ]
    for client, url, data, status in cases:
        for html in walk(client, url, status, method="post", data=data):
            clean(html, f"POST {url} {data}")
    for html in walk(viewer, every_state["runs"][0], 403, method="post", data={"confirm": "on"}):
        clean(html, "POST cancel without permission")


def test_the_login_page_renders_clean(sqlite_path):
    response = Client().get("/login/")
    assert response.status_code == 200
    clean(response.content.decode(), "/login/")


def test_every_page_has_an_icon(sqlite_path, operator):
    page = operator.get("/").content.decode()
    assert '<link rel="icon" href="/static/console/favicon.svg"' in page
    response = Client().get("/favicon.ico")  # asked for by pages without the link, logged out
    assert response.status_code == 302 and response["Location"] == "/static/console/favicon.svg"
