"""Design §10: schedules and their standing authorization.

A schedule creates runs on an interval or a cron expression in its time zone; one occurrence
makes one run however many workers race; missed occurrences are fired once. If a person turned
its standing authorization on before an occurrence fired, that run's policy approvals are
granted with ``side_effect.auto_confirmed`` (actor: the schedule, naming who authorized it) —
never an interrupted step (unless §7's dispatch proof holds), never a leftover run, never after
the authorization was turned off. Every change to a schedule is on its own audit chain.

Side-effect counts come from the Ledger (the outside world's record), not the runtime's tables.
"""

from __future__ import annotations

import getpass
import io
import os
import re
import signal
import subprocess
import sys
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import DatabaseError, connection, transaction

from runtime import (
    Agent,
    Allow,
    FinalAnswer,
    RequireApproval,
    ScriptedLLM,
    ToolCall,
    resume,
)
from runtime.agents.agent import registry
from runtime.approvals.decisions import approve
from runtime.audit.chain import verify
from runtime.clock import SYSTEM_CLOCK, ManualClock
from runtime.crashpoints import CrashPoint
from runtime.errors import InvalidSchedule, RunNotResumable, ScheduleNotFound
from runtime.loop import execution
from runtime.models import Approval, Event, Run, Schedule, ScheduleEvent
from runtime.schedules.authorization import standing_authorization
from runtime.schedules.changes import (
    schedule_authorize,
    schedule_create,
    schedule_remove,
    schedule_set_enabled,
    schedule_update,
)
from runtime.schedules.firing import schedules_fire_due
from runtime.schedules.timing import timing
from runtime.schedules.verify import schedules_problems
from runtime.selectors.approvals import pending
from tests import agents as process_agents
from tests.kit import Ledger, crash_then_take_over, events, events_of, kinds_after, make_tools
from tests.waiting import wait_until

pytestmark = pytest.mark.engines

ROOT = Path(__file__).resolve().parents[2]
BERLIN = ZoneInfo("Europe/Berlin")


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


def _gated(name: str, ledger: Ledger, tool: str = "charge") -> Agent:
    """Calls ``tool`` once, then answers; its policy asks a person before any side effect."""

    def policy(request, run):
        if request.effect == "side_effect":
            return RequireApproval(f"Run {request.tool}?", f"{request.arguments}")
        return Allow()

    args = {"amount": 7} if tool == "charge" else {"to": "bob"}
    return Agent(name, ScriptedLLM([ToolCall(tool, args), FinalAnswer("done")]),
                 make_tools(ledger), policy=policy)


def _fire_one(clock: ManualClock, schedule: Schedule) -> Run:
    """Move the clock to the schedule's next occurrence and fire it: one run."""
    schedule.refresh_from_db()
    clock.advance((schedule.next_fire_at - clock.now()).total_seconds())
    (run_id,) = schedules_fire_due(clock.now())
    return Run.objects.get(pk=run_id)


def _created(run: Run) -> dict:
    return events(run, "run.created")[0].payload["schedule"]


# -- firing: one occurrence, one run -------------------------------------------------------------


def test_missed_interval_occurrences_are_fired_once(database, tmp_path, clock):
    ledger = Ledger(tmp_path / "ledger")
    t0 = clock.now()
    with registry.override(_gated("miss", ledger)):
        s = schedule_create("every-minute", "miss", {"n": 1}, by="alice", now=t0,
                            interval_seconds=60)
        assert s.next_fire_at == t0 + timedelta(seconds=60)
        assert schedules_fire_due(t0 + timedelta(seconds=59)) == []  # not due yet

        # Ten slots are due (t0+60 … t0+600) and no worker ran: one run, for the latest.
        now = t0 + timedelta(seconds=630)
        (run_id,) = schedules_fire_due(now)
        run = Run.objects.get(pk=run_id)
        assert run.schedule_id == s.pk and run.occurrence_at == t0 + timedelta(seconds=600)
        assert run.status == "queued" and run.input == {"n": 1}
        assert run.created_by == "schedule:every-minute" and run.authorized_at is None
        created = events(run, "run.created")[0]
        assert created.actor == "schedule:every-minute"
        assert created.payload["schedule"] == {
            "id": s.pk, "name": "every-minute", "skipped": 9, "authorized_at": None,
            "authorized_by": "",
            "occurrence": (t0 + timedelta(seconds=600)).isoformat(timespec="microseconds")}
        s.refresh_from_db()
        assert s.next_fire_at == t0 + timedelta(seconds=660)  # the first slot after now

        assert schedules_fire_due(now) == []  # a second call fires nothing
        assert schedules_fire_due(t0 + timedelta(seconds=659)) == []
        (second,) = schedules_fire_due(t0 + timedelta(seconds=660))
        assert Run.objects.get(pk=second).occurrence_at == t0 + timedelta(seconds=660)
        assert _created(Run.objects.get(pk=second))["skipped"] == 0
    assert Run.objects.filter(schedule_id=s.pk).count() == 2
    assert not ScheduleEvent.objects.filter(schedule_id=s.pk).exclude(
        kind="schedule.created").exists()  # firing moves next_fire_at without a schedule event
    assert list(schedules_problems()) == []
    assert verify(run).ok and verify(second).ok
    assert ledger.count() == 0  # created, not run


def test_missed_cron_occurrences_are_fired_once(database, tmp_path):
    ledger = Ledger(tmp_path / "ledger")
    clock = ManualClock(utc(2026, 1, 1, 0, 0))
    with registry.override(_gated("cmiss", ledger)):
        s = schedule_create("five", "cmiss", {}, by="alice", now=clock.now(),
                            cron="*/5 * * * *")
        assert s.next_fire_at == utc(2026, 1, 1, 0, 5)
        (run_id,) = schedules_fire_due(utc(2026, 1, 1, 1, 2))  # 00:05 … 01:00 due: twelve
        run = Run.objects.get(pk=run_id)
        assert run.occurrence_at == utc(2026, 1, 1, 1, 0)
        assert _created(run)["skipped"] == 11
        s.refresh_from_db()
        assert s.next_fire_at == utc(2026, 1, 1, 1, 5)
        assert schedules_fire_due(utc(2026, 1, 1, 1, 2)) == []


@pytest.mark.parametrize("now", [utc(2026, 1, 15, 12, 0), utc(2026, 1, 15, 12, 0, 30)],
                         ids=["on-an-occurrence", "between-occurrences"])
def test_more_missed_than_are_counted_still_fires_the_latest_due_occurrence(now):
    """Past 10,000 missed occurrences ``due`` stops counting and jumps; the occurrence it fires
    must still be the latest one due (``now`` itself when ``now`` is an occurrence), and the
    next fire time the first after now: no due occurrence may be neither fired nor skipped."""
    when = timing("* * * * *", None, "UTC")
    occurrence, nxt, skipped = when.due(utc(2026, 1, 1, 0, 1), now)
    assert skipped >= 10_000
    assert occurrence == utc(2026, 1, 15, 12, 0)
    assert nxt == utc(2026, 1, 15, 12, 1)


def test_a_disabled_schedule_fires_nothing_and_enabling_skips_what_it_missed(database, tmp_path,
                                                                           clock):
    ledger = Ledger(tmp_path / "ledger")
    t0 = clock.now()
    with registry.override(_gated("dis", ledger)):
        s = schedule_create("off", "dis", {}, by="alice", now=t0, interval_seconds=60)
        schedule_set_enabled(s.pk, False, by="bob", now=t0)
        assert schedules_fire_due(t0 + timedelta(hours=5)) == []
        later = t0 + timedelta(hours=5, seconds=30)
        s = schedule_set_enabled(s.pk, True, by="bob", now=later)
        assert s.next_fire_at == later + timedelta(seconds=60)
        assert schedules_fire_due(later) == []  # nothing missed while disabled is fired
        (run_id,) = schedules_fire_due(later + timedelta(seconds=60))
        assert _created(Run.objects.get(pk=run_id))["skipped"] == 0
        schedule_remove(s.pk, by="bob", now=later + timedelta(seconds=61))
        assert schedules_fire_due(later + timedelta(days=1)) == []


def test_an_occurrence_of_an_unregistered_agent_is_recorded_missed_not_fired(database, tmp_path,
                                                                            clock):
    ledger = Ledger(tmp_path / "ledger")
    with registry.override(_gated("gone", ledger)):
        s = schedule_create("orphan", "gone", {}, by="alice", now=clock.now(),
                            interval_seconds=60)
    due = s.next_fire_at
    assert schedules_fire_due(due) == []  # the agent is not registered in this process
    assert not Run.objects.filter(schedule_id=s.pk).exists()
    s.refresh_from_db()
    assert s.next_fire_at == due + timedelta(seconds=60)
    missed = ScheduleEvent.objects.filter(schedule_id=s.pk, kind="schedule.missed").get()
    assert missed.actor == "system" and "gone" in missed.payload["reason"]
    assert missed.payload["occurrence"] == due.isoformat(timespec="microseconds")
    assert list(schedules_problems()) == []


@pytest.mark.slow
def test_three_workers_racing_fire_each_occurrence_exactly_once(database, tmp_path, spawn):
    """Three real ``runworker`` processes fire a one-second schedule (due already when they
    start, four slots missed): every slot up to the schedule's next fire time is either one
    run or counted skipped on the next run, no slot makes two runs, and each run's side effect
    happens once."""
    with registry.override(*process_agents.AGENTS):
        now = SYSTEM_CLOCK.now()
        s = schedule_create("tick", "mixed", {}, by="alice", now=now - timedelta(seconds=5),
                            interval_seconds=1)
    first_due = s.next_fire_at
    assert first_due <= now
    workers = [spawn("--poll-interval", "0.1", "--concurrency", "2", tag=f"w{i}")
               for i in range(3)]
    runs = Run.objects.filter(schedule_id=s.pk)
    wait_until(lambda: runs.count() >= 6, timeout=90, what="six occurrences to fire")
    schedule_set_enabled(s.pk, False, by="alice", now=SYSTEM_CLOCK.now())
    wait_until(lambda: not runs.exclude(status__in=["succeeded", "failed"]).exists(),
               timeout=90, what="the scheduled runs to finish")
    fired_runs = list(runs.order_by("occurrence_at"))  # read after the disable: final
    for w in workers:
        w.signal(signal.SIGTERM)
    for w in workers:
        assert w.wait(timeout=60) == 0, w.output()[-2000:]

    outputs = [w.output() for w in workers]
    for out in outputs:
        assert "Traceback" not in out, out[-2000:]
        assert "firing schedules or expiring approvals failed" not in out, out[-2000:]
    fired_per_worker = [sum(int(n) for n in re.findall(r"fired (\d+) scheduled run", out))
                        for out in outputs]
    assert sum(fired_per_worker) == len(fired_runs)  # each run fired by exactly one worker

    assert len(fired_runs) >= 6
    per_occurrence = Counter(r.occurrence_at for r in fired_runs)
    assert set(per_occurrence.values()) == {1}
    created = Counter(Event.objects.filter(run__schedule_id=s.pk, kind="run.created")
                      .values_list("run_id", flat=True))
    assert len(created) == len(fired_runs) and set(created.values()) == {1}
    # Every due slot is accounted for: fired, or counted skipped by the run that followed it.
    expect, slots = first_due, 0
    for r in fired_runs:
        origin = _created(r)
        assert origin["occurrence"] == r.occurrence_at.isoformat(timespec="microseconds")
        assert r.occurrence_at == expect + timedelta(seconds=origin["skipped"])
        slots += origin["skipped"] + 1
        expect = r.occurrence_at + timedelta(seconds=1)
    s.refresh_from_db()
    assert s.next_fire_at == expect
    assert slots == int((s.next_fire_at - first_due).total_seconds())
    assert {r.status for r in fired_runs} == {"succeeded"}
    taken = Counter(Event.objects.filter(run__schedule_id=s.pk, kind="lease.taken")
                    .values_list("run_id", flat=True))
    assert set(taken.values()) == {1}  # each run executed by one worker, once

    ledger = Ledger(tmp_path / "ledger.jsonl")
    charges = Counter(c["run"] for c in ledger.calls("fast_charge"))
    assert charges == {r.pk: 1 for r in fired_runs}  # one occurrence, one side effect
    assert all(verify(r).ok for r in fired_runs)
    assert list(schedules_problems()) == []


# -- cron in the schedule's time zone, across daylight saving time --------------------------------


def test_cron_spring_forward_fires_a_skipped_time_once_at_three():
    when = timing("30 2 * * *", None, "Europe/Berlin")
    # 2026-03-29: 02:00 CET jumps to 03:00 CEST; 02:30 does not exist that night.
    first = when.after(utc(2026, 3, 28, 12, 0))
    assert first == utc(2026, 3, 29, 1, 0)
    assert first.astimezone(BERLIN).strftime("%H:%M %Z") == "03:00 CEST"
    second = when.after(first)
    assert second == utc(2026, 3, 30, 0, 30)  # 02:30 CEST the day after
    assert second.astimezone(BERLIN).strftime("%H:%M") == "02:30"
    # Missed from the 28th's 02:30 CET until noon on the 29th: one skipped, fired at 03:00.
    assert when.due(utc(2026, 3, 28, 1, 30), utc(2026, 3, 29, 12, 0)) == (
        utc(2026, 3, 29, 1, 0), utc(2026, 3, 30, 0, 30), 1)


def test_cron_hourly_fires_at_both_two_oclocks_in_autumn():
    for cron in ("0 * * * *", "@hourly"):
        when = timing(cron, None, "Europe/Berlin")
        at, seen = utc(2026, 10, 24, 23, 30), []
        while at < utc(2026, 10, 25, 2, 30):
            at = when.after(at)
            seen.append(at)
        assert seen == [utc(2026, 10, 25, 0), utc(2026, 10, 25, 1), utc(2026, 10, 25, 2),
                        utc(2026, 10, 25, 3)], cron
        assert [a.astimezone(BERLIN).strftime("%H:%M %Z") for a in seen[:2]] == [
            "02:00 CEST", "02:00 CET"]
        assert when.due(utc(2026, 10, 24, 23), utc(2026, 10, 25, 1, 30)) == (
            utc(2026, 10, 25, 1), utc(2026, 10, 25, 2), 2)


def test_cron_daily_fires_once_in_the_repeated_autumn_hour():
    """2026-10-25: 03:00 CEST falls back to 02:00 CET, so 02:30 happens twice; a daily 02:30
    schedule fires once that day (as cron does: a fixed time in the repeated hour runs once)."""
    when = timing("30 2 * * *", None, "Europe/Berlin")
    at, seen = utc(2026, 10, 24, 12), []
    while at < utc(2026, 10, 26, 12):
        at = when.after(at)
        seen.append(at)
    on_the_25th = [a for a in seen if a.astimezone(BERLIN).date().isoformat() == "2026-10-25"]
    assert len(on_the_25th) == 1, [a.isoformat() for a in seen]
    assert seen[-1] == utc(2026, 10, 27, 1, 30)
    assert when.period(on_the_25th[0]) >= timedelta(hours=23)  # a day, not an hour
    _occurrence, nxt, skipped = when.due(utc(2026, 10, 24, 0, 30), utc(2026, 10, 25, 12))
    assert skipped == 1 and nxt == utc(2026, 10, 26, 1, 30)


@pytest.mark.parametrize("cron,start,end,expected", [
    ("30 2 * * *", utc(2026, 3, 28, 12), utc(2026, 3, 30, 12),
     [utc(2026, 3, 29, 1, 0), utc(2026, 3, 30, 0, 30)]),
    ("0 * * * *", utc(2026, 10, 24, 23, 30), utc(2026, 10, 25, 2, 30),
     [utc(2026, 10, 25, 0), utc(2026, 10, 25, 1), utc(2026, 10, 25, 2)]),
    ("30 2 * * *", utc(2026, 10, 24, 12), utc(2026, 10, 26, 12),
     [utc(2026, 10, 25, 0, 30), utc(2026, 10, 26, 1, 30)]),
], ids=["spring-daily", "autumn-hourly", "autumn-daily"])
def test_cron_across_dst_fired_by_schedules_fire_due(
        database, tmp_path, cron, start, end, expected):
    """The same, through the firing: a worker waking every ten minutes across the change."""
    ledger = Ledger(tmp_path / "ledger")
    with registry.override(_gated("dst", ledger)):
        s = schedule_create("berlin", "dst", {}, by="alice", now=start, cron=cron,
                            timezone="Europe/Berlin")
        now = start
        while now <= end:
            schedules_fire_due(now)
            now += timedelta(minutes=10)
    runs = list(Run.objects.filter(schedule_id=s.pk).order_by("occurrence_at"))
    assert [r.occurrence_at for r in runs] == expected
    assert [_created(r)["skipped"] for r in runs] == [0] * len(expected)


# -- the standing authorization -------------------------------------------------------------------


def test_an_authorized_scheduled_run_starts_its_side_effect_with_the_pass_on_record(
        database, tmp_path, clock):
    ledger = Ledger(tmp_path / "ledger")
    t0 = clock.now()
    with registry.override(_gated("pay", ledger)):
        s = schedule_create("nightly", "pay", {"who": "acme"}, by="alice", now=t0,
                            interval_seconds=3600)
        clock.advance(10)
        schedule_authorize(s.pk, True, by="carol", now=clock.now())
        authorized_at = clock.now()
        run = _fire_one(clock, s)
        assert run.authorized_at == authorized_at
        assert _created(run)["authorized_by"] == "carol"
        run = resume(run.pk, owner="worker-a", clock=clock, lease_seconds=5)
    assert run.status == "succeeded" and run.output == "done"
    assert ledger.count("charge") == 1
    assert not Approval.objects.filter(run_id=run.pk).exists()  # nobody was asked
    (confirmed,) = events(run, "side_effect.auto_confirmed")
    assert confirmed.actor == "schedule:nightly" and confirmed.step_index == 1
    p = confirmed.payload
    assert p["schedule_id"] == s.pk and p["schedule"] == "nightly"
    assert p["occurrence"] == run.occurrence_at.isoformat(timespec="microseconds")
    assert p["authorized_by"] == "carol"
    assert p["authorized_at"] == authorized_at.isoformat(timespec="microseconds")
    assert p["tool"] == "charge" and p["title"] == "Run charge?"
    # the pass is recorded in the start's own commit, right before it
    kinds = events_of(run)
    assert kinds[kinds.index("side_effect.auto_confirmed") + 1] == "step.tool_started"
    assert "approval.requested" not in kinds
    assert verify(run.pk).ok


@pytest.mark.parametrize("point,went_out", [(CrashPoint.AFTER_TOOL_STARTED, 0),
                                            (CrashPoint.AFTER_TOOL_EFFECT, 1)])
def test_an_interrupted_side_effect_in_an_authorized_run_still_asks_a_person(
        database, tmp_path, clock, crash, point, went_out):
    ledger = Ledger(tmp_path / "ledger")
    with registry.override(_gated("ipay", ledger)):
        s = schedule_create("nightly", "ipay", {}, by="alice", now=clock.now(),
                            interval_seconds=3600)
        schedule_authorize(s.pk, True, by="carol", now=clock.now())
        run = _fire_one(clock, s)
        run = crash_then_take_over(run.pk, clock, crash, point, 1)
        assert run.status == "waiting"
        assert ledger.count("charge") == went_out
        (approval,) = pending()
        assert approval.run_id == run.pk and approval.kind == "interrupted_side_effect"
        assert kinds_after(run, "step.interrupted") == ["approval.requested", "run.paused",
                                                        "lease.released"]
        # the standing pass covered the first start only
        assert [e.actor for e in events(run, "side_effect.auto_confirmed")] == [
            "schedule:nightly"]
        with pytest.raises(RunNotResumable):
            resume(run.pk, owner="worker-c", clock=clock, lease_seconds=1)
    assert ledger.count("charge") == went_out  # never re-run on its own
    assert len(events(run, "step.tool_started")) == 1
    assert verify(run.pk).ok


def test_a_dispatch_proven_undelivered_call_in_a_scheduled_run_is_rerun(database, tmp_path, clock,
                                                                        crash):
    ledger = Ledger(tmp_path / "ledger")
    with registry.override(_gated("spay", ledger, tool="send")):
        s = schedule_create("mailer", "spay", {}, by="alice", now=clock.now(),
                            interval_seconds=3600)
        schedule_authorize(s.pk, True, by="carol", now=clock.now())
        run = _fire_one(clock, s)
        run = crash_then_take_over(run.pk, clock, crash, CrashPoint.AFTER_TOOL_STARTED, 1)
    assert run.status == "succeeded"
    assert [c["attempt"] for c in ledger.calls("send")] == [2]  # it went out once
    assert events(run, "step.interrupted")[0].payload["dispatched"] is False
    standing, proof = events(run, "side_effect.auto_confirmed")
    assert standing.actor == "schedule:mailer" and standing.payload["authorized_by"] == "carol"
    assert proof.actor == "worker-b" and "never went out" in proof.payload["reason"]
    assert proof.payload["attempt"] == 1
    assert kinds_after(run, "step.interrupted")[:4] == [
        "side_effect.auto_confirmed", "step.tool_started", "step.tool_dispatched",
        "step.tool_finished"]
    assert not Approval.objects.filter(run_id=run.pk).exists()
    assert verify(run.pk).ok


def test_a_dispatched_call_in_a_scheduled_run_asks_a_person(database, tmp_path, clock, crash):
    ledger = Ledger(tmp_path / "ledger")
    with registry.override(_gated("dpay", ledger, tool="send")):
        s = schedule_create("mailer", "dpay", {}, by="alice", now=clock.now(),
                            interval_seconds=3600)
        schedule_authorize(s.pk, True, by="carol", now=clock.now())
        run = _fire_one(clock, s)
        run = crash_then_take_over(run.pk, clock, crash, CrashPoint.AFTER_TOOL_DISPATCHED, 1)
    assert run.status == "waiting"
    assert Approval.objects.get(run_id=run.pk).kind == "interrupted_side_effect"
    assert len(events(run, "side_effect.auto_confirmed")) == 1  # the standing one only
    assert ledger.count("send") == 0
    assert verify(run.pk).ok


def _asks_a_person(run: Run, clock, ledger: Ledger, tool: str = "charge") -> Approval:
    """Resume ``run``: it must pause on a policy approval, the tool not called."""
    before = ledger.count(tool)
    run = resume(run.pk, owner="worker-x", clock=clock, lease_seconds=5)
    assert run.status == "waiting"
    assert "side_effect.auto_confirmed" not in events_of(run)
    assert ledger.count(tool) == before
    approval = Approval.objects.get(run_id=run.pk, status="pending")
    assert approval.kind == "policy"
    assert verify(run.pk).ok
    return approval


def _passes(run: Run, clock, ledger: Ledger) -> None:
    before = ledger.count("charge")
    run = resume(run.pk, owner="worker-y", clock=clock, lease_seconds=5)
    assert run.status == "succeeded"
    assert len(events(run, "side_effect.auto_confirmed")) == 1
    assert ledger.count("charge") == before + 1
    assert verify(run.pk).ok


def test_no_pass_for_a_run_fired_before_the_authorization(database, tmp_path, clock):
    ledger = Ledger(tmp_path / "ledger")
    with registry.override(_gated("early", ledger)):
        s = schedule_create("nightly", "early", {}, by="alice", now=clock.now(),
                            interval_seconds=3600)
        before = _fire_one(clock, s)
        assert before.authorized_at is None
        schedule_authorize(s.pk, True, by="carol", now=clock.now())
        assert standing_authorization(Run.objects.get(pk=before.pk), clock.now()) is None
        approval = _asks_a_person(before, clock, ledger)
        after = _fire_one(clock, s)  # the next occurrence, fired with the authorization on
        _passes(after, clock, ledger)
        # the run that was fired too early still needs its person, and gets one
        approve(approval.pk, by="dave", now=clock.now())
        done = resume(before.pk, owner="worker-z", clock=clock, lease_seconds=5)
    assert done.status == "succeeded"
    assert Counter(c["run"] for c in ledger.calls("charge")) == {before.pk: 1, after.pk: 1}


@pytest.mark.parametrize("late,passes", [(0, True), (3599, True), (3600, True),
                                         (3600.001, False), (7200, False)])
def test_no_pass_for_a_run_older_than_one_period_at_its_step(database, tmp_path, clock, late,
                                                             passes):
    ledger = Ledger(tmp_path / "ledger")
    with registry.override(_gated("late", ledger)):
        s = schedule_create("hourly", "late", {}, by="alice", now=clock.now(),
                            interval_seconds=3600)
        schedule_authorize(s.pk, True, by="carol", now=clock.now())
        run = _fire_one(clock, s)
        clock.advance(late)
        if passes:
            _passes(run, clock, ledger)
        else:
            _asks_a_person(run, clock, ledger)
    assert ledger.count("charge") == (1 if passes else 0)


def test_no_pass_for_a_run_left_over_from_an_earlier_firing(database, tmp_path, clock):
    """Occurrence 1's run is not picked up until after occurrence 2 fired: it is a leftover,
    occurrence 2's run is not."""
    ledger = Ledger(tmp_path / "ledger")
    with registry.override(_gated("left", ledger)):
        s = schedule_create("minutely", "left", {}, by="alice", now=clock.now(),
                            interval_seconds=60)
        schedule_authorize(s.pk, True, by="carol", now=clock.now())
        first = _fire_one(clock, s)
        clock.advance(61)
        (second_id,) = schedules_fire_due(clock.now())
        second = Run.objects.get(pk=second_id)
        assert second.occurrence_at == first.occurrence_at + timedelta(seconds=60)
        _asks_a_person(first, clock, ledger)
        _passes(second, clock, ledger)
    assert [c["run"] for c in ledger.calls("charge")] == [second.pk]


def test_an_authorization_turned_off_as_the_start_commits_lets_nothing_through(
        database, tmp_path, clock, monkeypatch):
    """The grant is read before the start's commit and checked again inside it: turned off in
    between, the start is not written and a person is asked."""
    ledger = Ledger(tmp_path / "ledger")
    read_grant = execution.standing_authorization

    def read_then_turn_off(run, now):
        found = read_grant(run, now)
        schedule_authorize(run.schedule_id, False, by="erin", now=now)  # in that instant
        return found

    monkeypatch.setattr(execution, "standing_authorization", read_then_turn_off)
    with registry.override(_gated("instant", ledger)):
        s = schedule_create("nightly", "instant", {}, by="alice", now=clock.now(),
                            interval_seconds=3600)
        schedule_authorize(s.pk, True, by="carol", now=clock.now())
        run = _fire_one(clock, s)
        approval = _asks_a_person(run, clock, ledger)
    assert approval.step.attempt == 0 and approval.step.status == "waiting"
    # The step's decision was written with the pause: its request is the one asked about.
    assert (approval.step.tool, approval.step.arguments) == ("charge", {"amount": 7})
    assert events(run, "step.decided") and not events(run, "side_effect.auto_confirmed")
    assert ledger.count("charge") == 0
    assert not Schedule.objects.get(pk=s.pk).authorize_side_effects
    monkeypatch.undo()
    approve(approval.pk, by="olga")
    with registry.override(_gated("instant", ledger)):
        run = resume(run.pk, owner="worker-z", clock=clock, lease_seconds=5)
    assert run.status == "succeeded" and ledger.count("charge") == 1
    assert verify(run.pk).ok, verify(run.pk).problems


def test_no_pass_after_the_authorization_is_turned_off(database, tmp_path, clock):
    ledger = Ledger(tmp_path / "ledger")
    with registry.override(_gated("off", ledger)):
        s = schedule_create("nightly", "off", {}, by="alice", now=clock.now(),
                            interval_seconds=3600)
        schedule_authorize(s.pk, True, by="carol", now=clock.now())
        run = _fire_one(clock, s)
        assert run.authorized_at is not None
        schedule_authorize(s.pk, False, by="erin", now=clock.now())
        _asks_a_person(run, clock, ledger)
        later = _fire_one(clock, s)
        assert later.authorized_at is None
        _asks_a_person(later, clock, ledger)
    assert ledger.count("charge") == 0


def test_no_pass_for_an_earlier_run_after_the_authorization_is_turned_off_and_on(database, tmp_path,
                                                                               clock):
    ledger = Ledger(tmp_path / "ledger")
    with registry.override(_gated("onoff", ledger)):
        s = schedule_create("nightly", "onoff", {}, by="alice", now=clock.now(),
                            interval_seconds=3600)
        schedule_authorize(s.pk, True, by="carol", now=clock.now())
        old = _fire_one(clock, s)
        first_at = old.authorized_at
        schedule_authorize(s.pk, False, by="erin", now=clock.now())
        clock.advance(1)
        s = schedule_authorize(s.pk, True, by="frank", now=clock.now())
        assert s.authorized_at == clock.now() != first_at and s.authorized_by == "frank"
        _asks_a_person(old, clock, ledger)  # authorized by carol's pass, which is gone
        new = _fire_one(clock, s)
        assert new.authorized_at == s.authorized_at
        _passes(new, clock, ledger)
        assert events(new, "side_effect.auto_confirmed")[0].payload["authorized_by"] == "frank"
    assert [c["run"] for c in ledger.calls("charge")] == [new.pk]


def test_no_pass_after_the_schedule_runs_another_agent_than_the_one_authorized(database, tmp_path,
                                                                              clock):
    """Carol authorized the side effects of agent ``payroll`` ("the side effects agent payroll's
    policy would ask a person about", as ``manage.py schedule authorize`` says, and the
    ``schedule.authorized`` event names the agent). Mallory then points the schedule at agent
    ``wire``: carol never authorized wire's side effects, so its runs must ask a person."""
    ledger = Ledger(tmp_path / "ledger")
    with registry.override(_gated("payroll", ledger), _gated("wire", ledger)):
        s = schedule_create("monthly", "payroll", {}, by="alice", now=clock.now(),
                            interval_seconds=3600)
        schedule_authorize(s.pk, True, by="carol", now=clock.now())
        authorized = ScheduleEvent.objects.get(schedule_id=s.pk, kind="schedule.authorized")
        assert authorized.payload["agent"] == "payroll"
        schedule_update(s.pk, by="mallory", now=clock.now(), agent="wire")
        run = _fire_one(clock, s)
        assert run.agent == "wire"
        _asks_a_person(run, clock, ledger)
    assert ledger.count("charge") == 0


# -- the schedule's audit chain ----------------------------------------------------------------


def _chain(schedule_id: int) -> list[ScheduleEvent]:
    return list(ScheduleEvent.objects.filter(schedule_id=schedule_id).order_by("seq"))


def test_every_schedule_change_is_an_event_with_who_and_old_and_new_values(database, tmp_path,
                                                                          clock):
    ledger = Ledger(tmp_path / "ledger")
    iso = lambda at: at.isoformat(timespec="microseconds")  # noqa: E731
    with registry.override(_gated("aud", ledger), _gated("aud2", ledger)):
        t0 = clock.now()
        s = schedule_create("audited", "aud", {"n": 1}, by="alice", now=t0,
                            interval_seconds=60)
        t1 = clock.advance(5)
        schedule_update(s.pk, by="bob", now=t1, input={"n": 2}, interval_seconds=120)
        assert schedule_update(s.pk, by="bob", now=t1, input={"n": 2}).event_seq == 2  # no-op
        t2 = clock.advance(5)
        schedule_update(s.pk, by="bob", now=t2, cron="0 3 * * *", interval_seconds=None,
                        timezone="Europe/Berlin", agent="aud2")
        t3 = clock.advance(5)
        schedule_set_enabled(s.pk, False, by="carol", now=t3)
        schedule_set_enabled(s.pk, False, by="carol", now=t3)  # no-op: no event
        t4 = clock.advance(5)
        schedule_set_enabled(s.pk, True, by="carol", now=t4)
        t5 = clock.advance(5)
        schedule_authorize(s.pk, True, by="dave", now=t5)
        schedule_authorize(s.pk, True, by="mallory", now=t5)  # no-op: dave stays on record
        t6 = clock.advance(5)
        schedule_authorize(s.pk, False, by="erin", now=t6)
        t7 = clock.advance(5)
        schedule_remove(s.pk, by="frank", now=t7)

        # refused changes write nothing
        with pytest.raises(ScheduleNotFound):
            schedule_set_enabled(s.pk, True, by="gina", now=t7)
        with pytest.raises(ScheduleNotFound):
            schedule_remove(s.pk, by="gina", now=t7)
        with pytest.raises(ScheduleNotFound):
            schedule_authorize(s.pk, True, by="gina", now=t7)

    chain = _chain(s.pk)
    assert [(e.seq, e.kind, e.actor, e.at) for e in chain] == [
        (1, "schedule.created", "alice", t0), (2, "schedule.updated", "bob", t1),
        (3, "schedule.updated", "bob", t2), (4, "schedule.disabled", "carol", t3),
        (5, "schedule.enabled", "carol", t4), (6, "schedule.authorized", "dave", t5),
        (7, "schedule.unauthorized", "erin", t6), (8, "schedule.removed", "frank", t7)]
    created, upd1, upd2, disabled, enabled, auth, unauth, removed = (e.payload for e in chain)
    assert created == {"name": "audited", "agent": "aud", "input": {"n": 1}, "cron": "",
                       "interval_seconds": 60, "timezone": "UTC", "enabled": True,
                       "next_fire_at": iso(t0 + timedelta(seconds=60))}
    assert upd1["changes"] == {
        "input": {"old": {"n": 1}, "new": {"n": 2}},
        "interval_seconds": {"old": 60, "new": 120},
        "next_fire_at": {"old": iso(t0 + timedelta(seconds=60)),
                         "new": iso(t1 + timedelta(seconds=120))}}
    assert {f: upd2["changes"][f] for f in ("agent", "cron", "interval_seconds", "timezone")} == {
        "agent": {"old": "aud", "new": "aud2"}, "cron": {"old": "", "new": "0 3 * * *"},
        "interval_seconds": {"old": 120, "new": None},
        "timezone": {"old": "UTC", "new": "Europe/Berlin"}}
    assert disabled["enabled"] == {"old": True, "new": False}
    assert enabled["enabled"] == {"old": False, "new": True}
    assert auth == {"agent": "aud2", "authorize_side_effects": {
        "old": {"on": False, "by": "", "at": None},
        "new": {"on": True, "by": "dave", "at": iso(t5)}}}
    assert unauth["authorize_side_effects"] == {
        "old": {"on": True, "by": "dave", "at": iso(t5)},
        "new": {"on": False, "by": "dave", "at": iso(t5)}}
    assert removed["enabled"] == {"old": True, "new": False}

    row = Schedule.objects.get(pk=s.pk)
    assert (row.enabled, row.authorize_side_effects, row.authorized_by, row.authorized_at) == (
        False, False, "dave", t5)
    assert row.removed_at == t7 and row.event_seq == 8 and row.event_hash == chain[-1].hash
    assert list(schedules_problems()) == []
    out = io.StringIO()
    call_command("verifyaudit", stdout=out, stderr=out)
    assert out.getvalue().startswith("ok:")


def test_refused_schedule_changes_write_nothing(database, tmp_path, clock):
    ledger = Ledger(tmp_path / "ledger")
    with registry.override(_gated("ref", ledger)):
        s = schedule_create("kept", "ref", {}, by="alice", now=clock.now(), interval_seconds=60)
        for bad, field in [
            (lambda: schedule_create("kept", "ref", {}, by="a", now=clock.now(),
                                     interval_seconds=60), "name"),
            (lambda: schedule_create("x", "nobody", {}, by="a", now=clock.now(),
                                     interval_seconds=60), "agent"),
            (lambda: schedule_create("x", "ref", {}, by="a", now=clock.now(),
                                     cron="61 * * * *"), "cron"),
            (lambda: schedule_create("x", "ref", {}, by="a", now=clock.now(), cron="* * *"),
             "cron"),
            (lambda: schedule_create("x", "ref", {}, by="a", now=clock.now(),
                                     cron="* * * * *", interval_seconds=60), "cron"),
            (lambda: schedule_create("x", "ref", {}, by="a", now=clock.now(),
                                     interval_seconds=-5), "interval_seconds"),
            (lambda: schedule_create("x", "ref", {}, by="a", now=clock.now(),
                                     interval_seconds=400 * 24 * 3600), "interval_seconds"),
            (lambda: schedule_create("x", "ref", {}, by="a", now=clock.now(),
                                     interval_seconds=60, timezone="Mars/Olympus"), "timezone"),
            (lambda: schedule_create("x", "ref", {"at": object()}, by="a", now=clock.now(),
                                     interval_seconds=60), "input"),
            (lambda: schedule_create("x", "ref", {}, by="", now=clock.now(),
                                     interval_seconds=60), "by"),
            (lambda: schedule_update(s.pk, by="b", now=clock.now(), cron="nope"), "cron"),
            (lambda: schedule_update(s.pk, by="b", now=clock.now(), name="renamed"), "name"),
            (lambda: schedule_update(s.pk, by="b", now=clock.now(), agent="nobody"), "agent"),
            (lambda: schedule_update(s.pk, by="", now=clock.now(), input={"n": 3}), "by"),
            (lambda: schedule_authorize(s.pk, True, by="", now=clock.now()), "by"),
        ]:
            with pytest.raises(InvalidSchedule) as err:
                bad()
            assert err.value.field == field, (field, err.value)
    assert Schedule.objects.count() == 1
    assert [e.kind for e in _chain(s.pk)] == ["schedule.created"]
    row = Schedule.objects.get(pk=s.pk)
    assert (row.interval_seconds, row.cron, row.agent, row.authorize_side_effects) == (
        60, "", "ref", False)


def test_schedule_events_are_append_only(database, tmp_path, clock):
    ledger = Ledger(tmp_path / "ledger")
    with registry.override(_gated("ao", ledger)):
        s = schedule_create("ao", "ao", {}, by="alice", now=clock.now(), interval_seconds=60)
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        ScheduleEvent.objects.filter(schedule_id=s.pk).update(actor="mallory")
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        ScheduleEvent.objects.filter(schedule_id=s.pk).delete()
    assert _chain(s.pk)[0].actor == "alice"


def _broken() -> str:
    err = io.StringIO()
    with pytest.raises(CommandError, match="problem"):
        call_command("verifyaudit", stdout=io.StringIO(), stderr=err)
    return err.getvalue()


@pytest.mark.parametrize("column,value,says", [
    ("authorized_by", "'mallory'", "authorized_by is 'mallory' in the row; its events give "
                                   "'dave'"),
    ("authorize_side_effects", "FALSE", "authorize_side_effects is False in the row"),
    ("agent", "'wire'", "agent is 'wire' in the row; its events give 'tamp'"),
    ("interval_seconds", "1", "interval_seconds is 1 in the row; its events give 60"),
])
def test_verifyaudit_reports_a_tampered_schedule_row(
        database, tmp_path, clock, column, value, says):
    ledger = Ledger(tmp_path / "ledger")
    with registry.override(_gated("tamp", ledger)):
        s = schedule_create("tampered", "tamp", {}, by="alice", now=clock.now(),
                            interval_seconds=60)
        schedule_authorize(s.pk, True, by="dave", now=clock.now())
    out = io.StringIO()
    call_command("verifyaudit", stdout=out, stderr=out)
    assert out.getvalue().startswith("ok:")
    with connection.cursor() as cur:  # the schedule row itself has no trigger: an edit
        cur.execute(f"UPDATE runtime_schedule SET {column} = {value} WHERE id = %s", [s.pk])
    report = _broken()
    assert f"schedule {s.pk} (tampered): {says}" in report, report


def _drop_scheduleevent_triggers() -> list[str]:
    with connection.cursor() as cur:
        if connection.vendor == "sqlite":
            names = ["runtime_scheduleevent_no_update", "runtime_scheduleevent_no_delete"]
            for name in names:
                cur.execute(f"DROP TRIGGER {name}")
        else:
            names = ["runtime_scheduleevent_no_update_delete", "runtime_scheduleevent_no_truncate"]
            for name in names:
                cur.execute(f"DROP TRIGGER {name} ON runtime_scheduleevent")
    return names


def test_verifyaudit_reports_a_dropped_scheduleevent_trigger_and_what_it_let_through(
        database, tmp_path, clock):
    ledger = Ledger(tmp_path / "ledger")
    with registry.override(_gated("trg", ledger)):
        s = schedule_create("guarded", "trg", {}, by="alice", now=clock.now(),
                            interval_seconds=60)
        schedule_authorize(s.pk, True, by="dave", now=clock.now())
        schedule_set_enabled(s.pk, False, by="dave", now=clock.now())
    names = _drop_scheduleevent_triggers()
    report = _broken()
    for name in names:
        assert f"trigger {name} is missing" in report, report
    assert f"schedule {s.pk}" not in report  # the chain itself is intact so far

    # With the trigger gone, the authorization's event is rewritten to name someone else.
    ScheduleEvent.objects.filter(schedule_id=s.pk, seq=2).update(actor="mallory")
    report = _broken()
    assert f"schedule {s.pk} (guarded): its chain breaks at event #2" in report, report
    # And the last event deleted: the head the row records has no event.
    ScheduleEvent.objects.filter(schedule_id=s.pk, seq=2).update(actor="dave")
    assert f"schedule {s.pk}" not in _broken()
    ScheduleEvent.objects.filter(schedule_id=s.pk, seq=3).delete()
    report = _broken()
    assert f"schedule {s.pk} (guarded): records head #3, its events end at #2" in report, report


# -- manage.py schedule ------------------------------------------------------------------------


def schedule_cmd(*args: str) -> str:
    out = io.StringIO()
    call_command("schedule", *args, stdout=out, stderr=out)
    return out.getvalue()


def _refused(*args: str) -> str:
    with pytest.raises(CommandError) as err:
        schedule_cmd(*args)
    return str(err.value)


def test_schedule_command_add_list_enable_disable_authorize_remove(database):
    assert schedule_cmd("list").strip() == "no schedules"
    out = schedule_cmd("add", "greet", "hello", "--every", "3600", "--input",
                       '{"name": "Ada"}', "--by", "alice")
    s = Schedule.objects.get(name="greet")
    assert out.startswith(f"schedule greet (id {s.pk}): next run at ")
    assert '{"name":"Ada"}' in out.replace(" ", "")
    assert (s.agent, s.input, s.interval_seconds, s.cron, s.enabled) == (
        "hello", {"name": "Ada"}, 3600, "", True)
    schedule_cmd("add", "berlin", "hello", "--cron", "30 2 * * *", "--timezone",
                 "Europe/Berlin", "--disabled")  # --by defaults to this OS user
    b = Schedule.objects.get(name="berlin")
    assert (b.cron, b.timezone, b.enabled, b.interval_seconds) == (
        "30 2 * * *", "Europe/Berlin", False, None)
    assert _chain(b.pk)[0].actor == getpass.getuser()

    lines = schedule_cmd("list").splitlines()
    assert [line.split("\t")[0] for line in lines] == ["berlin", "greet"]
    assert lines[0].split("\t")[1:5] == ["hello", "30 2 * * * (Europe/Berlin)", "disabled",
                                         "next -"]
    assert lines[1].split("\t")[1:4] == ["hello", "every 3600s", "enabled"]
    assert lines[1].endswith("asks a person")

    assert schedule_cmd("enable", "berlin", "--by", "bob").strip() == "schedule berlin: enabled"
    assert schedule_cmd("disable", "greet", "--by", "bob").strip() == "schedule greet: disabled"
    assert Schedule.objects.get(name="berlin").enabled is True
    assert Schedule.objects.get(name="greet").enabled is False

    # authorize without --confirm explains what it would do and changes nothing
    message = _refused("authorize", "greet", "--by", "carol")
    assert "--confirm" in message and "hello" in message
    assert Schedule.objects.get(name="greet").authorize_side_effects is False
    assert "schedule.authorized" not in [e.kind for e in _chain(s.pk)]

    schedule_cmd("authorize", "greet", "--confirm", "--by", "carol")
    s = Schedule.objects.get(name="greet")
    assert s.authorize_side_effects is True and s.authorized_by == "carol"
    assert _chain(s.pk)[-1].kind == "schedule.authorized" and _chain(s.pk)[-1].actor == "carol"
    greet = next(line for line in schedule_cmd("list").splitlines() if line.startswith("greet"))
    assert "side effects authorized by carol at " in greet

    schedule_cmd("unauthorize", "greet", "--by", "erin")
    s = Schedule.objects.get(name="greet")
    assert s.authorize_side_effects is False and _chain(s.pk)[-1].actor == "erin"

    schedule_cmd("remove", "greet", "--by", "frank")
    assert [line.split("\t")[0] for line in schedule_cmd("list").splitlines()] == ["berlin"]
    assert "no schedule named 'greet'" in _refused("enable", "greet")
    assert "no schedule named 'greet'" in _refused("remove", "greet")
    assert [e.kind for e in _chain(s.pk)] == [
        "schedule.created", "schedule.disabled", "schedule.authorized",
        "schedule.unauthorized", "schedule.removed"]
    assert list(schedules_problems()) == []


@pytest.mark.parametrize("args,says", [
    (("add", "x", "hello", "--cron", "61 * * * *"), "cron: '61 * * * *' is not a cron"),
    (("add", "x", "hello", "--cron", "* * *"), "cron: '* * *' is not a cron"),
    (("add", "x", "nobody", "--every", "60"), "unknown agent 'nobody'"),
    (("add", "x", "hello", "--every", "60", "--timezone", "Mars/Olympus"),
     "timezone: 'Mars/Olympus' is not a time zone"),
    (("add", "x", "hello", "--every", "60", "--input", "{nope"), "--input is not valid JSON"),
    (("add", "x", "hello", "--every", "-5"), "interval_seconds: an interval is a whole number"),
    (("add", "x", "hello", "--every", "60", "--cron", "* * * * *"), "not allowed with"),
    (("add", "x", "hello"), "one of the arguments --cron --every is required"),
    (("enable", "nothing"), "no schedule named 'nothing'"),
    (("authorize", "nothing", "--confirm"), "no schedule named 'nothing'"),
])
def test_schedule_command_refuses_bad_input_writing_nothing(database, args, says):
    message = _refused(*args)
    assert says in message, message
    assert not Schedule.objects.exists() and not ScheduleEvent.objects.exists()


def test_an_interval_of_zero_is_refused_as_a_bad_interval(database):
    """``--every 0`` is an interval, and a bad one: the error names the interval, not "give
    either a cron expression or an interval, not both and not neither"."""
    with pytest.raises(InvalidSchedule) as err:
        timing("", 0, "UTC")
    assert err.value.field == "interval_seconds", err.value
    message = _refused("add", "x", "hello", "--every", "0")
    assert "interval_seconds: an interval is a whole number" in message, message
    assert not Schedule.objects.exists() and not ScheduleEvent.objects.exists()


def test_schedule_command_refuses_a_duplicate_name(database):
    schedule_cmd("add", "once", "hello", "--every", "60", "--by", "alice")
    assert "a schedule named 'once' exists" in _refused("add", "once", "hello", "--every", "5")
    assert Schedule.objects.get().interval_seconds == 60
    assert ScheduleEvent.objects.count() == 1


@pytest.mark.slow
def test_schedule_command_as_a_process_exits_non_zero_on_bad_input(database, tmp_path):
    env = {**os.environ, "DATABASE_URL": database.url, "RUNTIME_TEST_DIR": str(tmp_path)}

    def manage(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "manage.py", "schedule", *args], cwd=ROOT,
                              env=env, capture_output=True, text=True, timeout=60)

    bad = manage("add", "x", "hello", "--cron", "not a cron")
    assert bad.returncode == 1 and "is not a cron expression" in bad.stderr
    ok = manage("add", "x", "hello", "--every", "60", "--by", "alice")
    assert ok.returncode == 0, ok.stderr
    listed = manage("list")
    assert listed.returncode == 0 and listed.stdout.startswith("x\thello\tevery 60s\tenabled")
    assert Schedule.objects.get().created_by == "alice"

