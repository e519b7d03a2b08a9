"""The browser fixtures of the console's tests: Playwright driving Debian's chromium against
the real app served by gunicorn on loopback (its own process group, ended by its pid), and
people who log in through the login form."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Browser, BrowserContext, Page, expect, sync_playwright

from runtime.models import Run
from tests.console.conftest import PASSWORD
from tests.procs import ROOT
from tests.waiting import wait_until

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--headless", "--disable-gpu", "--disable-background-networking"]
SCREENSHOTS = ROOT / "test-output" / "screenshots"
AGENTS_ENV = {"RUNTIME_AGENTS": "tests.console.agents.AGENTS"}
DESKTOP = {"width": 1280, "height": 900}
PHONE = {"width": 390, "height": 844}


@pytest.fixture(scope="module")
def static_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``collectstatic`` once, as a deployment does: gunicorn serves the manifest files."""
    var = tmp_path_factory.mktemp("var")
    subprocess.run([sys.executable, "manage.py", "collectstatic", "--noinput", "-v", "0"],
                   cwd=ROOT, env={**os.environ, "RUNTIME_VAR_DIR": str(var)}, check=True,
                   timeout=120)
    return var


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    assert Path(CHROMIUM).exists(), "chromium is missing: apt-get install -y chromium"
    # Playwright's sync API runs an event loop on this thread; the test's own ORM reads are
    # plain synchronous calls between browser actions, so Django's guard is lifted here.
    with pytest.MonkeyPatch.context() as mp, sync_playwright() as playwright:
        mp.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """gunicorn serving console.wsgi on loopback against the test's database file."""

    def __init__(self, db: Path, test_dir: Path, static_var: Path) -> None:
        self.url = f"http://127.0.0.1:{_free_port()}"
        env = {k: v for k, v in os.environ.items() if k != "DJANGO_ALLOW_ASYNC_UNSAFE"}
        env.update(DATABASE_URL=f"sqlite:///{db}", RUNTIME_VAR_DIR=str(static_var),
                   RUNTIME_TEST_DIR=str(test_dir), PYTHONUNBUFFERED="1", **AGENTS_ENV)
        self.log_path = test_dir / "gunicorn.log"
        self._log = open(self.log_path, "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "console.wsgi", "-b", self.url[7:],
             "--workers", "2", "--threads", "4", "--graceful-timeout", "2"],
            cwd=ROOT, env=env, stdout=self._log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True)
        self._ready = False

    def ready(self) -> str:
        if not self._ready:
            wait_until(self._healthy, timeout=30, what="gunicorn to answer /healthz")
            self._ready = True
        return self.url

    def _healthy(self) -> bool:
        assert self.proc.poll() is None, self.log_path.read_text()
        try:
            return httpx.get(f"{self.url}/healthz", timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    def stop(self) -> None:
        """End gunicorn's process group (master and its workers), by the master's pid."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self._log.close()


@pytest.fixture
def server(sqlite_path: Path, tmp_path: Path, static_root: Path) -> Iterator[Server]:
    """Started at once, waited for on first use, so it boots while the workers crash."""
    srv = Server(sqlite_path, tmp_path, static_root)
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture
def people(make_user) -> Callable[..., str]:
    def make(username: str, *perms: str) -> str:
        make_user(username, "runtime.view_run", *perms, password=PASSWORD)
        return username

    return make


@pytest.fixture
def log_in(browser: Browser, server: Server) -> Iterator[Callable[[str], Page]]:
    """A fresh browser context per person, logged in through the login form."""
    contexts: list[BrowserContext] = []

    def open_as(username: str, viewport: dict[str, int] = DESKTOP) -> Page:
        context = browser.new_context(base_url=server.ready(), viewport=viewport)
        context.set_default_timeout(15_000)
        contexts.append(context)
        page = context.new_page()
        page.goto("/")
        expect(page).to_have_url(f"{server.url}/login/?next=/")
        page.fill("#id_username", username)
        page.fill("#id_password", PASSWORD)
        page.click("button[type=submit]")
        expect(page.locator("header .who")).to_contain_text(username)
        return page

    yield open_as
    for context in contexts:
        context.close()


def wait_for_run(run_id: int, status: str) -> Run:
    return wait_until(lambda: Run.objects.filter(pk=run_id, status=status).first(),
                      timeout=30, what=f"run {run_id} to be {status}")


def shot(page: Page, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / name), full_page=True)


