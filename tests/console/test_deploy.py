"""The documented production environment (docs/operations/production.md): `check
--deploy` finds nothing to warn about; behind a TLS proxy the console redirects to HTTPS, sends
HSTS, accepts a form POST, and throttles logins by the address the proxy saw; the demo is
mounted only where the demo runs or in development (issue 15, finding 9)."""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.console.browser import _free_port
from tests.console.conftest import PASSWORD
from tests.procs import ROOT
from tests.waiting import wait_until

HOST = "console.example.com"
STAMP = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}"  # logging's asctime
# The documented production environment, less DJANGO_SECRET_KEY (made per test run) and
# DATABASE_URL (SQLite under RUNTIME_VAR_DIR here).
PRODUCTION_ENV = {
    "DJANGO_ALLOWED_HOSTS": HOST,
    "DJANGO_SECURE_COOKIES": "1",
    "DJANGO_SSL_REDIRECT": "1",
    "DJANGO_HSTS_SECONDS": "31536000",
    "DJANGO_HSTS_INCLUDE_SUBDOMAINS": "1",
    "DJANGO_HSTS_PRELOAD": "1",
    "DJANGO_PROXY_SSL_HEADER": "X-Forwarded-Proto",
    "DJANGO_PROXY_COUNT": "1",
    "DJANGO_CSRF_TRUSTED_ORIGINS": f"https://{HOST}",
}
# What this test process has that a production machine would not.
NOT_IN_PRODUCTION = ("DJANGO_", "CONSOLE_", "RUNTIME_DEMO", "DJANGO_ALLOW_ASYNC_UNSAFE")


def environment(var: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(NOT_IN_PRODUCTION)}
    env.update(RUNTIME_VAR_DIR=str(var), PYTHONUNBUFFERED="1", **extra)
    return env


def production(var: Path, **extra: str) -> dict[str, str]:
    return environment(var, DJANGO_SECRET_KEY=secrets.token_urlsafe(50), **PRODUCTION_ENV,
                       **extra)


def manage(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


# -- check --deploy -----------------------------------------------------------------------------


def test_check_deploy_with_the_documented_production_environment_finds_nothing(tmp_path):
    done = manage(production(tmp_path), "check", "--deploy", "--fail-level", "WARNING")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "System check identified no issues (0 silenced)." in done.stdout, done.stdout
    assert "WARNINGS" not in done.stdout + done.stderr


def test_check_deploy_without_it_names_what_is_missing(tmp_path):
    done = manage(environment(tmp_path), "check", "--deploy")
    found = set(re.findall(r"security\.W\d+", done.stdout + done.stderr))
    assert {"security.W004", "security.W008", "security.W012", "security.W016"} <= found


# -- the demo -----------------------------------------------------------------------------------

PROBE = """
import json, django
django.setup()
from django.conf import settings
from django.urls import Resolver404, resolve
try:
    resolve("/demo/world/")
    mounted = True
except Resolver404:
    mounted = False
print(json.dumps({"mounted": mounted, "check_url": settings.CONSOLE_CHECK_URL}))
"""


def demo_probe(env: dict[str, str]) -> dict:
    env = {**env, "DJANGO_SETTINGS_MODULE": "console.settings"}
    done = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_production_serves_no_demo_and_links_to_no_demo_world(tmp_path):
    assert demo_probe(production(tmp_path)) == {"mounted": False, "check_url": ""}


@pytest.mark.parametrize("switch", [{"RUNTIME_DEMO": "1"}, {"DJANGO_DEBUG": "1"}],
                         ids=["RUNTIME_DEMO (set by the demo command)", "DJANGO_DEBUG"])
def test_the_demo_is_mounted_where_the_demo_runs_or_in_development(tmp_path, switch):
    assert demo_probe(environment(tmp_path, **switch)) == {
        "mounted": True, "check_url": "/demo/world/?key={key}"}


def test_the_test_suite_serves_the_demo(settings):
    """pyproject's pytest env sets RUNTIME_DEMO=1 for the demo's tests (and their servers)."""
    assert settings.CONSOLE_DEMO and os.environ["RUNTIME_DEMO"] == "1"


# -- behind a TLS proxy, for real ---------------------------------------------------------------


@dataclass
class Proxied:
    url: str
    log: Path  # gunicorn's output: the console's stderr

    def logged(self, pattern: str) -> bool:
        return re.search(pattern, self.log.read_text(), re.M) is not None


@pytest.fixture
def behind_proxy(sqlite_path: Path, static_root: Path, tmp_path: Path) -> Iterator[Proxied]:
    """gunicorn on loopback with the production environment, on this test's database; the
    test plays the TLS proxy (Host, X-Forwarded-Proto, X-Forwarded-For)."""
    url = f"http://127.0.0.1:{_free_port()}"
    env = production(static_root, DATABASE_URL=f"sqlite:///{sqlite_path}",
                     CONSOLE_LOGIN_FAILURE_LIMIT="3")
    log = tmp_path / "gunicorn.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "console.wsgi", "-b", url[7:], "--workers", "1",
             "--threads", "4", "--graceful-timeout", "2"],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True)
    try:
        def up() -> bool:
            assert proc.poll() is None, log.read_text()
            try:
                return httpx.get(f"{url}/healthz", headers={"Host": HOST}).status_code == 200
            except httpx.TransportError:
                return False

        wait_until(up, timeout=30, what="gunicorn to answer /healthz")
        yield Proxied(url, log)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


class Browser:
    """A browser behind the TLS proxy, as the console sees it: the proxy sends on the browser's
    host, says https, and appends the address it saw to X-Forwarded-For. Cookies are kept by
    hand: they are Secure, and this leg of the trip is plain HTTP."""

    def __init__(self, url: str, client_address: str = "203.0.113.7") -> None:
        self.http = httpx.Client(base_url=url, headers={
            "Host": HOST, "X-Forwarded-Proto": "https", "X-Forwarded-For": client_address})
        self.cookies: dict[str, str] = {}

    def request(self, method: str, path: str, **kw) -> httpx.Response:
        headers = {**kw.pop("headers", {}),
                   "Cookie": "; ".join(f"{k}={v}" for k, v in self.cookies.items())}
        response = self.http.request(method, path, headers=headers, **kw)
        self.cookies.update(response.cookies.items())
        return response

    def get(self, path: str) -> httpx.Response:
        return self.request("GET", path)

    def log_in(self, username: str, password: str) -> httpx.Response:
        page = self.get("/login/")
        assert page.status_code == 200, page.text
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text)[1]
        return self.request(
            "POST", "/login/", data={"csrfmiddlewaretoken": token, "username": username,
                                     "password": password},
            headers={"Origin": f"https://{HOST}", "Referer": f"https://{HOST}/login/"})

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.http.close()


def test_behind_a_tls_proxy_https_is_enforced_and_a_login_post_is_accepted(behind_proxy,
                                                                            make_user):
    make_user("olga", "runtime.view_run", password=PASSWORD)
    url = behind_proxy.url
    plain = httpx.get(f"{url}/runs/", headers={"Host": HOST})
    assert plain.status_code == 301 and plain.headers["Location"] == f"https://{HOST}/runs/"
    health = httpx.get(f"{url}/healthz", headers={"Host": HOST})  # the load balancer's probe
    assert health.status_code == 200 and health.json() == {"database": "ok"}

    with Browser(url) as browser:
        page = browser.get("/login/")
        assert page.headers["Strict-Transport-Security"] == \
            "max-age=31536000; includeSubDomains; preload"
        assert "default-src 'self'" in page.headers["Content-Security-Policy"]
        assert "camera=()" in page.headers["Permissions-Policy"]
        assert "secure" in page.headers["Set-Cookie"].lower()  # the CSRF cookie

        response = browser.log_in("olga", PASSWORD)
        assert response.status_code == 302, response.text  # not a CSRF 403
        assert response.headers["Location"] == "/"
        session = next(c for c in response.headers.get_list("Set-Cookie")
                       if c.startswith("sessionid="))
        assert "Secure" in session and "HttpOnly" in session  # and it ends with the browser:
        assert "expires" not in session.lower() and "max-age" not in session.lower()
        assert browser.get("/runs/").status_code == 200

    with Browser(url) as forger:  # no CSRF token: refused, and logged with a timestamp
        forged = forger.request("POST", "/logout/", headers={"Origin": f"https://{HOST}"})
        assert forged.status_code == 403
    wait_until(lambda: behind_proxy.logged(
        rf"^{STAMP} WARNING django\.security\.csrf Forbidden \(CSRF"), timeout=10,
        what="the CSRF failure in the log")


def test_behind_a_tls_proxy_logins_are_throttled_by_the_address_the_proxy_saw(behind_proxy,
                                                                              make_user):
    make_user("olga", "runtime.view_run", password=PASSWORD)
    url = behind_proxy.url
    with Browser(url, "203.0.113.7") as attacker:
        for n in range(3):  # CONSOLE_LOGIN_FAILURE_LIMIT=3 for this server
            response = attacker.log_in(f"guess{n}", "wrong")
        assert response.status_code == 429 and "Too many failed logins" in response.text
    # Whatever the attacker writes into X-Forwarded-For, the proxy appends what it saw.
    with Browser(url, "198.51.100.1, 203.0.113.7") as spoofing:
        assert spoofing.log_in("olga", PASSWORD).status_code == 429
    # Everyone else behind the same proxy (same socket address) still logs in.
    with Browser(url, "198.51.100.20") as colleague:
        assert colleague.log_in("olga", PASSWORD).status_code == 302
    # Production's log (stderr) has each failure and the lockout, with the address and time.
    for pattern in (
            rf"^{STAMP} WARNING axes\S* AXES: New login failure by .*guess0.*203\.0\.113\.7",
            rf"^{STAMP} WARNING axes\S* AXES: Locking out .*203\.0\.113\.7",
            rf"^{STAMP} WARNING django\.request Too Many Requests: /login/"):
        wait_until(lambda p=pattern: behind_proxy.logged(p), timeout=10, what=pattern)
