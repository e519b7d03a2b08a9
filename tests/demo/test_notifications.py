"""The demo's ops chat: the webhook receiver the demo's workers send approval notifications to
(kept once per idempotency key, deliveries counted), and its page."""

from __future__ import annotations

import json

import pytest
from django.test import Client

from demo import world
from runtime.crashpoints import CrashPoint
from tests.demo.test_views import interrupted_refund, operator  # noqa: F401 - fixtures

HOOK = "/demo/notifications/hook/"


def body(key: str = "approval-7-approval.requested-webhook", **extra) -> str:
    return json.dumps({"event": "approval.requested", "idempotency_key": key,
                       "link": "http://127.0.0.1:8000/approvals/7/",
                       "approval": {"id": 7, "title": "Refund 249.00 EUR?"}, **extra})


def test_the_hook_keeps_each_notification_once_and_counts_repeats(operator):  # noqa: F811
    anonymous = Client(enforce_csrf_checks=True)  # a webhook has no session and no CSRF token
    first = anonymous.post(HOOK, body(), content_type="application/json")
    again = anonymous.post(HOOK, body(), content_type="application/json")
    assert (first.status_code, first.content, again.content) == (200, b"kept\n",
                                                                 b"repeat dropped\n")
    (row,) = world.notifications_received()
    assert (row["approval_id"], row["deliveries"], row["event"]) == (7, 2, "approval.requested")
    page = operator.get("/demo/notifications/").content.decode()
    assert page.count('data-testid="received-row"') == 1 and 'href="/approvals/7/"' in page


@pytest.mark.parametrize("payload,status", [
    ("not json", 400), ("[1, 2]", 400), (json.dumps({"event": "x"}), 400),
    ("[" * 100 + "]" * 100, 400), (json.dumps({"idempotency_key": "k", "pad": "x" * 70_000}), 413),
])
def test_the_hook_refuses_what_is_not_a_notification(operator, payload, status):  # noqa: F811
    response = Client().post(HOOK, payload, content_type="application/json")
    assert response.status_code == status and world.notifications_received() == []


def test_the_chat_page_needs_the_view_permission(sqlite_path, settings):
    from django.contrib.auth.models import User

    settings.STORAGES = {**settings.STORAGES, "staticfiles": {
        "BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"}}
    client = Client()
    client.force_login(User.objects.create_user("nobody"))
    assert client.get("/demo/notifications/").status_code == 403
    assert Client().get(HOOK).status_code in (302, 405)


def test_an_interrupted_refund_is_announced_to_the_chat(operator, tmp_path, settings):  # noqa: F811
    from runtime.models import Notification

    settings.RUNTIME = {**settings.RUNTIME, "NOTIFY": [
        {"name": "webhook", "kind": "webhook", "target": "http://127.0.0.1:8000" + HOOK}]}
    approval = interrupted_refund(tmp_path, CrashPoint.AFTER_TOOL_EFFECT)
    n = Notification.objects.get(approval_id=approval.pk)
    # What the worker would POST, handed to the receiver as it arrives over HTTP.
    assert operator.post(HOOK, json.dumps(n.body), content_type="application/json").content \
        == b"kept\n"
    (row,) = world.notifications_received()
    assert row["approval_id"] == approval.pk and row["link"].endswith(f"/approvals/{approval.pk}/")
