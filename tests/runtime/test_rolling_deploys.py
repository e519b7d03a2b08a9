"""Rolling deploys: a worker claims and takes over runs of the agents it has, and only those, so
a worker of an older release (one that lacks a new agent) leaves that agent's runs to a worker
that has it instead of failing them for good ("unknown agent"); the workers' rows say which
agents each has, and the selector tells which agents no live worker has.

An "old" worker here is a real ``runworker`` whose ``RUNTIME_AGENTS`` leaves out
``tests.agents.AGENTS``: it has the settings' agents (``hello``, the demo's) but not
``steps5`` or ``slow``."""

from __future__ import annotations

import signal
from datetime import timedelta

import pytest
from django.utils import timezone

from runtime import selectors, start
from runtime.agents.agent import registry
from runtime.models import Event, Run, Worker
from tests import agents
from tests.waiting import wait_until

pytestmark = pytest.mark.engines

OLD_RELEASE = {"RUNTIME_AGENTS": ""}  # the settings' agents alone: no tests.agents


def _status(run_id: int) -> str:
    return Run.objects.get(pk=run_id).status


def _registered(name: str) -> Worker:
    return wait_until(lambda: Worker.objects.filter(name=name).first(),
                      what=f"worker {name} to register")


def _stop(*workers) -> None:
    for w in workers:
        w.signal(signal.SIGTERM)
    for w in workers:
        assert w.wait() == 0, w.output()


def test_a_worker_leaves_runs_of_an_agent_it_lacks_to_a_worker_that_has_it(database, tmp_path,
                                                                           spawn):
    with registry.override(*agents.AGENTS):
        new_agent_runs = [start("steps5", {"i": i}) for i in range(3)]
    old = spawn("--name", "old", env=OLD_RELEASE)
    row = _registered("old")
    assert "hello" in row.agents and "steps5" not in row.agents  # what it registered it has
    # The old worker claims what it has: a run queued after the others, oldest first, so the
    # round that claims it looked at the older runs first and left them.
    hello = start("hello", {"name": "n"})
    wait_until(lambda: _status(hello.pk) == "succeeded", what="the old worker's own run")
    ids = [r.pk for r in new_agent_runs]
    assert {_status(pk) for pk in ids} == {"queued"}
    assert not Event.objects.filter(run_id__in=ids).exclude(kind="run.created").exists()
    assert selectors.agents_without_live_worker(["steps5", "hello"], timezone.now()) == {
        "steps5"}

    new = spawn("--name", "new")
    assert "steps5" in _registered("new").agents
    wait_until(lambda: {_status(pk) for pk in ids} == {"succeeded"}, what="the new worker")
    takers = {e.actor.split("@")[0] for e in Event.objects.filter(run_id__in=ids,
                                                                  kind="lease.taken")}
    assert takers == {"new"}
    assert not Event.objects.filter(run_id__in=ids, kind="run.failed").exists()
    assert selectors.agents_without_live_worker(["steps5"], timezone.now()) == set()
    _stop(old, new)
    assert "unknown agent" not in old.output()


def test_a_worker_never_takes_over_a_run_of_an_agent_it_lacks(database, tmp_path, spawn):
    """Even when the run's owner is provably dead (same host): the run waits for a worker
    that has its agent, and the console says so once the lease is gone."""
    with registry.override(*agents.AGENTS):
        run = start("slow", {})
    first = spawn("--name", "first", "--lease-seconds", "2")
    wait_until(lambda: (tmp_path / f"entered-slow_read-{run.pk}-1").exists(),
               what="the tool to start")
    owner = Run.objects.get(pk=run.pk).lease_owner
    first.kill()  # its row stays, its pid is gone: any worker of this host could take over
    old = spawn("--name", "old", env=OLD_RELEASE)
    _registered("old")
    hello = start("hello", {"name": "n"})  # the old worker's claim rounds go on past the run
    wait_until(lambda: _status(hello.pk) == "succeeded", what="the old worker's own run")
    page = wait_until(lambda: (r := selectors.run_for_page(run.pk)) is not None
                      and r.lease_gone and r, what="the dead owner's lease to lapse")
    held = Run.objects.get(pk=run.pk)
    assert held.status == "running" and held.lease_owner == owner
    assert not Event.objects.filter(run_id=run.pk, kind="lease.taken_over").exists()
    assert selectors.runs_without_worker([page], timezone.now()) == {run.pk: "slow"}

    (tmp_path / "release-slow_read").touch()
    new = spawn("--name", "new")
    wait_until(lambda: _status(run.pk) == "succeeded", what="the takeover by the new worker")
    taken = Event.objects.get(run_id=run.pk, kind="lease.taken_over")
    assert taken.actor.startswith("new@") and taken.payload["previous_owner"] == owner
    _stop(old, new)


def test_which_agents_no_live_worker_has(database):
    """The selector, against rows as workers register them (a JSON list each)."""
    now = timezone.now()
    made = {"w1": (["a", "b"], 0), "w2": (["c"], 0), "gone": (["d"], 60), "none": ([], 0)}
    for owner, (has, age) in made.items():
        Worker.objects.create(owner=owner, host="h", pid=1, lease_seconds=30, agents=has,
                              started_at=now, heartbeat_at=now - timedelta(seconds=age))
    assert selectors.agents_without_live_worker(["a", "b", "c", "d", "e"], now) == {"d", "e"}
    assert selectors.agents_without_live_worker([], now) == set()
    later = now + timedelta(seconds=45)  # every heartbeat older than its lease by then
    assert selectors.agents_without_live_worker(["a"], later) == {"a"}
