"""The demo's outside world in the console: an approval links to it by idempotency key, and
the page shows what the provider and the mail server recorded (escaped), amounts with their
currency, each call linked back to its run step and approvals, never cached."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import Permission, User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from console.wording import status_word
from demo import world
from demo.agents import AGENTS
from demo.views import origins
from runtime.agents.agent import registry
from runtime.approvals.decisions import approve
from runtime.models import Approval, Step
from runtime.testkit import Crash, CrashPoint, InProcessKit


@pytest.fixture
def operator(sqlite_path, settings, monkeypatch, tmp_path) -> Client:
    settings.STORAGES = {**settings.STORAGES, "staticfiles": {
        "BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"}}
    monkeypatch.setenv("RUNTIME_DEMO_DIR", str(tmp_path / "world"))
    world.setup()
    user = User.objects.create_user("olga")
    user.user_permissions.add(*Permission.objects.filter(
        codename__in=["view_run", "decide_approval"]))
    client = Client()
    client.force_login(user)
    return client


def interrupted_refund(tmp_path, point: CrashPoint) -> Approval:
    kit = InProcessKit(tmp_path / "unused-ledger.jsonl")
    with registry.override(*AGENTS):
        small = next(o for o in world.order_ids()  # below the approval threshold
                     if world.lookup_order(o)["amount_cents"] <= 15000)
        run = kit.start("refund-desk", {"order_id": small})
        kit.crash(run, Crash(point, step_index=2))
        kit.take_over(run)
    return Approval.objects.get(run_id=run, status="pending")


def test_an_approval_links_to_the_outside_world_which_shows_the_refund(operator, tmp_path):
    approval = interrupted_refund(tmp_path, CrashPoint.AFTER_TOOL_EFFECT)  # it went through
    key = approval.step.idempotency_key
    page = operator.get(f"/approvals/{approval.pk}/").content.decode()
    assert f'href="/demo/world/?key={key}"' in page
    found = operator.get("/demo/world/", {"key": key})
    assert found.status_code == 200
    html = found.content.decode()
    assert key in html and "No refund recorded" not in html
    assert len(world.ledger(key)["refunds"]) == 1


def test_a_refund_that_never_reached_the_provider_shows_nothing_under_its_key(operator,
                                                                             tmp_path):
    approval = interrupted_refund(tmp_path, CrashPoint.AFTER_TOOL_DISPATCHED)  # never sent
    html = operator.get("/demo/world/", {"key": approval.step.idempotency_key}).content.decode()
    assert "The provider received no request under this key" in html
    assert "did not take effect" not in html  # it says what it knows: nothing arrived
    back = re.search(r'<p data-testid="key-origin">(.*?)</p>', html, re.S)
    assert back and f'href="/approvals/{approval.pk}/"' in back.group(1), html[-3000:]


def interrupted_mail(tmp_path) -> Approval:
    """A refund run whose mail to the customer was interrupted before it left."""
    kit = InProcessKit(tmp_path / "unused-ledger.jsonl")
    with registry.override(*AGENTS):
        small = next(o for o in world.order_ids()
                     if world.lookup_order(o)["amount_cents"] <= 15000)
        run = kit.start("refund-desk", {"order_id": small})
        kit.crash(run, Crash(CrashPoint.AFTER_TOOL_STARTED, step_index=3))
        kit.take_over(run)
    approval = Approval.objects.get(run_id=run, status="pending")
    assert approval.tool == "send_email"
    return approval


def test_a_mail_that_never_reached_the_server_says_so_and_leads_back(operator, tmp_path):
    """An interrupted send looked up by its key: nothing at the mail server means no mail went
    out with it; the page says that, and links back to the approval that asked."""
    approval = interrupted_mail(tmp_path)
    html = operator.get("/demo/world/", {"key": approval.step.idempotency_key}).content.decode()
    no_mail = re.search(r'<p data-testid="no-mail">(.*?)</p>', html, re.S)
    assert no_mail and "no send with it reached the mail server" in no_mail.group(1)
    back = re.search(r'<p data-testid="key-origin">(.*?)</p>', html, re.S)
    assert back and f'href="/approvals/{approval.pk}/"' in back.group(1)


def test_the_world_page_escapes_what_it_shows_and_needs_a_login(operator, sqlite_path):
    world.send_mail("<script>x</script>@example.com", "hi", "body", key="<b>k</b>")
    html = operator.get("/demo/world/").content.decode()
    assert "<script>x</script>" not in html and "&lt;script&gt;x&lt;/script&gt;" in html
    anonymous = Client().get("/demo/world/")
    assert anonymous.status_code == 302 and "/login/" in anonymous["Location"]


def test_the_world_page_answers_before_the_demo_ever_ran(
        sqlite_path, settings, monkeypatch, tmp_path):
    settings.STORAGES = {**settings.STORAGES, "staticfiles": {
        "BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"}}
    monkeypatch.setenv("RUNTIME_DEMO_DIR", str(tmp_path / "never-set-up"))
    client = Client()
    user = User.objects.create_user("olga")
    client.force_login(user)
    assert client.get("/demo/world/").status_code == 403  # the outside world needs view_run
    user.user_permissions.add(Permission.objects.get(codename="view_run"))
    client.force_login(User.objects.get(pk=user.pk))
    page = client.get("/demo/world/", {"key": "run1-step2-abc"})
    assert page.status_code == 200
    assert "The provider received no request under this key" in page.content.decode()


def _cents(cents: int) -> str:
    """An amount as the page must show it, worked out here and not by the code under test."""
    return f"{cents // 100}.{cents % 100:02d} EUR"


def _row(html: str, testid: str, key: str) -> str:
    """The one table row of kind ``testid`` that shows ``key``."""
    rows = [r for r in re.findall(rf'<tr data-testid="{testid}">(.*?)</tr>', html, re.S)
            if key in r]
    assert len(rows) == 1, (testid, key, rows)
    return rows[0]


def test_amounts_show_their_currency_and_rows_link_back_to_run_and_approval(operator,
                                                                          tmp_path):
    approval = interrupted_refund(tmp_path, CrashPoint.AFTER_TOOL_EFFECT)
    key, run_id = approval.step.idempotency_key, approval.run_id
    cents = approval.arguments["amount_cents"]
    html = operator.get("/demo/world/").content.decode()
    for testid in ("refund-row", "request-row"):
        row = _row(html, testid, key)
        assert f'data-testid="amount">{_cents(cents)}</td>' in row
        assert re.findall(r'href="([^"]+)"', row) == [f"/runs/{run_id}/",
                                                      f"/approvals/{approval.pk}/"]
        assert f"run #{run_id}</a>, step 2" in row
        assert status_word(approval) in row  # "waiting for a decision", in the console's words
    assert f">{cents}<" not in html  # no bare cents anywhere


def test_a_policy_approved_refund_links_its_approval_and_the_mail_only_its_run(operator,
                                                                              tmp_path):
    kit = InProcessKit(tmp_path / "unused-ledger.jsonl")
    with registry.override(*AGENTS):
        big = next(o for o in world.order_ids()  # above the approval threshold
                   if world.lookup_order(o)["amount_cents"] > 15000)
        run_id = kit.start("refund-desk", {"order_id": big})
        kit.take_over(run_id)
        asked = Approval.objects.get(run_id=run_id, status="pending", kind="policy")
        approve(asked.pk, "olga", "checked")
        assert kit.take_over(run_id).status == "succeeded"
    cents = world.lookup_order(big)["amount_cents"]
    assert asked.title == f"Refund {_cents(cents)} on order {big}?"
    refund_key = Step.objects.get(run_id=run_id, index=2).idempotency_key
    mail_key = Step.objects.get(run_id=run_id, index=3).idempotency_key
    html = operator.get("/demo/world/").content.decode()
    refund = _row(html, "refund-row", refund_key)
    asked.refresh_from_db()
    assert asked.status == "consumed"
    assert f'href="/approvals/{asked.pk}/"' in refund and status_word(asked) in refund
    assert f'href="/runs/{run_id}/"' in refund
    mail = _row(html, "mail-row", mail_key)
    assert re.findall(r'href="([^"]+)"', mail) == [f"/runs/{run_id}/"]
    assert f"we refunded {_cents(cents)} for your" in world.ledger(mail_key)["mails"][0]["body"]


def test_only_a_steps_own_key_links_to_it(operator, tmp_path):
    """A key shaped like the runtime's but not any step's (a forged or foreign one) links
    nowhere; nor does a key of another shape."""
    approval = interrupted_refund(tmp_path, CrashPoint.AFTER_TOOL_DISPATCHED)  # never sent
    real = approval.step.idempotency_key
    forged = real[:-4] + "0000" if not real.endswith("0000") else real[:-4] + "1111"
    world.refund(1001, 500, key=forged)
    world.refund(1002, 700, key=f"run{approval.run_id + 1000}-step2-abcdefabcdef")
    world.send_mail("a@example.com", "hi", "body", key="from-another-system")
    html = operator.get("/demo/world/").content.decode()
    assert "/runs/" not in html.split("<main>", 1)[1] and "/approvals/" not in html
    assert _cents(500) in html and _cents(700) in html


def test_looking_up_the_origins_of_many_calls_costs_two_queries(operator, tmp_path):
    approval = interrupted_refund(tmp_path, CrashPoint.AFTER_TOOL_EFFECT)
    keys = [approval.step.idempotency_key] + [f"run{n}-step2-{n:012x}" for n in range(500)]
    with CaptureQueriesContext(connection) as ctx:
        found = origins([*keys, "not-a-runtime-key"])
    assert len(ctx.captured_queries) == 2
    assert list(found) == [approval.step.idempotency_key]
    origin = found[approval.step.idempotency_key]
    assert (origin.run_id, origin.step_index) == (approval.run_id, 2)
    assert [a.pk for a in origin.approvals] == [approval.pk]
    with CaptureQueriesContext(connection) as ctx:
        assert origins(["from-another-system", ""]) == {}
    assert ctx.captured_queries == []


def test_the_world_page_is_never_cached(operator):
    response = operator.get("/demo/world/", {"key": "run1-step2-abc"})
    assert response.status_code == 200
    directives = {d.strip() for d in response["Cache-Control"].split(",")}
    assert {"private", "no-store"} <= directives


def test_money_has_its_unit():
    assert [world.money(c) for c in (24900, 1299, 5, 0)] == [
        "249.00 EUR", "12.99 EUR", "0.05 EUR", "0.00 EUR"]
    assert world.money(None) == "—"
