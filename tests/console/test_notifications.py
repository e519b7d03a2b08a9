"""The approval page says who was told about it: each channel, what about, and how delivery
went (the outbox itself is tested in tests/runtime/test_outbox.py)."""

from __future__ import annotations

import pytest

from runtime.clock import ManualClock
from runtime.models import Notification
from runtime.notifications.delivery import outbox_deliver_due


@pytest.fixture
def notified(settings):
    settings.RUNTIME = {**settings.RUNTIME, "NOTIFY": [
        {"name": "ops-hook", "kind": "webhook", "target": "http://127.0.0.1:9/hook"},
        {"name": "mail", "kind": "email", "target": "ops@example.com"}]}
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"


def test_the_approval_page_lists_who_was_told_and_how_delivery_went(notified, interrupted,
                                                                       operator, clock):
    waiting = interrupted()
    outbox_deliver_due(ManualClock(clock.now()))  # the mail goes out; the hook's port is shut
    page = operator.get(f"/approvals/{waiting.approval.pk}/").content.decode()
    assert page.count('data-testid="notification"') == 2
    assert "ops-hook" in page and "mail" in page and "ops@example.com" in page
    assert ">delivered<" in page and ">pending<" in page and "ConnectError" in page
    assert Notification.objects.filter(status="delivered").count() == 1


def test_without_channels_the_page_says_nobody_was_told(interrupted, operator):
    waiting = interrupted()
    page = operator.get(f"/approvals/{waiting.approval.pk}/").content.decode()
    assert "Nobody was notified" in page and 'data-testid="notification"' not in page
