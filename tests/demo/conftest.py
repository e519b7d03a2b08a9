"""Fixtures for the demo's tests; the browser fixtures are the console's."""

from __future__ import annotations

import pytest
from django.conf import settings
from django.db import connections

# The console's browser fixtures, as its conftest gathers them (importing tests.console.browser
# first would import it twice over: it and that conftest import each other).
from tests.console.conftest import browser, log_in, server, static_root  # noqa: F401


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
