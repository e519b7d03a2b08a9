"""Fixtures for the console's tests: people with and without permissions, and runs waiting on
real approvals (made by crashing a run in-process and taking it over, as a worker would)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import pytest
from django.contrib.auth.models import Permission, User
from django.db import connection
from django.db.backends.signals import connection_created
from django.test import Client

from runtime import Allow, FinalAnswer, RequireApproval, ScriptedLLM, ToolCall, crashpoints, resume
from runtime.agents.agent import Agent, registry
from runtime.crashpoints import CrashPoint
from runtime.loop.control import start
from runtime.models import Approval, Run
from tests import kit
from tests.kit import Ledger, make_tools

# Markup in a tool's arguments: every page must show it as text, never run it.
XSS = "<script>alert('pwned')</script>"
PASSWORD = "correct horse battery staple"


@pytest.fixture(autouse=True)
def _plain_static_storage(settings) -> None:
    """The manifest storage needs ``collectstatic``; view tests only need the URLs."""
    settings.STORAGES = {
        **settings.STORAGES,
        "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
    }


@pytest.fixture
def make_user(sqlite_path) -> Callable[..., User]:
    def make(username: str, *perms: str, staff: bool = False, superuser: bool = False,
             password: str | None = None) -> User:
        """A user; without ``password`` it cannot log in by form (tests use force_login, and
        skip the deliberately slow password hashing)."""
        user = User.objects.create_user(username, password=password,
                                        is_staff=staff or superuser, is_superuser=superuser)
        for perm in perms:
            app, codename = perm.split(".")
            user.user_permissions.add(
                Permission.objects.get(content_type__app_label=app, codename=codename))
        return User.objects.get(pk=user.pk)  # drop the permission cache

    return make


def client_for(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def operator(make_user) -> Client:
    """May see runs, decide approvals and cancel runs."""
    return client_for(make_user("olga", "runtime.view_run", "runtime.decide_approval",
                                "runtime.cancel_run"))


@pytest.fixture
def viewer(make_user) -> Client:
    """May see everything, decide nothing."""
    return client_for(make_user("victor", "runtime.view_run"))


@pytest.fixture
def stranger(make_user) -> Client:
    """Logged in, no permission at all: sees nothing of any run."""
    return client_for(make_user("stella"))


@dataclass
class Waiting:
    run: Run
    approval: Approval
    ledger: Ledger


def crash_then_take_over(run_id: int, clock, point: CrashPoint, step_index: int) -> Run:
    """Crash a run in-process at ``point``; a second owner takes it over after the lease."""
    def arm(point: CrashPoint, step_index: int) -> None:
        crashpoints.arm([crashpoints.Arm(point, step_index)])

    return kit.crash_then_take_over(run_id, clock, arm, point, step_index)


def pay_agent(name: str, ledger: Ledger, to: str = XSS) -> Agent:
    return Agent(name, ScriptedLLM([ToolCall("send", {"to": to}), FinalAnswer("done")]),
                 make_tools(ledger))


@pytest.fixture
def interrupted(sqlite_path, tmp_path, clock) -> Iterator[Callable[..., Waiting]]:
    """Make runs whose `send` went out and was interrupted before its result was recorded;
    each waits on an ``interrupted_side_effect`` approval."""
    ledger = Ledger(tmp_path / "ledger")
    agents = [pay_agent("pay", ledger), pay_agent("refund", ledger, to="ops@example.com")]

    def make(agent: str = "pay", created_by: str = "") -> Waiting:
        run = start(agent, {"order": "A-1"}, created_by=created_by, clock=clock)
        run = crash_then_take_over(run.pk, clock, CrashPoint.AFTER_TOOL_EFFECT, 1)
        assert run.status == "waiting"
        approval = Approval.objects.get(run_id=run.pk, status="pending")
        assert approval.kind == "interrupted_side_effect"
        return Waiting(run, approval, ledger)

    with registry.override(*agents):
        yield make


@pytest.fixture
def policy_paused(sqlite_path, tmp_path, clock) -> Iterator[Callable[[], Waiting]]:
    """Make runs paused by their policy before `charge` starts (a ``policy`` approval)."""
    ledger = Ledger(tmp_path / "ledger")

    def policy(request, run):
        return RequireApproval("Charge a card?", "Over the limit.") \
            if request.tool == "charge" else Allow()

    agent = Agent("charger", ScriptedLLM([ToolCall("charge", {"amount": 9}), FinalAnswer("ok")]),
                  make_tools(ledger), policy=policy)

    def make() -> Waiting:
        run = resume(start("charger", {}, clock=clock).pk, clock=clock, lease_seconds=1)
        assert run.status == "waiting"
        return Waiting(run, Approval.objects.get(run_id=run.pk, status="pending"), ledger)

    with registry.override(agent):
        yield make


@contextmanager
def sql_log() -> Iterator[list[str]]:
    """Every SQL statement SQLite executed on this thread inside the block, including the
    runtime's raw-SQL writes (a trace callback on every connection opened meanwhile: a
    test-client request closes and reopens its connection, and Django's query log and
    execute wrappers do not see statements run on the raw connection)."""
    statements: list[str] = []

    def install(sender, connection, **kwargs) -> None:
        connection.connection.set_trace_callback(statements.append)

    connection.ensure_connection()
    connection.connection.set_trace_callback(statements.append)
    connection_created.connect(install)
    try:
        yield statements
    finally:
        connection_created.disconnect(install)
        if connection.connection is not None:
            connection.connection.set_trace_callback(None)


# The browser fixtures live in their own module; imported here, every test module sees them.
from tests.console.browser import browser, log_in, people, server, static_root  # noqa: E402, F401
