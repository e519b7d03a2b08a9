"""Schedules in the console (console/schedules.py) and approvals that expire (the queue, an
approval's page, the history): who may see and change what, that every change is the
runtime's and recorded with who made it, that bad input changes nothing, that the standing
authorization is turned on only through its confirmation, and that the list costs the same
however many schedules there are."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from html import unescape

import pytest
from django.contrib.auth.models import Group, User
from django.db import connection
from django.test import Client

from runtime import Agent, Allow, FinalAnswer, RequireApproval, ScriptedLLM, ToolCall, resume
from runtime.agents.agent import registry
from runtime.approvals.expiry import approvals_expire
from runtime.clock import ManualClock
from runtime.loop.control import start
from runtime.models import Approval, Run, Schedule, ScheduleEvent
from runtime.schedules.changes import schedule_authorize, schedule_create
from runtime.schedules.firing import schedules_fire_due
from tests.console.conftest import client_for, sql_log
from tests.console.test_approvals import HTMX, decide, snapshot
from tests.console.test_pages import clean, walk
from tests.console.test_security import INLINE
from tests.kit import Ledger, make_tools

VIEW, MANAGE = "runtime.view_schedule", "runtime.manage_schedule"


def text(response) -> str:
    """The page as a person reads it: tags dropped, entities decoded, spaces collapsed."""
    return re.sub(r"\s+", " ", unescape(re.sub(r"<[^>]+>", " ", response.content.decode())))


def policy(request, run):
    return RequireApproval("Charge a card?", "Over the limit.", expires_in=12 * 60) \
        if request.tool == "charge" else Allow()


def no_deadline_policy(request, run):
    return RequireApproval("Charge a card?") if request.tool == "charge" else Allow()


@pytest.fixture
def agents(sqlite_path, tmp_path) -> Iterator[None]:
    """``nightly`` charges a card (its policy asks a person, with a 12-minute deadline);
    ``report`` only reads; ``slow`` asks without a deadline."""
    ledger = Ledger(tmp_path / "ledger")
    script = [ToolCall("charge", {"amount": 9}), FinalAnswer("ok")]
    with registry.override(
            Agent("nightly", ScriptedLLM(script), make_tools(ledger), policy=policy),
            Agent("report", ScriptedLLM([FinalAnswer("ok")]), make_tools(ledger)),
            Agent("slow", ScriptedLLM(script), make_tools(ledger), policy=no_deadline_policy)):
        yield


@pytest.fixture
def manager(make_user, agents) -> Client:
    """May see runs and schedules, and change schedules."""
    return client_for(make_user("mia", "runtime.view_run", VIEW, MANAGE))


@pytest.fixture
def watcher(make_user, agents) -> Client:
    """May see schedules (and runs), change nothing."""
    return client_for(make_user("walt", "runtime.view_run", VIEW))


def new_schedule(name: str = "nightly", agent: str = "nightly", **kw) -> Schedule:
    kw.setdefault("cron", "0 3 * * *")
    return schedule_create(name, agent, {"region": "eu"}, by="setup",
                           now=kw.pop("now", datetime.now(UTC)), timezone=kw.pop(
                               "timezone", "Europe/Berlin"), **kw)


def recorded(schedule_id: int) -> tuple:
    """Everything a refused change must leave as it was."""
    return (Schedule.objects.filter(pk=schedule_id).values().first(),
            list(ScheduleEvent.objects.filter(schedule_id=schedule_id).order_by("seq")
                 .values_list("seq", "kind", "actor")))


def everything() -> tuple:
    return (list(Schedule.objects.order_by("pk").values()),
            list(ScheduleEvent.objects.order_by("pk").values_list("pk", "kind")))


def fire(schedule: Schedule, times: int, every: timedelta = timedelta(days=1)) -> list[int]:
    """Fire ``times`` occurrences of ``schedule`` (a worker's job), one per period."""
    created = []
    schedule.refresh_from_db()
    at = schedule.next_fire_at
    for _ in range(times):
        created += schedules_fire_due(at + timedelta(seconds=1))
        at += every
    return created


# -- who may see and change ------------------------------------------------------------------


def pages(s: Schedule) -> list[str]:
    return ["/schedules/", "/schedules/new/", f"/schedules/{s.pk}/",
            f"/schedules/{s.pk}/authorize/"]


def test_every_schedule_page_needs_a_login(agents):
    s = new_schedule()
    for url in pages(s):
        response = Client().get(url)
        assert response.status_code == 302 and response["Location"].startswith("/login/"), url


def test_without_view_schedule_no_schedule_page_shows_anything(make_user, agents, viewer,
                                                               stranger):
    s = new_schedule()
    manage_only = client_for(make_user("mo", "runtime.view_run", MANAGE))
    for client in (stranger, viewer, manage_only):
        for url in pages(s):
            for extra in ({}, HTMX):
                response = client.get(url, **extra)
                assert response.status_code == 403, url
                assert "Europe/Berlin" not in response.content.decode(), url
    # The nav leads to schedules only those who have something to do there.
    assert 'href="/schedules/"' not in viewer.get("/").content.decode()
    assert 'href="/schedules/"' in manage_only.get("/").content.decode()
    assert "needs the view_schedule permission" in manage_only.get("/schedules/").content.decode()


def test_without_manage_schedule_nothing_changes(watcher, agents):
    s = new_schedule()
    schedule_authorize(s.pk, True, by="setup", now=datetime.now(UTC))
    before = everything()
    html = watcher.get(f"/schedules/{s.pk}/").content.decode()
    assert watcher.get("/schedules/").status_code == 200
    assert 'data-testid="no-permission"' in html
    assert 'name="action"' not in html and "/authorize/" not in html
    assert "New schedule" not in watcher.get("/schedules/").content.decode()
    assert watcher.get("/schedules/new/").status_code == 403
    assert watcher.get(f"/schedules/{s.pk}/authorize/").status_code == 403
    posts = [("/schedules/new/", create_form()),
             (f"/schedules/{s.pk}/authorize/", {"confirm": "on", "version": s.event_seq})]
    posts += [(f"/schedules/{s.pk}/", {"action": a, "remove-confirm": "on"})
              for a in ("enable", "disable", "unauthorize", "remove", "authorize")]
    posts.append((f"/schedules/{s.pk}/", {"action": "edit", **edit_form(s, cron="5 * * * *")}))
    for url, data in posts:
        for extra in ({}, HTMX):
            assert watcher.post(url, data, **extra).status_code == 403, (url, data)
    assert everything() == before


def test_the_viewers_and_operators_groups_see_schedules_and_change_nothing(agents):
    s = new_schedule()
    for group in ("viewers", "operators"):
        user = User.objects.create_user(f"in-{group}")
        user.groups.add(Group.objects.get(name=group))
        client = client_for(user)
        assert client.get("/schedules/").status_code == 200, group
        assert client.get(f"/schedules/{s.pk}/").status_code == 200, group
        assert 'href="/schedules/"' in client.get("/").content.decode()
        assert client.post(f"/schedules/{s.pk}/", {"action": "disable"}).status_code == 403
    assert Schedule.objects.get(pk=s.pk).enabled


# -- the list ----------------------------------------------------------------------------------


def test_the_list_shows_when_and_what_and_the_latest_five_runs(manager, agents):
    now = datetime.now(UTC)
    daily = new_schedule(now=now - timedelta(days=10))
    every = schedule_create("poll", "report", {}, by="setup", now=now, interval_seconds=90)
    runs = fire(daily, 7)
    assert len(runs) == 7
    schedule_authorize(daily.pk, True, by="ada", now=now)
    page = manager.get("/schedules/")
    assert page.status_code == 200
    rows = {m.group(1): m.group(2) for m in re.finditer(
        r'data-testid="schedule-row" data-id="(\d+)">(.*?)</tr>', page.content.decode(), re.S)}
    nightly, poll = rows[str(daily.pk)], rows[str(every.pk)]
    assert ">0 3 * * *</code>" in nightly and "Europe/Berlin" in nightly
    assert "every 90 s" in poll and "enabled" in poll
    daily.refresh_from_db()
    stamp = f"{daily.authorized_at:%Y-%m-%d %H:%M:%S}"
    assert "authorized by ada at <time" in nightly and f">{stamp} UTC</time>" in nightly
    assert '<span class="status">off</span> asks a person' in poll
    shown = [int(i) for i in re.findall(r'href="/runs/(\d+)/"', nightly)]
    latest = list(Run.objects.filter(schedule=daily).order_by("-occurrence_at")
                  .values_list("pk", flat=True)[:5])
    assert shown == latest and len(shown) == 5  # newest occurrence first, only five
    first = Run.objects.get(pk=latest[0])
    assert f'datetime="{first.occurrence_at.isoformat()}"' in nightly
    assert "status-queued" in nightly
    assert "none yet" in poll
    every.refresh_from_db()
    assert f"{every.next_fire_at:%Y-%m-%d %H:%M:%S} UTC" in poll


def test_disabled_and_removed_schedules_in_the_list(manager, agents):
    off = new_schedule("off", enabled=False)
    gone = new_schedule("gone")
    manager.post(f"/schedules/{gone.pk}/", {"action": "remove", "remove-confirm": "on"})
    html = manager.get("/schedules/").content.decode()
    assert f'data-id="{off.pk}"' in html and "disabled" in html
    assert f'data-id="{gone.pk}"' not in html


def test_the_list_costs_the_same_number_of_queries_for_any_number_of_schedules(manager,
                                                                             agents):
    def statements() -> list[str]:
        with sql_log() as log:
            assert manager.get("/schedules/").status_code == 200
        return log

    def add(n: int, offset: int) -> None:
        for i in range(n):
            s = new_schedule(f"s{offset + i}", now=datetime.now(UTC) - timedelta(days=10))
            fire(s, 3 + i % 4)

    add(2, 0)
    few = statements()
    add(10, 2)
    many = statements()
    assert Schedule.objects.count() == 12 and Run.objects.count() > 40
    assert len(many) == len(few), (len(few), len(many))
    runs_reads = [s for s in many if s.startswith('SELECT "runtime_run".')]
    assert len(runs_reads) == 1, runs_reads  # one query for the runs of every schedule
    # ... reading, for each schedule, only its latest runs: a range of the unique
    # (schedule, occurrence_at) index, however many runs it has had, even once SQLite has
    # statistics that make a whole-index scan look cheap. (Older runs, written directly: a
    # year of them for each schedule would take the runtime a while to fire.)
    long_ago = datetime(2020, 1, 1, tzinfo=UTC)
    Run.objects.bulk_create([
        Run(agent="report", input={}, created_at=long_ago, updated_at=long_ago, schedule=s,
            occurrence_at=long_ago + timedelta(hours=k), status="succeeded")
        for s in Schedule.objects.all() for k in range(2000)], batch_size=5000)
    with connection.cursor() as cur:
        cur.execute("ANALYZE")
    listing = [s for s in statements() if 'FROM "runtime_schedule"' in s]
    for sql in (*[s for s in statements() if s.startswith('SELECT "runtime_run".')],
                *listing):
        with connection.cursor() as cur:
            plan = " / ".join(row[-1] for row in cur.execute(f"EXPLAIN QUERY PLAN {sql}"))
        assert "SCAN runtime_run" not in plan and "SCAN U0" not in plan, plan
        assert "runtime_run_1 (schedule_id=?" in plan, plan


# -- create, edit, enable, disable, remove -----------------------------------------------------


def create_form(**fields: str) -> dict[str, str]:
    form = {"name": "hourly report", "agent": "report", "input": '{"since": "1h"}',
            "cron": "", "interval_seconds": "3600", "timezone": "UTC", "enabled": "on"}
    form.update(fields)
    return form


def edit_form(s: Schedule, **fields) -> dict[str, str]:
    form = {"agent": s.agent, "input": '{"region": "eu"}', "cron": s.cron,
            "interval_seconds": s.interval_seconds or "", "timezone": s.timezone,
            "version": s.event_seq}
    form.update(fields)
    return {f"edit-{k}": v for k, v in form.items()}


@pytest.mark.parametrize("htmx", [False, True])
def test_create_is_the_runtimes_and_records_who(manager, htmx):
    response = manager.post("/schedules/new/", create_form(), **(HTMX if htmx else {}))
    s = Schedule.objects.get(name="hourly report")
    url = f"/schedules/{s.pk}/"
    if htmx:
        assert response.status_code == 200 and response["HX-Redirect"] == url
    else:
        assert response.status_code == 302 and response["Location"] == url
    assert (s.agent, s.input, s.interval_seconds, s.cron, s.enabled, s.created_by) == (
        "report", {"since": "1h"}, 3600, "", True, "mia")
    event = ScheduleEvent.objects.get(schedule=s)
    assert (event.kind, event.actor) == ("schedule.created", "mia")
    page = manager.get(url)
    assert "Schedule hourly report created." in text(page)
    assert "schedule.created" in page.content.decode()


def test_the_create_form_offers_the_configured_agents(manager):
    html = manager.get("/schedules/new/").content.decode()
    for name in ("nightly", "report", "slow"):
        assert f'<option value="{name}"' in html
    assert manager.get("/schedules/new/", **HTMX).content.decode().lstrip().startswith(
        '<form id="schedule-form"')


BAD_CREATES = [
    ({"name": ""}, "name", "This field is required"),
    ({"name": "x" * 101}, "name", "at most 100 characters"),
    ({"agent": "no-such-agent"}, "agent", "Select a valid choice"),
    ({"input": "{not json"}, "input", "Not valid JSON"),
    ({"input": "[" * 40 + "]" * 40}, "input", "nested deeper than 32 levels"),
    ({"input": '"' + "x" * (1024 * 1024 + 10) + '"'}, "input", "larger than the limit"),
    ({"input": "NaN"}, "input", "NaN is not a JSON number"),
    ({"cron": "every day", "interval_seconds": ""}, "cron", "is not a cron expression"),
    ({"cron": "61 * * * *", "interval_seconds": ""}, "cron", "is not a cron expression"),
    ({"cron": "* * * * *"}, "cron", "not both"),
    ({"cron": "", "interval_seconds": ""}, "cron", "not neither"),
    ({"cron": "x" * 101, "interval_seconds": ""}, "cron", "at most 100 characters"),
    ({"interval_seconds": "0"}, "interval_seconds", "whole number of seconds"),
    ({"interval_seconds": "-5"}, "interval_seconds", "whole number of seconds"),
    ({"interval_seconds": "99999999999"}, "interval_seconds", "whole number of seconds"),
    ({"interval_seconds": "1" * 5000}, "interval_seconds", "Enter a whole number"),
    ({"interval_seconds": "1.5"}, "interval_seconds", "Enter a whole number"),
    ({"timezone": "Mars/Olympus"}, "timezone", "is not a time zone name"),
    ({"timezone": "x" * 65}, "timezone", "at most 64 characters"),
]


@pytest.mark.parametrize(("fields", "field", "message"), BAD_CREATES,
                         ids=[f"{f}-{i}" for i, (_, f, _) in enumerate(BAD_CREATES)])
def test_bad_input_is_a_field_error_and_writes_nothing(manager, fields, field, message):
    new_schedule("hourly report-existing")
    before = everything()
    response = manager.post("/schedules/new/", create_form(**fields), **HTMX)
    assert response.status_code == 422
    html = response.content.decode()
    error = re.search(rf'data-testid="field-error-{field}">(.*?)</span>', html, re.S)
    assert error and message in unescape(error.group(1)), html[:3000]
    assert everything() == before


def test_every_problem_is_shown_at_once_next_to_its_field(manager):
    """Bad JSON, a bad cron expression given with an interval too, and an unknown zone: one
    submit answers all four, each next to its field, and writes nothing."""
    before = everything()
    response = manager.post("/schedules/new/", create_form(
        input="{not json", cron="every day", interval_seconds="60", timezone="Mars/Olympus"),
        **HTMX)
    assert response.status_code == 422
    html = response.content.decode()
    errors = {field: unescape(text) for field, text in re.findall(
        r'data-testid="field-error-([a-z_]+)">(.*?)</span>', html, re.S)}
    assert set(errors) == {"input", "cron", "timezone"}, errors
    assert "Not valid JSON" in errors["input"]
    assert "not both" in errors["cron"] and "is not a cron expression" in errors["cron"]
    assert "is not a time zone name" in errors["timezone"]
    assert everything() == before


def test_an_empty_post_is_a_422_with_the_errors(manager):
    before = everything()
    response = manager.post("/schedules/new/")
    assert response.status_code == 422 and 'data-testid="field-error-name"' in \
        response.content.decode()
    assert everything() == before


def test_a_name_taken_is_a_field_error(manager):
    new_schedule("hourly report")
    before = everything()
    response = manager.post("/schedules/new/", create_form())
    assert response.status_code == 422
    assert "a schedule named &#x27;hourly report&#x27; exists" in response.content.decode()
    assert everything() == before


def test_edit_records_the_old_and_new_values_and_who(manager):
    s = new_schedule()
    response = manager.post(f"/schedules/{s.pk}/", {
        "action": "edit", **edit_form(s, cron="30 4 * * 1-5", input='{"region": "us"}')})
    assert response.status_code == 302
    s.refresh_from_db()
    assert (s.cron, s.input) == ("30 4 * * 1-5", {"region": "us"})
    event = ScheduleEvent.objects.filter(schedule=s).latest("seq")
    assert (event.kind, event.actor) == ("schedule.updated", "mia")
    assert event.payload["changes"]["cron"] == {"old": "0 3 * * *", "new": "30 4 * * 1-5"}
    # Through htmx: the page's own partial, saying what happened.
    again = manager.post(f"/schedules/{s.pk}/", {
        "action": "edit", **edit_form(s, cron="", interval_seconds="600")}, **HTMX)
    assert again.status_code == 200 and 'data-testid="notice">Saved.' in again.content.decode()
    assert again.content.decode().lstrip().startswith('<div id="schedule-live">')
    s.refresh_from_db()
    assert (s.cron, s.interval_seconds) == ("", 600)


@pytest.mark.parametrize(("fields", "field", "message"), [
    ({"cron": "61 * * * *"}, "cron", "is not a cron expression"),
    ({"input": "{"}, "input", "Not valid JSON"),
    ({"timezone": "Nowhere"}, "timezone", "is not a time zone name"),
    ({"agent": "other"}, "agent", "Select a valid choice"),
])
def test_a_bad_edit_is_a_field_error_and_writes_nothing(manager, fields, field, message):
    s = new_schedule()
    before = recorded(s.pk)
    response = manager.post(f"/schedules/{s.pk}/", {"action": "edit",
                                                    **edit_form(s, **fields)}, **HTMX)
    assert response.status_code == 422
    error = re.search(rf'data-testid="field-error-{field}">(.*?)</span>',
                      response.content.decode(), re.S)
    assert error and message in unescape(error.group(1))
    assert '<details id="edit-schedule" class="decision" open>' in response.content.decode()
    assert recorded(s.pk) == before


def test_an_edit_of_the_agent_or_input_says_the_authorization_went_with_it(manager):
    s = new_schedule()
    schedule_authorize(s.pk, True, by="ada", now=datetime.now(UTC))
    s.refresh_from_db()
    page = manager.get(f"/schedules/{s.pk}/").content.decode()
    assert 'data-testid="edit-authorization-note"' in page
    response = manager.post(f"/schedules/{s.pk}/", {
        "action": "edit", **edit_form(s, input='{"region": "us"}')}, **HTMX)
    assert response.status_code == 200
    assert "The standing authorization was turned off with this change" in text(response)
    s.refresh_from_db()
    assert not s.authorize_side_effects
    kinds = list(ScheduleEvent.objects.filter(schedule=s).order_by("seq")
                 .values_list("kind", "actor"))[-2:]
    assert kinds == [("schedule.updated", "mia"), ("schedule.unauthorized", "mia")]


def test_an_edit_of_a_schedule_changed_meanwhile_is_refused(manager):
    s = new_schedule()
    stale = edit_form(s, cron="5 5 * * *")
    manager.post(f"/schedules/{s.pk}/", {"action": "disable"})  # someone else, meanwhile
    before = recorded(s.pk)
    response = manager.post(f"/schedules/{s.pk}/", {"action": "edit", **stale})
    assert response.status_code == 409 and "changed by someone else" in text(response)
    assert recorded(s.pk) == before


def test_enable_and_disable_are_recorded_with_who(manager):
    s = new_schedule()
    assert manager.post(f"/schedules/{s.pk}/", {"action": "disable"}).status_code == 302
    s.refresh_from_db()
    assert not s.enabled
    page = manager.get(f"/schedules/{s.pk}/")
    assert 'data-testid="enabled">disabled' in page.content.decode()
    assert "— (disabled)" in text(page)
    response = manager.post(f"/schedules/{s.pk}/", {"action": "enable"}, **HTMX)
    assert response.status_code == 200 and "Enabled." in text(response)
    s.refresh_from_db()
    assert s.enabled
    kinds = list(ScheduleEvent.objects.filter(schedule=s).order_by("seq")
                 .values_list("kind", "actor"))
    assert kinds[1:] == [("schedule.disabled", "mia"), ("schedule.enabled", "mia")]


def test_remove_needs_its_confirmation_and_is_recorded(manager):
    s = new_schedule()
    before = recorded(s.pk)
    refused = manager.post(f"/schedules/{s.pk}/", {"action": "remove"}, **HTMX)
    assert refused.status_code == 422 and "Tick the box to confirm." in text(refused)
    assert recorded(s.pk) == before
    response = manager.post(f"/schedules/{s.pk}/", {"action": "remove",
                                                    "remove-confirm": "on"}, **HTMX)
    assert response.status_code == 200 and response["HX-Redirect"] == "/schedules/"
    s.refresh_from_db()
    assert s.removed_at is not None and not s.enabled
    event = ScheduleEvent.objects.filter(schedule=s).latest("seq")
    assert (event.kind, event.actor) == ("schedule.removed", "mia")
    assert "Schedule nightly removed." in text(manager.get("/schedules/"))
    assert manager.get(f"/schedules/{s.pk}/").status_code == 404
    assert manager.post(f"/schedules/{s.pk}/", {"action": "enable"}).status_code == 404


def test_an_unknown_change_is_a_400_and_changes_nothing(manager):
    s = new_schedule()
    before = recorded(s.pk)
    for action in ("", "explode", "x" * 5000):
        response = manager.post(f"/schedules/{s.pk}/", {"action": action})
        assert response.status_code == 400 and "Nothing was changed" in text(response)
    assert recorded(s.pk) == before
    assert manager.get("/schedules/99999/").status_code == 404


# -- the standing authorization ------------------------------------------------------------------


def test_turning_the_authorization_on_needs_its_confirmation(manager):
    s = new_schedule()
    before = recorded(s.pk)
    url = f"/schedules/{s.pk}/authorize/"
    # Not from the schedule's page, not without the box, not for an older version.
    assert manager.post(f"/schedules/{s.pk}/", {"action": "authorize",
                                                "confirm": "on"}).status_code == 400
    missing = manager.post(url, {"version": s.event_seq}, **HTMX)
    assert missing.status_code == 422 and "Tick the box to confirm." in text(missing)
    assert manager.post(url, {"confirm": "on"}).status_code == 422  # no version
    assert manager.post(url, {"confirm": "on", "version": "9" * 5000}).status_code == 422
    assert manager.post(url).status_code == 422
    assert recorded(s.pk) == before

    page = text(manager.get(url))
    for words in ("agent nightly", "schedule nightly", "from now on",
                  "without asking", "never covers an interrupted call whose outcome is "
                  "uncertain", "Tools of nightly with side effects:",
                  "Yes: let every run schedule nightly fires from now on start the side "
                  "effects agent nightly's policy would ask a person about, without asking."):
        assert words in page, words
    assert "<code>charge</code>, <code>send</code>." in manager.get(url).content.decode()

    response = manager.post(url, {"confirm": "on", "version": s.event_seq}, **HTMX)
    assert response.status_code == 200 and response["HX-Redirect"] == f"/schedules/{s.pk}/"
    s.refresh_from_db()
    assert s.authorize_side_effects and s.authorized_by == "mia"
    event = ScheduleEvent.objects.filter(schedule=s).latest("seq")
    assert (event.kind, event.actor, event.payload["agent"]) == (
        "schedule.authorized", "mia", "nightly")
    stamp = f"{s.authorized_at:%Y-%m-%d %H:%M:%S}"
    assert f"authorized by mia at {stamp} UTC" in text(manager.get(f"/schedules/{s.pk}/"))
    assert f"authorized by mia at {stamp} UTC" in text(manager.get("/schedules/"))
    assert "already on" in text(manager.get(url))


def test_a_confirmation_read_before_the_schedule_changed_authorizes_nothing(manager):
    s = new_schedule()
    seen = s.event_seq
    manager.post(f"/schedules/{s.pk}/", {"action": "edit", **edit_form(s, agent="slow")})
    before = recorded(s.pk)
    response = manager.post(f"/schedules/{s.pk}/authorize/", {"confirm": "on",
                                                              "version": seen})
    assert response.status_code == 409 and "Read it again" in text(response)
    assert "agent slow" in text(response)  # the confirmation, as it is now
    assert recorded(s.pk) == before


def test_turning_the_authorization_off_needs_no_confirmation(manager):
    s = new_schedule()
    schedule_authorize(s.pk, True, by="ada", now=datetime.now(UTC))
    response = manager.post(f"/schedules/{s.pk}/", {"action": "unauthorize"}, **HTMX)
    assert response.status_code == 200 and "Standing authorization turned off" in text(response)
    s.refresh_from_db()
    assert not s.authorize_side_effects
    event = ScheduleEvent.objects.filter(schedule=s).latest("seq")
    assert (event.kind, event.actor) == ("schedule.unauthorized", "mia")
    assert "off asks a person" in text(manager.get("/schedules/"))


# -- approvals that expire -------------------------------------------------------------------------


@dataclass
class Paused:
    run: Run
    approval: Approval


@pytest.fixture
def paused(agents) -> Callable[..., Paused]:
    """A run paused by its policy at real time ``at`` (default now): ``nightly``'s approval
    has a 12-minute deadline, ``slow``'s none."""

    def make(agent: str = "nightly", at: datetime | None = None) -> Paused:
        clock = ManualClock(at or datetime.now(UTC))
        run = resume(start(agent, {}, clock=clock).pk, clock=clock, lease_seconds=1)
        assert run.status == "waiting"
        return Paused(run, Approval.objects.get(run_id=run.pk, status="pending"))

    return make


def test_the_queue_shows_the_time_left(paused, manager):
    p = paused()
    assert p.approval.expires_at is not None
    html = manager.get("/").content.decode()
    row = re.search(rf'data-id="{p.approval.pk}".*?</tr>', html, re.S).group(0)
    assert f'<time datetime="{p.approval.expires_at.isoformat()}" data-until' in row
    left = re.search(r"expires in <time[^>]*>([^<]*)</time>", row).group(1)
    assert left.startswith(("11m", "12m")), left
    assert "deadline-soon" not in row
    approval = text(manager.get(f"/approvals/{p.approval.pk}/"))
    assert f"deadline {p.approval.expires_at:%Y-%m-%d %H:%M:%S} UTC" in approval
    assert f"Decide by {p.approval.expires_at:%Y-%m-%d %H:%M:%S} UTC ( expires in" in approval


def test_the_queue_sorts_expiring_first_when_asked(paused, manager):
    now = datetime.now(UTC)
    oldest = paused("slow", at=now - timedelta(minutes=30))  # no deadline
    later = paused("nightly", at=now - timedelta(minutes=1))  # deadline in 11 min
    sooner = paused("nightly", at=now - timedelta(minutes=8))  # deadline in 4 min

    def order(url: str) -> list[int]:
        response = manager.get(url)
        assert response.status_code == 200
        return [a.pk for a in response.context["items"]]

    ids = (oldest.approval.pk, later.approval.pk, sooner.approval.pk)
    assert order("/") == [ids[0], ids[2], ids[1]]  # oldest first
    assert order("/?sort=expiring") == [ids[2], ids[1], ids[0]]
    assert order("/?sort=expiring&agent=nightly") == [ids[2], ids[1]]
    html = manager.get("/?sort=expiring").content.decode()
    assert '<option value="expiring" selected>expiring first</option>' in html
    assert "sort=expiring&amp;seen=" in html  # the poll keeps the order
    soon = re.search(rf'data-id="{ids[2]}".*?</tr>', html, re.S).group(0)
    assert "deadline-soon" in soon
    bad = manager.get("/?sort=bogus")
    assert bad.status_code == 400 and "There is no order" in text(bad)


def test_the_expiring_first_order_reads_through_indexes(paused, manager):
    paused()
    with sql_log() as statements:
        manager.get("/?sort=expiring")
    reads = [s for s in statements if 'FROM "runtime_approval"' in s and "ORDER BY" in s]
    assert any('"expires_at" ASC' in s for s in reads)
    assert not any("NULLS LAST" in s.upper() for s in reads)


def test_an_expired_approval_is_in_the_history(paused, manager):
    p = paused(at=datetime.now(UTC) - timedelta(hours=1))
    assert approvals_expire(datetime.now(UTC)) == [p.approval.pk]
    approval = Approval.objects.get(pk=p.approval.pk)
    assert (approval.status, approval.decided_by) == ("expired", "")
    when = f"{approval.decided_at:%Y-%m-%d %H:%M:%S} UTC"
    history = manager.get(f"/runs/{p.run.pk}/")
    item = re.search(rf'href="/approvals/{approval.pk}/".*?</li>', history.content.decode(),
                     re.S).group(0)
    assert "expired</span>" in item and f">{when}</time>" in item and " by " not in item
    page = text(manager.get(f"/approvals/{approval.pk}/"))
    assert f"Expired at {when}" in page and "decided by" not in page
    assert "Nobody decided before the deadline" in page
    assert "approval_expired" in page
    assert p.approval.pk not in [a.pk for a in manager.get("/").context["items"]]


@pytest.mark.parametrize("swept", [False, True])
def test_a_decision_after_the_deadline_is_a_409_and_changes_nothing(paused, manager, swept):
    p = paused(at=datetime.now(UTC) - timedelta(hours=1))
    if swept:
        approvals_expire(datetime.now(UTC))
    page = manager.get(f"/approvals/{p.approval.pk}/").content.decode()
    assert 'id="decide-' not in page  # past the deadline nothing is offered
    if not swept:
        assert "The deadline passed at" in text(manager.get(f"/approvals/{p.approval.pk}/"))
    before = snapshot(p.run.pk)
    for decision, fields in (("approve", {}), ("reject", {"note": "late"})):
        response = decide(manager_with_decide(manager), p.approval, decision, htmx=True,
                          **fields)
        assert response.status_code == 409, decision
        words = text(response)
        assert "this approval already expired at" in words and "too late to decide" in words
        assert "Nothing was changed" in words
    assert snapshot(p.run.pk) == before


def manager_with_decide(client: Client) -> Client:
    """The manager, allowed to decide approvals too."""
    from django.contrib.auth.models import Permission

    user = User.objects.get(username="mia")
    user.user_permissions.add(Permission.objects.get(codename="decide_approval"))
    return client_for(User.objects.get(pk=user.pk))


# -- every page, clean ---------------------------------------------------------------------------


def no_inline_code(html: str, where: str) -> None:
    """Nothing the Content-Security-Policy would block."""
    for pattern, what in INLINE:
        found = pattern.search(html)
        assert found is None, f"{where} has {what}: {found and found.group(0)}"



def test_no_schedule_page_shows_template_text_or_writes_a_runtime_table(manager, watcher,
                                                                         paused):
    s = new_schedule(now=datetime.now(UTC) - timedelta(days=3))
    fire(s, 2)
    schedule_create("every", "report", {}, by="setup", now=datetime.now(UTC),
                    interval_seconds=30, enabled=False)
    expired = paused(at=datetime.now(UTC) - timedelta(hours=1))
    approvals_expire(datetime.now(UTC))
    pending = paused()
    urls = ["/schedules/", f"/schedules/{s.pk}/", "/?sort=expiring",
            f"/approvals/{expired.approval.pk}/", f"/approvals/{pending.approval.pk}/",
            f"/runs/{expired.run.pk}/"]
    with sql_log() as statements:
        for url in urls:
            for client in (manager, watcher):
                for html in walk(client, url):
                    clean(html, url)
                    no_inline_code(html, url)
        for url in ("/schedules/new/", f"/schedules/{s.pk}/authorize/"):
            for html in walk(manager, url):
                clean(html, url)
                no_inline_code(html, url)
    writes = [q for q in statements if q.lstrip().upper().startswith(
        ("INSERT", "UPDATE", "DELETE")) and "runtime_" in q]
    assert writes == []


def test_the_admin_lists_schedules_and_their_changes_read_only(make_user, agents):
    s = new_schedule()
    root = client_for(make_user("root", superuser=True))
    for model, obj in (("schedule", s.pk),
                       ("scheduleevent", ScheduleEvent.objects.get(schedule=s).pk)):
        listing = root.get(f"/admin/runtime/{model}/")
        assert listing.status_code == 200
        assert ("nightly" if model == "schedule" else "schedule.created") in \
            listing.content.decode()
        assert f"/admin/runtime/{model}/add/" not in listing.content.decode()
        assert root.get(f"/admin/runtime/{model}/add/").status_code == 403
        change = root.get(f"/admin/runtime/{model}/{obj}/change/")
        assert change.status_code == 200 and 'name="_save"' not in change.content.decode()
        assert root.post(f"/admin/runtime/{model}/{obj}/delete/", {"post": "yes"}
                         ).status_code == 403
    assert 'href="/schedules/"' in root.get("/admin/").content.decode()
