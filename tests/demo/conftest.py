"""Fixtures for the demo's tests; the browser fixtures are the console's."""

from __future__ import annotations

import pytest
from django.conf import settings
from django.db import connections

from tests.console.test_browser import browser, static_root  # noqa: F401 - shared fixtures


@pytest.fixture
def demo_db(tmp_path, monkeypatch, django_db_blocker):
    """This test process reads the demo's own database file and outside world."""
    monkeypatch.setenv("RUNTIME_DEMO_DIR", str(tmp_path / "world"))
    conf = settings.DATABASES["default"]
    original = conf["NAME"]
    with django_db_blocker.unblock():
        connections.close_all()
        conf["NAME"] = str(tmp_path / "runtime.sqlite3")
        try:
            yield tmp_path
        finally:
            connections.close_all()
            conf["NAME"] = original
