"""The admin (runtime/admin.py): every runtime table read-only for everyone, the audit log
browsable by time, kind, actor, date and run, never a COUNT or a sort over a whole table, and
counts that stopped at their cap say so ("more than N"), deep pages included."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from runtime.admin import base as runtime_admin
from runtime.admin.pages import (
    COUNT_CAP,
    ApprovalAdmin,
    BoundedCountPaginator,
    EventAdmin,
    RunAdmin,
    StepAdmin,
)
from runtime.models import Approval, Event, Run, Step
from runtime.storage.events import EventSpec, build_events, insert_events
from tests.console.conftest import client_for, sql_log

MODELS = ["event", "run", "step", "approval", "worker"]


@pytest.fixture
def superuser(make_user):
    return client_for(make_user("root", superuser=True))


def counts(statements: list[str], table: str) -> list[str]:
    """COUNTs over ``table`` (the nav's pending count, over pending approvals, is not one)."""
    return [s for s in statements if "COUNT(" in s.upper() and f'FROM "{table}"' in s]


@pytest.mark.parametrize("model", MODELS)
def test_runtime_tables_are_read_only_even_for_superusers(interrupted, superuser, model):
    w = interrupted()
    obj = {"event": Event.objects.filter(run=w.run).first().pk, "run": w.run.pk,
           "step": w.approval.step_id, "approval": w.approval.pk, "worker": None}[model]
    base = f"/admin/runtime/{model}/"
    listing = superuser.get(base)
    assert listing.status_code == 200
    html = listing.content.decode()
    assert f"{base}add/" not in html and 'name="action"' not in html  # no add, no bulk delete
    assert superuser.get(f"{base}add/").status_code == 403
    if obj is not None:
        page = superuser.get(f"{base}{obj}/change/")
        assert page.status_code == 200 and 'name="_save"' not in page.content.decode()
        assert superuser.post(f"{base}{obj}/change/", {}).status_code == 403
        assert superuser.get(f"{base}{obj}/delete/").status_code == 403
        assert superuser.post(f"{base}{obj}/delete/", {"post": "yes"}).status_code == 403


def test_event_list_is_newest_first_and_per_run_in_sequence(interrupted, superuser):
    first, second = interrupted(), interrupted()
    listing = superuser.get("/admin/runtime/event/")
    shown = list(listing.context["cl"].result_list)
    assert [e.at for e in shown] == sorted((e.at for e in shown), reverse=True)
    per_run = superuser.get(f"/admin/runtime/event/?run__id__exact={first.run.pk}")
    events = list(per_run.context["cl"].result_list)
    assert {e.run_id for e in events} == {first.run.pk}
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert second.run.pk not in {e.run_id for e in events}


def test_event_search_by_run_id_and_filters(interrupted, superuser):
    first, second = interrupted(), interrupted()
    found = superuser.get(f"/admin/runtime/event/?q={second.run.pk}").context["cl"].result_list
    assert {e.run_id for e in found} == {second.run.pk}
    nothing = superuser.get("/admin/runtime/event/?q=not-a-number")
    assert nothing.status_code == 200 and list(nothing.context["cl"].result_list) == []
    kind = superuser.get("/admin/runtime/event/?kind=approval.requested").context["cl"]
    assert sorted(e.run_id for e in kind.result_list) == [first.run.pk, second.run.pk]
    actor = superuser.get("/admin/runtime/event/?actor=worker-a").context["cl"]
    assert actor.result_list and {e.actor for e in actor.result_list} == {"worker-a"}
    html = superuser.get("/admin/runtime/event/").content.decode()
    assert "?kind=step.interrupted" in html
    assert "?actor=worker-b" not in html  # an actor, not a live worker: found by search
    by_actor = superuser.get("/admin/runtime/event/?q=worker-b").context["cl"].result_list
    assert by_actor and {e.actor for e in by_actor} == {"worker-b"}
    assert len(by_actor) == Event.objects.filter(actor="worker-b").count()
    dated = superuser.get("/admin/runtime/event/?at__gte=2026-01-01+00%3A00%3A00%2B00%3A00"
                          "&at__lt=2026-01-02+00%3A00%3A00%2B00%3A00")
    assert dated.status_code == 200 and len(dated.context["cl"].result_list) > 0


def test_event_detail_escapes_the_payload(interrupted, superuser):
    w = interrupted()
    event = Event.objects.get(run=w.run, kind="step.decided")
    html = superuser.get(f"/admin/runtime/event/{event.pk}/change/").content.decode()
    assert "<script>alert(" not in html and "&lt;script&gt;alert(" in html


def test_event_list_never_counts_the_whole_table(interrupted, superuser):
    interrupted()
    with sql_log() as unfiltered:
        cl = superuser.get("/admin/runtime/event/").context["cl"]
    assert counts(unfiltered, "runtime_event") == [], unfiltered
    assert cl.result_count == Event.objects.count()  # the max-id estimate is exact here
    with sql_log() as filtered:
        superuser.get("/admin/runtime/event/?kind=step.started&q=1")
    for sql in counts(filtered, "runtime_event"):  # bounded: COUNT over a LIMITed subquery
        assert re.search(r"LIMIT \d+", sql, re.I), sql
    with sql_log() as runs:
        superuser.get("/admin/runtime/run/")
    assert counts(runs, "runtime_run") == []
    with sql_log() as facets:  # Django's "Show counts" would count each filter choice
        page = superuser.get("/admin/runtime/event/?_facets=True")
    assert page.status_code == 200 and "Show counts" not in page.content.decode()
    for sql in counts(facets, "runtime_event"):
        assert re.search(r"LIMIT \d+", sql, re.I), sql


def test_bounded_count_paginator(interrupted):
    for _ in range(2):
        interrupted()
    everything = Event.objects.order_by("-id")
    assert BoundedCountPaginator(everything, 10).count == everything.count()
    some = Event.objects.filter(kind="step.started").order_by("-id")
    assert BoundedCountPaginator(some, 10).count == some.count()
    with sql_log() as statements:
        BoundedCountPaginator(some, 10).count  # noqa: B018
    assert f"LIMIT {COUNT_CAP + 1}" in statements[0]  # one past the cap: "more than" is true


def test_viewer_without_staff_cannot_open_the_admin(viewer):
    response = viewer.get("/admin/runtime/event/")
    assert response.status_code == 302 and "/admin/login/" in response["Location"]


@pytest.mark.parametrize(("query", "index"), [("kind=step.started", "event_kind_at"),
                                               ("actor=worker-a", "event_actor_at"),
                                               ("q=worker-a", "event_actor_at"),
                                               ("", "event_at")])
def test_event_list_pages_are_read_through_an_index(interrupted, superuser, query, index):
    """Each way of listing the audit log reads an index in list order, so a page costs the
    same with a million events as with ten, however rare the filtered value."""
    interrupted()
    with sql_log() as statements:
        assert superuser.get(f"/admin/runtime/event/?{query}").status_code == 200
    page = next(s for s in statements if 'FROM "runtime_event"' in s
                and 'ORDER BY "runtime_event"."at" DESC' in s)
    with connection.cursor() as cur:
        plan = " / ".join(row[-1] for row in cur.execute(f"EXPLAIN QUERY PLAN {page}"))
    assert f"INDEX {index}" in plan and "TEMP B-TREE" not in plan, (plan, page)


def append_events(run_id: int, actor: str, n: int = 1, kind: str = "step.started",
                  payload: Any = None, at: datetime | None = None) -> list[int]:
    """Append ``n`` chained events to a run (as the runtime would, minus the run row's update,
    which no admin page reads); returns their ids."""
    last = Event.objects.filter(run_id=run_id).order_by("-seq").first()
    specs = [EventSpec(kind, {"i": i} if payload is None else payload) for i in range(n)]
    rows, _, _ = build_events(run_id, last.seq, last.hash, specs, actor, at or timezone.now())
    insert_events(rows)
    return list(Event.objects.filter(run_id=run_id, seq__gt=last.seq).values_list("id", flat=True))


def page_query(ctx: CaptureQueriesContext, table: str) -> str:
    """The list's page of rows: the ordered SELECT of ``table`` (not the max-id count)."""
    found = [q["sql"] for q in ctx.captured_queries
             if q["sql"].startswith(f'SELECT "{table}"."id"') and "ORDER BY" in q["sql"]
             and "LIMIT 1" not in q["sql"]]
    assert len(found) == 1, ctx.captured_queries
    return found[0]


def order_by(sql: str) -> str:
    return sql.split(" ORDER BY ", 1)[1].split(" LIMIT ", 1)[0]


def plan(sql: str) -> str:
    with connection.cursor() as cur:
        return " / ".join(row[-1] for row in cur.execute(f"EXPLAIN QUERY PLAN {sql}"))


@pytest.mark.parametrize("column", ["seq", "step_index", "kind", "actor", "run_link",
                                    "payload_short"])
def test_event_list_ignores_sorts_no_index_serves(interrupted, superuser, column):
    """?o= on a column no index orders (seq without a run filter among them) is dropped: the
    list keeps its newest-first order, read from the (at) index."""
    interrupted()
    append_events(Event.objects.first().run_id, "worker-a", n=60)  # more than one page
    index = EventAdmin.list_display.index(column)
    for o in (str(index), f"-{index}"):
        with CaptureQueriesContext(connection) as ctx:
            page = superuser.get(f"/admin/runtime/event/?o={o}")
        assert page.status_code == 200
        sql = page_query(ctx, "runtime_event")
        assert order_by(sql) == '"runtime_event"."at" DESC, "runtime_event"."id" DESC', sql
        assert "seq" not in order_by(sql) and "step_index" not in order_by(sql)
        assert "TEMP B-TREE" not in plan(sql)
    html = page.content.decode()
    assert f'class="column-{column}"' in html  # a plain header, no sort link
    assert 'class="sortable column-at_ms' in html


@pytest.mark.parametrize(("query", "index"), [("o=0", "event_at"), ("o=-0", "event_at"),
                                               ("kind=step.started&o=0", "event_kind_at"),
                                               ("actor=worker-a&o=0", "event_actor_at")])
def test_event_list_sorts_by_time_either_way_through_an_index(interrupted, superuser, query,
                                                              index):
    interrupted()
    with CaptureQueriesContext(connection) as ctx:
        assert superuser.get(f"/admin/runtime/event/?{query}").status_code == 200
    sql = page_query(ctx, "runtime_event")
    direction = "DESC" if "o=-0" in query else "ASC"
    assert order_by(sql) == f'"runtime_event"."at" {direction}, "runtime_event"."id" {direction}'
    assert f"INDEX {index}" in plan(sql) and "TEMP B-TREE" not in plan(sql), plan(sql)


def test_one_runs_events_sort_by_seq_through_the_run_seq_index(interrupted, superuser):
    w, _other = interrupted(), interrupted()
    seq = EventAdmin.list_display.index("seq")
    with CaptureQueriesContext(connection) as ctx:
        page = superuser.get(f"/admin/runtime/event/?run__id__exact={w.run.pk}&o=-{seq}")
    events = list(page.context["cl"].result_list)
    expected = list(Event.objects.filter(run=w.run).order_by("-seq").values_list("seq", flat=True))
    assert [e.seq for e in events] == expected and len(expected) > 1
    sql = page_query(ctx, "runtime_event")
    assert order_by(sql).startswith('"runtime_event"."seq" DESC')
    assert "event_run_seq" in plan(sql) or "autoindex_runtime_event_1" in plan(sql), plan(sql)
    assert "TEMP B-TREE" not in plan(sql)
    assert 'class="sortable column-seq' in page.content.decode()


@pytest.mark.parametrize(("model_admin", "model"), [(RunAdmin, Run), (StepAdmin, Step),
                                                    (ApprovalAdmin, Approval)])
def test_run_step_and_approval_lists_sort_by_id_only(interrupted, superuser, model_admin, model):
    """At 100k runs, a sort by agent, status or time would read and sort the whole table."""
    interrupted()
    name, table = model._meta.model_name, model._meta.db_table
    for index, column in enumerate(model_admin.list_display):
        with CaptureQueriesContext(connection) as ctx:
            assert superuser.get(f"/admin/runtime/{name}/?o={index}").status_code == 200
        expected = "ASC" if column == "id" else "DESC"
        assert order_by(page_query(ctx, table)) == f'"{table}"."id" {expected}', column


@pytest.fixture
def small_cap(monkeypatch) -> int:
    """A count cap of 20 and pages of 5 rows, so a few dozen events go past the cap."""
    monkeypatch.setattr(runtime_admin, "COUNT_CAP", 20)
    monkeypatch.setattr(EventAdmin, "list_per_page", 5)
    return 20


def test_a_capped_count_says_more_than(interrupted, superuser, small_cap):
    run_id = interrupted().run.pk
    append_events(run_id, "worker-a", n=60)
    total = Event.objects.filter(kind="step.started").count()
    assert total > small_cap + 20
    page = superuser.get("/admin/runtime/event/?kind=step.started")
    html = page.content.decode()
    assert page.context["cl"].result_count_capped
    assert f"more than {small_cap} events" in html
    assert not re.search(rf"(?<!more than ){small_cap} events", html)  # never the cap as total
    searched = superuser.get(f"/admin/runtime/event/?q={run_id}").content.decode()
    assert f"more than {small_cap} events" in searched  # the search box's count too
    exact = superuser.get("/admin/runtime/event/").content.decode()  # unfiltered: the max id
    assert f"{Event.objects.count():,} events" in exact and "more than" not in exact


def test_a_deep_page_of_a_filtered_list_keeps_its_filter(interrupted, superuser, small_cap):
    run_id = interrupted().run.pk
    append_events(run_id, "worker-a", n=100)
    ordered = list(Event.objects.filter(kind="step.started").order_by("-at", "-id")
                   .values_list("id", flat=True))
    for number in (10, 12):  # rows 46-50 and 56-60: past the cap of 20 rows
        page = superuser.get(f"/admin/runtime/event/?kind=step.started&p={number}")
        assert page.status_code == 200 and "e=1" not in page.get("Location", "")
        cl = page.context["cl"]
        assert [e.pk for e in cl.result_list] == ordered[(number - 1) * 5:number * 5]
        assert cl.params == {"kind": "step.started"} and cl.page_num == number
        html = page.content.decode()
        assert f"?kind=step.started&amp;p={number + 1}" in html  # links keep the filter
        assert "more than" in html
    past_the_end = superuser.get("/admin/runtime/event/?kind=step.started&p=999")
    cl = past_the_end.context["cl"]  # the last page, still filtered, the count now exact
    assert past_the_end.status_code == 200 and cl.params == {"kind": "step.started"}
    assert [e.pk for e in cl.result_list] == ordered[(cl.page_num - 1) * 5:]
    assert cl.result_count == len(ordered) and not cl.result_count_capped


def test_a_deep_pages_count_is_bounded_by_the_page(interrupted, small_cap):
    """Page n counts at most (n + 3) pages of rows: what its own OFFSET reads anyway."""
    run_id = interrupted().run.pk
    append_events(run_id, "worker-a", n=60)
    some = Event.objects.filter(kind="step.started").order_by("-id")
    paginator = BoundedCountPaginator(some, 5)
    paginator.wanted_page = 6
    with sql_log() as statements:
        assert paginator.count == 45 and paginator.capped  # (6 + 3) * 5 rows, and more
    assert "LIMIT 46" in statements[0]
