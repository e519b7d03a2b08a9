"""The README's walk, by the README's own commands: ``make demo`` (the demo on a free port),
log in as the demo's ``operator`` with the password the demo printed and decide an approval in
a real browser, make an API token with the README's command and list the approvals with the
README's ``curl`` line, then the README's own agent: its Python block written to
``myapp/agents.py``, its shell lines run in order, the approval ``startrun --wait`` points at
allowed in the browser, and the run finished. The commands are read out of README.md, so a
README change that breaks the walk fails here."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Page, expect

from tests.console.browser import _free_port, shot
from tests.procs import ROOT
from tests.waiting import wait_until

README = ROOT / "README.md"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
README_SITE = "http://127.0.0.1:8000"  # where the README's commands expect the console


def blocks(lang: str) -> list[str]:
    """The README's fenced code blocks in ``lang``, in order."""
    return [body for kind, body in FENCE.findall(README.read_text()) if kind == lang]


def sh_lines() -> list[str]:
    """Every command line of the README's shell blocks, comments cut off."""
    lines = []
    for block in blocks("sh"):
        for line in block.splitlines():
            command = line.split("  #")[0].strip()
            if command and not command.startswith("#"):
                lines.append(command)
    return lines


def sh_line(starting: str) -> str:
    found = [line for line in sh_lines() if line.startswith(starting)]
    assert len(found) == 1, f"the README has {len(found)} lines starting {starting!r}"
    return found[0]


def manage_args(line: str) -> list[str]:
    """A README line ``.venv/bin/python manage.py ...`` as arguments for this interpreter."""
    words = shlex.split(line.removesuffix("&").strip())
    assert words[:2] == [".venv/bin/python", "manage.py"], line
    return [sys.executable, *words[1:]]


def readme_agent(where: Path) -> Path:
    """The README's agent module, written where its first line says (``myapp/agents.py``)
    under ``where``; ``where`` goes on PYTHONPATH as the project's root would be."""
    [block] = [b for b in blocks("python") if b.startswith("# myapp/agents.py")]
    path = where / "myapp" / "agents.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(block)
    return path


def test_the_readme_names_its_commands():
    """Cheap guard for the slow walk below: each command it follows is still in the README."""
    assert "make demo" in sh_lines()
    assert re.search(r"^demo:.*\n\t\$\(PY\) manage\.py demo ", (ROOT / "Makefile").read_text(),
                     re.M), "make demo runs manage.py demo"
    assert manage_args(sh_line(".venv/bin/python manage.py apitoken create"))[2] == "apitoken"
    assert sh_line("curl ").endswith(f"{README_SITE}/api/approvals/")
    assert sh_line("export RUNTIME_AGENTS=") == "export RUNTIME_AGENTS=myapp.agents.refunds"
    [agent] = [b for b in blocks("python") if b.startswith("# myapp/agents.py")]
    compile(agent, "README.md", "exec")


class Demo:
    """``manage.py demo`` on a free port in its own directory, its output in a file; ended by
    its pid (it stops its console and workers itself), its process group if it will not."""

    def __init__(self, where: Path) -> None:
        self.url = f"http://127.0.0.1:{_free_port()}"
        self.env = {k: v for k, v in os.environ.items()
                    if k not in ("DATABASE_URL", "DJANGO_ALLOW_ASYNC_UNSAFE", "CONSOLE_PASSWORD")}
        self.env.update(RUNTIME_VAR_DIR=str(where), RUNTIME_DEMO_DIR=str(where / "world"),
                        PYTHONUNBUFFERED="1")
        self.out = where / "demo.out"
        self._file = open(self.out, "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "manage.py", "demo", "--port", self.url.rsplit(":", 1)[1],
             "--runs", "6", "--chaos", "0.5", "--seed", "3"],
            cwd=ROOT, env=self.env, stdout=self._file, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True)

    def said(self, pattern: str) -> re.Match[str] | None:
        assert self.proc.poll() is None, self.out.read_text()
        return re.search(pattern, self.out.read_text(), re.M)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self._file.close()


@pytest.fixture
def demo(tmp_path: Path) -> Iterator[Demo]:
    running = Demo(tmp_path)
    try:
        yield running
    finally:
        running.stop()


def decide(page: Page, decision: str) -> None:
    """Open a decision on the approval page, tick its box, press its button."""
    page.locator(f"#decide-{decision} summary").click()
    page.check(f"#id_{decision}-confirm")
    page.locator(f"#decide-{decision} button[type=submit]").click()
    expect(page.get_by_test_id("outcome")).to_contain_text("by operator")


@pytest.mark.slow
def test_the_readme_walk(demo, browser, tmp_path):
    # make demo: the console answers, and the operator's password is printed once.
    password = wait_until(lambda: demo.said(r"password (\S+) \(shown once\)"), timeout=120,
                          what="the demo to print the operator's password")[1]
    wait_until(lambda: demo.said(r"^console: http://"), timeout=60, what="the console")
    wait_until(lambda: _answers(demo.url), timeout=60, what="gunicorn")
    assert demo.said(re.escape(sh_line(".venv/bin/python manage.py apitoken create")
                               .split("  #")[0]))  # the demo prints the README's command

    # Log in as operator and decide the oldest approval.
    context = browser.new_context(base_url=demo.url, viewport={"width": 1280, "height": 900})
    context.set_default_timeout(20_000)
    try:
        page = context.new_page()
        page.goto("/")
        page.fill("#id_username", "operator")
        page.fill("#id_password", password)
        page.click("button[type=submit]")
        expect(page.locator("header .who")).to_contain_text("operator")
        rows = page.locator("tr[data-queue-row]")
        expect(rows.first).to_be_visible(timeout=120_000)
        shot(page, "readme-walk-queue.png")
        rows.last.locator("a.open").click()  # the queue is oldest first by default
        expect(page).to_have_url(re.compile(r"/approvals/\d+/$"))
        decide(page, "approve")
        shot(page, "readme-walk-decided.png")
        page.goto("/schedules/")  # the operator sees schedules (the operators group)
        expect(page.get_by_role("heading", name="Schedules", exact=True)).to_be_visible()

        # The API with a token made by the README's command, called as the README shows.
        made = subprocess.run(
            manage_args(sh_line(".venv/bin/python manage.py apitoken create")), cwd=ROOT,
            env=demo.env, capture_output=True, text=True, timeout=60)
        assert made.returncode == 0, made.stderr
        token = made.stdout.strip()
        assert token.startswith("art_")
        curl = shlex.split(sh_line("curl "))
        header = curl[curl.index("-H") + 1].replace("$TOKEN", token)
        name, _, given = header.partition(": ")
        auth = {name: given}
        listed = httpx.get(curl[-1].replace(README_SITE, demo.url), headers=auth, timeout=10)
        assert listed.status_code == 200, listed.text
        assert isinstance(listed.json()["items"], list)
        page.goto("/admin/console/apitoken/")  # and sees its tokens in the admin
        expect(page.locator("#result_list")).to_contain_text("try-the-api")

        # Your own agent: the README's block as myapp/agents.py, its commands in order.
        readme_agent(tmp_path / "project")
        env = {**demo.env, "PYTHONPATH": str(tmp_path / "project"),
               # the console's address, where the README's console (port 8000) would be
               "RUNTIME_APPROVAL_URL": f"{demo.url}/approvals/{{id}}/"}
        key, _, value = sh_line("export RUNTIME_AGENTS=").removeprefix("export ").partition("=")
        env[key] = value
        migrated = subprocess.run(manage_args(sh_line(".venv/bin/python manage.py migrate")),
                                  cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
        assert migrated.returncode == 0, migrated.stderr
        worker_line = sh_line(".venv/bin/python manage.py runworker")
        assert worker_line.endswith("&")  # in the background, as the README runs it
        worker = subprocess.Popen(manage_args(worker_line), cwd=ROOT, env=env,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                  stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            started = subprocess.run(
                manage_args(sh_line(".venv/bin/python manage.py startrun")), cwd=ROOT,
                env=env, capture_output=True, text=True, timeout=120)
            assert started.returncode == 3, started.stdout + started.stderr  # it waits
            link = re.search(r"waits for a person \(Refund 249\.00\?\): (\S+)", started.stdout)
            assert link, started.stdout
            page.goto(link[1])
            expect(page.get_by_text("Refund 249.00?").first).to_be_visible()
            shot(page, "readme-walk-own-agent.png")
            decide(page, "approve")
            run_id = int(re.search(r"run (\d+) queued", started.stdout)[1])
            wait_until(lambda: httpx.get(f"{demo.url}/api/runs/{run_id}", headers=auth,
                                         timeout=10).json()["status"] == "succeeded",
                       timeout=60, what="the worker to finish the allowed run")
        finally:
            os.kill(worker.pid, signal.SIGTERM)
            try:
                worker.wait(40)
            except subprocess.TimeoutExpired:
                os.kill(worker.pid, signal.SIGKILL)
                worker.wait(10)
    finally:
        context.close()
    assert "Traceback" not in demo.out.read_text()


def _answers(url: str) -> bool:
    try:
        return httpx.get(f"{url}/healthz", timeout=2).status_code == 200
    except httpx.TransportError:
        return False
