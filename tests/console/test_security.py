"""The console's defences (issue 15): login throttling and lockout on both login pages, the
password rules, sessions that end, what /healthz tells strangers, the security headers and a
Content-Security-Policy that allows nothing inline (checked in the markup and in a real
browser), and log records for failed logins, CSRF failures and refusals."""

from __future__ import annotations

import json
import logging
import re
import time
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.contrib.auth.password_validation import validate_password
from django.contrib.sessions.models import Session
from django.core.exceptions import ValidationError
from django.test import Client, RequestFactory
from django.utils import timezone
from playwright.sync_api import expect

from console.middleware import LAST_SEEN, client_ip
from console.permissions import VIEW
from tests.console.conftest import PASSWORD, client_for
from tests.console.test_approvals import HTMX

FAST_HASHER = ["django.contrib.auth.hashers.MD5PasswordHasher"]
LOGIN_PAGES = ["/login/", "/admin/login/"]


@pytest.fixture
def fast_hashing(settings) -> None:
    """Many failed logins, each of which hashes a password: a cheap hasher keeps them quick."""
    settings.PASSWORD_HASHERS = FAST_HASHER


@pytest.fixture
def lena(make_user, fast_hashing) -> User:
    return make_user("lena", password=PASSWORD, staff=True)


def attempt(client: Client, page: str, username: str, password: str, **extra):
    return client.post(page, {"username": username, "password": password}, **extra)


def logged_in(client: Client) -> bool:
    return "_auth_user_id" in client.session


# -- logins: throttling and lockout ----------------------------------------------------------------


@pytest.mark.parametrize("page", LOGIN_PAGES)
def test_failed_logins_lock_out_even_the_right_password_on_both_login_pages(lena, settings,
                                                                           page):
    """Finding 3: 40 wrong passwords, then the right one, logged in. Now the fifth failure
    shows the lockout page (429, a readable message) and the right password is refused too."""
    client = Client()
    for _ in range(settings.AXES_FAILURE_LIMIT - 1):
        response = attempt(client, page, "lena", "wrong guess")
        assert response.status_code == 200  # the form again, with its error
    locked = attempt(client, page, "lena", "wrong guess")
    assert locked.status_code == 429
    html = locked.content.decode()
    assert "Too many failed logins" in html and "15 minutes" in html
    assert "Traceback" not in html and 'href="/login/"' in html

    refused = attempt(client, page, "lena", PASSWORD)
    assert refused.status_code == 429
    assert not logged_in(client)


def test_the_lockout_ends_after_the_cool_off(lena, settings):
    from axes.models import AccessAttempt

    client = Client()
    for _ in range(settings.AXES_FAILURE_LIMIT):
        attempt(client, "/login/", "lena", "wrong guess")
    assert attempt(client, "/login/", "lena", PASSWORD).status_code == 429
    AccessAttempt.objects.update(
        attempt_time=timezone.now() - settings.AXES_COOLOFF_TIME - timedelta(seconds=1))
    response = attempt(client, "/login/", "lena", PASSWORD)
    assert response.status_code == 302 and logged_in(client)


def test_a_success_before_the_limit_starts_the_count_again(lena, settings):
    client = Client()
    for _ in range(settings.AXES_FAILURE_LIMIT - 1):
        attempt(client, "/login/", "lena", "wrong guess")
    assert attempt(client, "/login/", "lena", PASSWORD).status_code == 302
    client.post("/logout/")
    for _ in range(settings.AXES_FAILURE_LIMIT - 1):
        assert attempt(client, "/login/", "lena", "wrong guess").status_code == 200
    assert attempt(client, "/login/", "lena", PASSWORD).status_code == 302


def test_one_address_trying_many_usernames_is_locked_out(lena, settings):
    client = Client()
    for n in range(settings.AXES_FAILURE_LIMIT):
        attempt(client, "/login/", f"guess{n}", "wrong guess")
    assert attempt(client, "/login/", "lena", PASSWORD).status_code == 429
    other = Client(REMOTE_ADDR="198.51.100.9")  # another address is not
    assert attempt(other, "/login/", "lena", PASSWORD).status_code == 302


def test_one_username_tried_from_many_addresses_is_locked_out(lena, settings):
    for n in range(settings.AXES_FAILURE_LIMIT):
        attempt(Client(REMOTE_ADDR=f"198.51.100.{n + 1}"), "/login/", "lena", "wrong guess")
    assert attempt(Client(REMOTE_ADDR="198.51.100.99"), "/login/", "lena",
                   PASSWORD).status_code == 429


def test_without_a_configured_proxy_x_forwarded_for_is_ignored(lena, settings):
    """A client that invents a new X-Forwarded-For on every attempt is still one address."""
    settings.CONSOLE_PROXY_COUNT = 0
    client = Client()
    for n in range(settings.AXES_FAILURE_LIMIT):
        attempt(client, "/login/", f"guess{n}", "x", HTTP_X_FORWARDED_FOR=f"203.0.113.{n}")
    assert attempt(client, "/login/", "lena", PASSWORD,
                   HTTP_X_FORWARDED_FOR="203.0.113.200").status_code == 429


def test_client_ip_trusts_only_the_entries_the_configured_proxies_appended(settings):
    factory = RequestFactory()

    def ip(forwarded: str | None, remote: str = "10.0.0.5") -> str:
        extra = {"REMOTE_ADDR": remote}
        if forwarded is not None:
            extra["HTTP_X_FORWARDED_FOR"] = forwarded
        return client_ip(factory.get("/", **extra))

    settings.CONSOLE_PROXY_COUNT = 0
    assert ip("203.0.113.7") == "10.0.0.5"
    settings.CONSOLE_PROXY_COUNT = 1
    assert ip("203.0.113.7") == "203.0.113.7"
    assert ip("1.2.3.4, 203.0.113.7") == "203.0.113.7"  # the client wrote the left part
    assert ip(None) == "10.0.0.5"  # not through the proxy (a health check)
    assert ip("not-an-address") == "10.0.0.5"
    assert ip("2001:db8::1") == "2001:db8::1"
    settings.CONSOLE_PROXY_COUNT = 2  # e.g. a CDN, then nginx
    assert ip("1.2.3.4, 203.0.113.7, 198.51.100.1") == "203.0.113.7"
    assert ip("198.51.100.1") == "10.0.0.5"


def test_force_login_still_works_next_to_the_lockout_backend(make_user):
    assert client_for(make_user("fiona", VIEW)).get("/runs/").status_code == 200


# -- passwords ----------------------------------------------------------------------------------


@pytest.mark.parametrize("password", ["password", "short", "12345678901234", "lena.lovelace"])
def test_weak_passwords_are_refused(sqlite_path, password):
    user = User(username="lena.lovelace", email="lena.lovelace@example.com")
    with pytest.raises(ValidationError):
        validate_password(password, user)


def test_a_strong_password_passes(sqlite_path):
    validate_password(PASSWORD, User(username="lena"))


def test_the_admin_refuses_a_user_with_the_password_password(make_user):
    admin = client_for(make_user("root", superuser=True))
    response = admin.post("/admin/auth/user/add/", {
        "username": "newbie", "usable_password": "true",
        "password1": "password", "password2": "password"})
    assert response.status_code == 200
    assert "This password is too common" in response.content.decode()
    assert not User.objects.filter(username="newbie").exists()


# -- sessions -----------------------------------------------------------------------------------


def test_the_session_cookie_ends_with_the_browser(lena):
    response = attempt(Client(), "/login/", "lena", PASSWORD)
    cookie = response.cookies["sessionid"]
    assert cookie["expires"] == "" and cookie["max-age"] == ""
    assert cookie["httponly"]


def test_an_idle_session_ends_and_the_next_request_goes_to_the_login_page(make_user, settings):
    client = client_for(make_user("ida", VIEW))
    assert client.get("/").status_code == 200
    session = client.session
    session[LAST_SEEN] = int(time.time()) - settings.CONSOLE_SESSION_IDLE_SECONDS - 1
    session.save()
    response = client.get("/")
    assert response.status_code == 302 and response["Location"].startswith("/login/")
    assert not logged_in(client)


def test_an_idle_session_ends_on_the_next_poll_too(make_user, settings):
    client = client_for(make_user("ida", VIEW))
    client.get("/")
    session = client.session
    session[LAST_SEEN] = int(time.time()) - settings.CONSOLE_SESSION_IDLE_SECONDS - 1
    session.save()
    poll = client.get("/pending-count/", HTTP_HX_TRIGGER="nav-pending",
                      HTTP_HX_TARGET="nav-pending", **HTMX)
    assert poll.status_code == 401 and poll["HX-Redirect"] == "/login/"


def test_polls_do_not_keep_a_session_alive_but_the_persons_requests_do(make_user, settings):
    client = client_for(make_user("ida", VIEW))
    client.get("/")
    earlier = int(time.time()) - 600
    session = client.session
    session[LAST_SEEN] = earlier
    session.save()
    for trigger in ("queue-list", "nav-pending"):
        assert client.get("/", HTTP_HX_TRIGGER=trigger, HTTP_HX_TARGET=trigger,
                          **HTMX).status_code in (200, 204)
    assert client.session[LAST_SEEN] == earlier
    before, since = int(time.time()), timezone.now().replace(microsecond=0)
    client.get("/runs/", HTTP_HX_TARGET="run-list", **HTMX)  # a filter: the person's own
    after = timezone.now()
    assert before <= client.session[LAST_SEEN] <= int(time.time())
    # ...and the session row's expiry moved with it: idle seconds from that request.
    expiry = Session.objects.get(session_key=client.session.session_key).expire_date
    idle = timedelta(seconds=settings.CONSOLE_SESSION_IDLE_SECONDS)
    assert since + idle <= expiry <= after + idle


# -- /healthz -----------------------------------------------------------------------------------


def test_healthz_tells_anonymous_callers_only_that_the_database_answers(sqlite_path):
    assert Client().get("/healthz").json() == {"database": "ok"}


def test_healthz_gives_staff_the_durability_settings(make_user):
    body = client_for(make_user("sam", staff=True)).get("/healthz").json()
    assert body == {"database": "ok", "journal_mode": "wal", "synchronous": 2}
    assert client_for(make_user("victor")).get("/healthz").json() == {"database": "ok"}


# -- headers and markup -------------------------------------------------------------------------


def csp_of(response) -> dict[str, list[str]]:
    directives = {}
    for part in response["Content-Security-Policy"].split(";"):
        name, *values = part.split()
        directives[name] = values
    return directives


INLINE = [
    (re.compile(r"<script(?![^>]*\bsrc=)[^>]*>", re.I), "an inline <script>"),
    (re.compile(r"<[a-z][^>]*\sstyle\s*=", re.I), "a style= attribute"),
    (re.compile(r"<[a-z][^>]*\son[a-z]+\s*=", re.I), "an on...= handler"),
    (re.compile(r"<style", re.I), "a <style> element"),
    (re.compile(r"javascript:", re.I), "a javascript: URL"),
]


def pages(interrupted, make_user) -> list[tuple[str, Client]]:
    w = interrupted()
    root = client_for(make_user("root", "runtime.decide_approval", superuser=True))
    urls = ["/", f"/approvals/{w.approval.pk}/", "/runs/", f"/runs/{w.run.pk}/", "/workers/",
            "/workers/?show=old", "/demo/world/", "/admin/", "/admin/runtime/event/",
            f"/admin/runtime/run/{w.run.pk}/change/", "/admin/auth/user/add/",
            "/admin/auth/user/", "/admin/password_change/", "/admin/axes/accessattempt/",
            "/admin/auth/group/add/"]
    return [(url, root) for url in urls] + [(url, Client()) for url in ("/login/",
                                                                       "/admin/login/")]


def test_every_page_sends_a_strict_csp_and_a_permissions_policy(interrupted, make_user):
    for url, client in pages(interrupted, make_user):
        response = client.get(url)
        assert response.status_code == 200, url
        csp = csp_of(response)
        assert csp["default-src"] == ["'self'"], url
        assert csp["script-src"] == ["'self'"] and csp["style-src"] == ["'self'"], url
        assert csp["object-src"] == ["'none'"] and csp["frame-ancestors"] == ["'none'"]
        assert "unsafe" not in response["Content-Security-Policy"]
        policy = response["Permissions-Policy"]
        for feature in ("camera", "microphone", "geolocation", "payment", "usb"):
            assert f"{feature}=()" in policy, (url, feature)


def test_no_page_has_inline_script_style_or_handlers(interrupted, make_user):
    """What the policy would block, found in the markup: the browser test below finds the
    rest (what scripts do at run time)."""
    for url, client in pages(interrupted, make_user):
        html = client.get(url).content.decode()
        for pattern, what in INLINE:
            found = pattern.search(html)
            assert found is None, f"{url} has {what}: {found and found.group(0)}"


def test_the_lockout_page_and_errors_carry_the_headers_too(lena, settings):
    client = Client()
    for _ in range(settings.AXES_FAILURE_LIMIT):
        response = attempt(client, "/login/", "lena", "wrong")
    assert response.status_code == 429 and "'self'" in response["Content-Security-Policy"]
    missing = client_for(lena).get("/no-such-page/")
    assert missing.status_code == 404 and "Permissions-Policy" in missing


def test_htmx_is_told_not_to_eval_or_inject_styles(operator):
    html = operator.get("/").content.decode()
    config = json.loads(re.search(r"<meta name=\"htmx-config\" content='([^']*)'>", html)[1])
    assert config["allowEval"] is False
    assert config["includeIndicatorStyles"] is False
    assert config["allowScriptTags"] is False
    assert config["historyCacheSize"] == 0  # as before


# -- logging ------------------------------------------------------------------------------------


def test_a_failed_login_is_logged_with_the_username_and_address(lena, caplog):
    with caplog.at_level(logging.WARNING):
        attempt(Client(REMOTE_ADDR="198.51.100.7"), "/login/", "lena", "wrong")
    records = [r for r in caplog.records if r.name.startswith("axes")]
    assert records, caplog.text
    assert any("lena" in r.getMessage() and "198.51.100.7" in r.getMessage()
               and r.levelno == logging.WARNING for r in records), caplog.text
    assert "wrong" not in caplog.text  # never the password


def test_a_lockout_is_logged(lena, settings, caplog):
    with caplog.at_level(logging.WARNING):
        for _ in range(settings.AXES_FAILURE_LIMIT):
            attempt(Client(), "/login/", "lena", "wrong guess")
    assert "Locking out" in caplog.text and "lena" in caplog.text


def test_a_csrf_failure_is_logged(sqlite_path, caplog):
    with caplog.at_level(logging.WARNING):
        response = Client(enforce_csrf_checks=True).post("/login/", {"username": "x",
                                                                     "password": "y"})
    assert response.status_code == 403
    csrf = [r for r in caplog.records if r.name == "django.security.csrf"]
    assert csrf and "CSRF" in csrf[0].getMessage() and csrf[0].levelno == logging.WARNING


def test_a_forbidden_decision_is_logged(interrupted, make_user, caplog):
    w = interrupted()
    forged = client_for(make_user("mallory"))
    with caplog.at_level(logging.WARNING):
        response = forged.post(f"/approvals/{w.approval.pk}/",
                               {"decision": "approve", "approve-confirm": "on"})
    assert response.status_code == 403
    assert any(r.name == "django.request" and r.levelno == logging.WARNING
               and "Forbidden" in r.getMessage() for r in caplog.records), caplog.text


def test_in_production_django_logs_reach_stderr(settings):
    """Django's own default sends errors by mail to ADMINS when DEBUG is off (nobody): here
    the django loggers propagate to the root logger's stderr handler, with a timestamp."""
    root = logging.getLogger()
    streams = [h for h in root.handlers if type(h) is logging.StreamHandler]
    assert streams and streams[0].formatter._fmt.startswith("%(asctime)s")
    for name in ("django.request", "django.security.csrf", "django.security.DisallowedHost",
                 "axes.handlers.database"):
        logger = logging.getLogger(name)
        assert logger.isEnabledFor(logging.WARNING), name
        while logger.propagate and logger.parent is not None and not logger.handlers:
            logger = logger.parent
        assert logger is root, (name, logger)


# -- the strict CSP in a real browser -----------------------------------------------------------

CSP_PROBE = """
document.addEventListener("securitypolicyviolation", (e) => {
  window.reportViolation([e.violatedDirective, e.blockedURI, e.sourceFile, e.lineNumber,
                          document.location.pathname].join(" "));
});
"""


@pytest.mark.slow
def test_the_console_and_the_admin_run_under_the_csp_without_a_violation(
        interrupted, make_user, log_in):
    """The queue (keyboard), an approval decided through htmx (its live poll after), a run
    page, admin pages (including the add-user form's scripts) and the lockout page: no
    violation event, no console error, and everything still works."""
    waiting = interrupted()
    make_user("root", "runtime.decide_approval", superuser=True, password=PASSWORD)
    page = log_in("root")
    violations: list[str] = []
    errors: list[str] = []
    page.context.expose_binding("reportViolation", lambda source, text: violations.append(text))
    page.context.add_init_script(CSP_PROBE)
    page.on("console", lambda m: errors.append(f"{m.type}: {m.text}")
            if m.type in ("error", "warning") else None)
    page.on("pageerror", lambda e: errors.append(f"pageerror: {e}"))

    page.goto("/")
    row = page.locator(f'tr[data-id="{waiting.approval.pk}"]')
    expect(row).to_be_visible()
    page.keyboard.press("j")
    expect(row).to_have_class("selected")
    page.keyboard.press("o")  # console.js, under the policy
    expect(page).to_have_url(re.compile(rf"/approvals/{waiting.approval.pk}/$"))

    page.keyboard.press("a")
    expect(page.locator("#decide-approve")).to_have_attribute("open", "")
    page.check("#id_approve-confirm")
    with page.expect_response(lambda r: r.request.method == "POST"
                              and r.request.headers.get("hx-request") == "true") as posted:
        page.locator("#decide-approve button[type=submit]").click()
    assert posted.value.status == 200
    expect(page.get_by_test_id("outcome")).to_contain_text("by root")
    expect(page.get_by_test_id("pending-count")).to_have_text("0")  # the nav's htmx swap
    with page.expect_request(lambda r: "seen=" in r.url, timeout=10_000) as poll:
        pass  # the open approval's own poll, which the idle timeout must tell from a person
    headers = poll.value.headers
    assert headers["hx-trigger"] == headers["hx-target"] == "approval-live"

    page.goto(f"/runs/{waiting.run.pk}/")
    expect(page.get_by_test_id("run-status")).to_be_visible()
    page.goto("/runs/")
    page.select_option("select[name=status]", "waiting")  # the htmx filter
    expect(page).to_have_url(re.compile(r"status=waiting"))
    for url in ("/admin/", "/admin/runtime/event/", f"/admin/runtime/run/{waiting.run.pk}/change/",
                "/admin/axes/accessattempt/", "/admin/auth/user/add/"):
        page.goto(url)
        expect(page.locator("#console-nav")).to_be_visible()
    page.locator("#id_username").fill("someone-new")  # the add-user form's own scripts
    page.locator("#logout-form button").click()
    expect(page).to_have_url(re.compile(r"/login/$"))

    page.goto("/admin/login/")
    for _ in range(5):  # the lockout page, last: it locks this address out
        page.fill("#id_username", "root")
        page.fill("#id_password", "wrong guess")
        page.click("[type=submit]")
    expect(page.get_by_test_id("locked-out")).to_contain_text("refused")
    page.wait_for_timeout(500)  # Playwright delivers events only while it is called
    errors.remove("error: Failed to load resource: the server responded with a status of 429 "
                  "(Too Many Requests)")  # the lockout page's own status

    assert violations == [], violations
    assert errors == [], sorted(set(errors))
    # The probe works: an inline style is refused and reported.
    page.evaluate("document.body.setAttribute('style', 'color: red')")
    page.wait_for_timeout(500)
    assert len(violations) == 1 and violations[0].startswith("style-src-attr"), violations
