"""``manage.py demo`` headless: its setup path and chaos mode fill the queue with real
interrupted side effects and policy approvals, and deciding them finishes the runs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.db.utils import OperationalError

from demo import world
from runtime.approvals.decisions import approve, resolve
from runtime.audit.chain import verify
from runtime.models import Approval, Run, Worker
from runtime.selectors.approvals import pending
from tests.procs import ROOT
from tests.waiting import wait_until


def demo(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    env.update(RUNTIME_VAR_DIR=str(tmp_path), RUNTIME_DEMO_DIR=str(tmp_path / "world"),
               CONSOLE_PASSWORD="correct horse battery")
    return subprocess.run([sys.executable, "manage.py", "demo", "--no-server", "--until-quiet",
                           *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=240)


@pytest.mark.slow
def test_the_demo_fills_the_queue_with_real_approvals_of_both_kinds(tmp_path, demo_db):
    first = demo(tmp_path, "--runs", "16", "--chaos", "0.8", "--seed", "3")
    assert first.returncode == 0, first.stdout + first.stderr
    assert "created the operator account: username operator" in first.stdout
    assert "was killed (SIGKILL); restarting it" in first.stdout
    user = get_user_model().objects.get(username="operator")
    assert user.check_password("correct horse battery")
    assert user.has_perm("runtime.decide_approval")
    # In the operators group (schedules too), and allowed the README's API steps.
    assert list(user.groups.values_list("name", flat=True)) == ["operators"]
    assert user.has_perm("runtime.view_schedule") and user.has_perm("runtime.manage_schedule")
    assert user.has_perm("console.add_apitoken") and user.has_perm("runtime.add_run")
    assert "manage.py apitoken create operator --name try-the-api" in first.stdout

    waiting = list(pending())
    assert {"interrupted_side_effect", "policy"} <= {a.kind for a in waiting}
    for approval in waiting:  # the operator checks the outside world, as the console suggests
        found = world.ledger(approval.step.idempotency_key)
        if approval.kind == "interrupted_side_effect" and approval.tool == "issue_refund" \
                and found["refunds"]:
            refund = found["refunds"][0]
            resolve(approval.pk, "operator", {"refund_id": refund["id"],
                                              "amount_cents": refund["amount_cents"],
                                              "duplicate": False}, "found it at the provider")
        else:
            approve(approval.pk, "operator", "checked: run it")

    second = demo(tmp_path, "--runs", "0", "--chaos", "0")
    assert second.returncode == 0, second.stdout + second.stderr
    assert "operator account: operator (password as set before)" in second.stdout
    assert set(Run.objects.values_list("status", flat=True)) == {"succeeded"}
    assert not pending().exists()

    # The outside world: one refund per run (the provider honours idempotency keys), and a
    # mail sent twice only where a person approved a re-run of an interrupted send.
    ledger = world.ledger()
    assert len(ledger["refunds"]) == Run.objects.count()
    mails_by_key: dict[str, int] = {}
    for mail in ledger["mails"]:
        mails_by_key[mail["idempotency_key"]] = mails_by_key.get(mail["idempotency_key"], 0) + 1
    for key, sent in mails_by_key.items():
        approved = Approval.objects.filter(step__idempotency_key=key, status="consumed",
                                           kind="interrupted_side_effect").count()
        assert sent <= 1 + approved, key


@pytest.mark.slow
def test_the_demo_runs_the_refund_desk_as_a_pydantic_ai_agent(tmp_path, demo_db):
    """``--agent pydantic-ai``: the same desk under chaos, its crashes settled by the same
    contract; after the decisions every run has refunded once."""
    first = demo(tmp_path, "--agent", "pydantic-ai", "--runs", "8", "--chaos", "0.8",
                 "--seed", "5")
    assert first.returncode == 0, first.stdout + first.stderr
    assert set(Run.objects.values_list("agent", flat=True)) == {"refund-desk-pai"}
    assert "was killed (SIGKILL); restarting it" in first.stdout
    waiting = list(pending())
    assert waiting, first.stdout  # refunds above the limit ask first; crashes ask after
    for approval in waiting:
        approve(approval.pk, "operator", "checked: run it")
    second = demo(tmp_path, "--agent", "pydantic-ai", "--runs", "0", "--chaos", "0")
    assert second.returncode == 0, second.stdout + second.stderr
    while pending().exists():  # an approved re-run may stop at the next large refund's gate
        for approval in pending():
            approve(approval.pk, "operator", "checked: run it")
        again = demo(tmp_path, "--agent", "pydantic-ai", "--runs", "0", "--chaos", "0")
        assert again.returncode == 0, again.stdout + again.stderr
    assert set(Run.objects.values_list("status", flat=True)) == {"succeeded"}
    refunds = world.ledger()["refunds"]
    assert len(refunds) == Run.objects.count()  # the provider honours idempotency keys
    assert all(verify(pk).ok for pk in Run.objects.values_list("pk", flat=True))


def test_bad_options_are_refused_before_anything_is_written(tmp_path, monkeypatch):
    done = demo(tmp_path, "--chaos", "2")
    assert done.returncode == 1 and "--chaos" in done.stderr
    monkeypatch.delenv("RUNTIME_LLM_BASE_URL", raising=False)
    monkeypatch.delenv("RUNTIME_LLM_MODEL", raising=False)
    real_llm = demo(tmp_path, "--llm", "openai")
    assert real_llm.returncode == 1
    assert "needs RUNTIME_LLM_BASE_URL, RUNTIME_LLM_MODEL" in real_llm.stderr
    assert not (tmp_path / "runtime.sqlite3").exists()
    assert not (tmp_path / "world").exists()


def _worker_pids(count: int) -> list[int] | None:
    try:  # the demo creates the tables first
        pids = list(Worker.objects.values_list("pid", flat=True))
    except OperationalError:
        return None
    return pids if len(pids) == count else None


@pytest.mark.slow
def test_killing_the_demo_leaves_no_worker_behind(tmp_path, demo_db):
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    env.update(RUNTIME_VAR_DIR=str(tmp_path), RUNTIME_DEMO_DIR=str(tmp_path / "world"))
    demo_proc = subprocess.Popen([sys.executable, "manage.py", "demo", "--no-server", "--runs",
                                  "0", "--chaos", "0"], cwd=ROOT, env=env,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        pids = wait_until(lambda: _worker_pids(2), timeout=60, what="two workers")
    finally:
        os.kill(demo_proc.pid, signal.SIGKILL)  # no chance to stop its children itself
        demo_proc.wait(10)
    wait_until(lambda: not any(Path(f"/proc/{pid}").exists() and "Z" not in Path(
        f"/proc/{pid}/stat").read_text().split(") ")[1][:1] for pid in pids), timeout=30,
        what="the workers to end with their supervisor")
