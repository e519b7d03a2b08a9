"""The admin (runtime/admin.py): every runtime table read-only for everyone, the audit log
browsable by time, kind, actor, date and run, and never a COUNT over a whole table."""

from __future__ import annotations

import re

import pytest
from django.db import connection

from runtime.admin import COUNT_CAP, BoundedCountPaginator
from runtime.models import Event
from tests.console.conftest import client_for, sql_log

MODELS = ["event", "run", "step", "approval", "worker"]


@pytest.fixture
def superuser(make_user):
    return client_for(make_user("root", superuser=True))


def counts(statements: list[str]) -> list[str]:
    return [s for s in statements if "COUNT(" in s.upper()]


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
    assert "?kind=step.interrupted" in html and "?actor=worker-b" in html
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
    assert counts(unfiltered) == [], counts(unfiltered)
    assert cl.result_count == Event.objects.count()  # the max-id estimate is exact here
    with sql_log() as filtered:
        superuser.get("/admin/runtime/event/?kind=step.started&q=1")
    for sql in counts(filtered):  # bounded: COUNT over a LIMITed subquery, never the table
        assert re.search(r"LIMIT \d+", sql, re.I), sql
    with sql_log() as runs:
        superuser.get("/admin/runtime/run/")
    assert counts(runs) == []


def test_bounded_count_paginator(interrupted):
    for _ in range(2):
        interrupted()
    everything = Event.objects.order_by("-id")
    assert BoundedCountPaginator(everything, 10).count == everything.count()
    some = Event.objects.filter(kind="step.started").order_by("-id")
    assert BoundedCountPaginator(some, 10).count == some.count()
    with sql_log() as statements:
        BoundedCountPaginator(some, 10).count  # noqa: B018
    assert f"LIMIT {COUNT_CAP}" in statements[0]


def test_viewer_without_staff_cannot_open_the_admin(viewer):
    response = viewer.get("/admin/runtime/event/")
    assert response.status_code == 302 and "/admin/login/" in response["Location"]


@pytest.mark.parametrize(("query", "index"), [("kind=step.started", "event_kind_at"),
                                               ("actor=worker-a", "event_actor_at"),
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
