"""Logging in and out, pages behind the login, health (console/views.py, middleware.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from django.test import Client

from tests.console.conftest import PASSWORD, sql_log
from tests.procs import ROOT

PAGES = ["/", "/pending-count/", "/approvals/1/", "/runs/", "/runs/1/", "/workers/"]


@pytest.mark.parametrize("url", PAGES)
def test_every_page_needs_a_login(sqlite_path, url):
    response = Client().get(url)
    assert response.status_code == 302
    assert response["Location"].startswith("/login/?next=")


def test_an_htmx_request_after_logout_is_a_401_that_redirects_the_whole_page(sqlite_path):
    """Never a 200: a program posting a decision as htmx must not read success into it."""
    for response in (Client().get("/", HTTP_HX_REQUEST="true"),
                     Client().post("/approvals/1/", {"decision": "approve"},
                                   HTTP_HX_REQUEST="true")):
        assert response.status_code == 401 and response["HX-Redirect"] == "/login/"
        assert response.content == b"Your session has ended: log in again.\n"


def test_healthz_and_login_page_are_public(sqlite_path):
    assert Client().get("/healthz").json()["database"] == "ok"
    page = Client().get("/login/")
    assert page.status_code == 200 and 'name="password"' in page.content.decode()


def test_log_in_then_out(make_user):
    make_user("lena", "runtime.view_run", password=PASSWORD)
    client = Client()
    bad = client.post("/login/", {"username": "lena", "password": "wrong"})
    assert bad.status_code == 200 and "Please enter a correct username" in bad.content.decode()
    response = client.post("/login/?next=/runs/", {"username": "lena", "password": PASSWORD,
                                                   "next": "/runs/"})
    assert response.status_code == 302 and response["Location"] == "/runs/"
    assert client.get("/").status_code == 200
    assert client.get("/logout/").status_code == 405  # logging out is a POST
    response = client.post("/logout/")
    assert response.status_code == 302 and response["Location"] == "/login/"
    assert client.get("/").status_code == 302


def test_nav_on_every_page_shows_the_pending_count_and_the_user(interrupted, operator):
    w = interrupted()
    for url in ("/", f"/approvals/{w.approval.pk}/", "/runs/", f"/runs/{w.run.pk}/",
                "/workers/"):
        html = operator.get(url).content.decode()
        assert 'data-testid="pending-count">1<' in html, url
        assert "olga" in html and 'action="/logout/"' in html
        assert 'hx-headers=\'{"X-CSRFToken": "' in html
        assert "/static/django_htmx/htmx-2.min.js" in html


def test_no_template_comment_shows_and_the_head_holds_its_parts(interrupted, operator):
    """A ``{# #}`` spanning lines is text to Django: it showed on every page and closed
    ``<head>`` early, moving the stylesheet and scripts into ``<body>``."""
    w = interrupted()
    pages = [Client().get("/login/")] + [operator.get(url) for url in (
        "/", f"/approvals/{w.approval.pk}/", "/runs/", f"/runs/{w.run.pk}/", "/workers/")]
    for page in pages:
        html = page.content.decode()
        assert "{#" not in html and "#}" not in html
        head, body = html.split("</head>", 1)
        assert 'rel="stylesheet"' in head and 'name="htmx-config"' in head
        assert "<title>" in head and "<title>" not in body


def test_console_js_and_css_are_served(operator):
    from pathlib import Path

    from django.contrib.staticfiles import finders

    js = finders.find("console/console.js")
    assert js and "openDecision" in Path(js).read_text()
    assert finders.find("console/console.css")


def test_runtime_never_imports_console():
    import ast
    from pathlib import Path

    import runtime

    for path in Path(runtime.__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            assert not any(n == "console" or n.startswith("console.") for n in names), path


def test_console_pages_write_no_runtime_table(interrupted, operator):
    w = interrupted()
    pages = ["/", "/pending-count/", f"/approvals/{w.approval.pk}/", "/runs/",
             f"/runs/{w.run.pk}/", "/workers/"]
    with sql_log() as statements:
        for url in pages:
            assert operator.get(url).status_code == 200
    writes = [s for s in statements if s.lstrip().upper().startswith(("INSERT", "UPDATE",
                                                                      "DELETE"))]
    assert not [s for s in writes if "runtime_" in s], writes


def test_the_secret_key_is_made_once_per_install_unless_given(tmp_path):
    def key(**env: str) -> str:
        code = ("import os, django; os.environ['DJANGO_SETTINGS_MODULE'] = 'console.settings'; "
                "django.setup(); from django.conf import settings; print(settings.SECRET_KEY)")
        environ = {k: v for k, v in os.environ.items() if k != "DJANGO_SECRET_KEY"}
        done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                              text=True, env={**environ, "RUNTIME_VAR_DIR": str(tmp_path), **env},
                              timeout=60, check=True)
        return done.stdout.strip()

    first, again = key(), key()
    assert first == again and len(first) >= 50
    assert (tmp_path / "secret_key").stat().st_mode & 0o777 == 0o600
    assert key(DJANGO_SECRET_KEY="from-the-environment") == "from-the-environment"
