"""The admin's search box and filters accept only what its indexes serve: ``?q=`` is a run id
(ASCII digits that fit a 64-bit id) or, on the audit log, an exact actor; anything else matches
nothing without error. Query-string lookups are the declared filters' own (and the run id on
the audit log); any other (``?actor__regex=``, ``?payload__contains=``, ``?id__gt=``) is refused
with Django's 400 before a query reads the table, never a scan or a 500."""

from __future__ import annotations

import re
from html import unescape

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from runtime.admin.pages import MAX_ID, run_id_term
from runtime.models import Approval, Event, Run, Step, Worker
from tests.console.conftest import client_for

LISTS = {"event": Event, "run": Run, "step": Step, "approval": Approval}


@pytest.fixture
def superuser(make_user):
    client = client_for(make_user("root", superuser=True))
    client.raise_request_exception = False  # a server error is a 500 to assert on, not raised
    return client


def rows(response) -> list:
    return list(response.context["cl"].result_list)


@pytest.mark.parametrize(("text", "expected"), [
    ("12", 12), (" #12 ", 12), ("0", 0), (str(MAX_ID), MAX_ID), (str(MAX_ID + 1), None),
    ("9" * 25, None), ("²", None), ("١٢", None), ("12a", None), ("-1", None), ("1_000", None),
    ("+1", None), ("", None), ("#", None),
])
def test_run_id_term_takes_ascii_digits_that_fit_an_id(text, expected):
    assert run_id_term(text) == expected


@pytest.mark.parametrize("model", LISTS)
@pytest.mark.parametrize("q", ["²", "9" * 25, str(MAX_ID), str(MAX_ID + 1), "١٢", "12a",
                               "%C2%B2%C2%B2"])
def test_search_for_anything_but_a_run_id_matches_nothing_without_error(interrupted, superuser,
                                                                       model, q):
    interrupted()
    response = superuser.get(f"/admin/runtime/{model}/?q={q}")
    assert response.status_code == 200
    assert rows(response) == []


@pytest.mark.parametrize("model", LISTS)
def test_search_by_run_id_finds_that_runs_rows(interrupted, superuser, model):
    first, second = interrupted(), interrupted()
    for q in (str(second.run.pk), f"%23{second.run.pk}"):  # 12 or #12
        found = rows(superuser.get(f"/admin/runtime/{model}/?q={q}"))
        run_ids = {r.pk if model == "run" else r.run_id for r in found}
        assert run_ids == {second.run.pk}, q
    assert first.run.pk != second.run.pk


def test_event_search_for_other_text_is_an_exact_actor(interrupted, superuser):
    interrupted()
    by_actor = rows(superuser.get("/admin/runtime/event/?q=worker-b"))
    assert by_actor and {e.actor for e in by_actor} == {"worker-b"}
    assert rows(superuser.get("/admin/runtime/event/?q=worker")) == []  # exactly, no LIKE


def test_worker_list_has_no_search_and_ignores_q(interrupted, superuser):
    response = superuser.get("/admin/runtime/worker/?q=12")
    assert response.status_code == 200
    assert len(rows(response)) == Worker.objects.count()


BAD_LOOKUPS = {
    "event": ["actor__regex=a", "payload__contains=x", "id__gt=1", "kind__startswith=step",
              "seq__gte=1", "run__agent=pay", "run__id__gt=1", "run=1", "run_id=1",
              "at__year=2026", "hash=abc", "status=waiting"],
    "run": ["agent__regex=a", "input__contains=x", "id__gt=1", "status__in=queued,waiting",
            "created_by=olga", "output__isnull=True", "lease_owner__startswith=w"],
    "step": ["arguments__contains=x", "id__gt=1", "tool=send", "run__id__exact=1",
             "error__icontains=x", "status__regex=."],
    "approval": ["result__contains=x", "id__gt=1", "tool__regex=.", "decided_by=olga",
                 "run__agent__regex=.", "digest=abc", "run__id__exact=1"],
}
# The SQL a refused lookup would have run, to show it never did.
SQL_OF = {"regex": "REGEXP", "contains": "LIKE", "startswith": "LIKE", "icontains": "LIKE",
          "gt": " > ", "gte": " >= ", "in": " IN ", "year": "BETWEEN", "isnull": "IS NULL"}


@pytest.mark.parametrize(("model", "lookup"),
                         [(m, q) for m, qs in BAD_LOOKUPS.items() for q in qs])
def test_lookups_other_than_the_declared_filters_are_refused_before_any_query(
        interrupted, superuser, model, lookup):
    interrupted()
    table = LISTS[model]._meta.db_table
    with CaptureQueriesContext(connection) as ctx:
        response = superuser.get(f"/admin/runtime/{model}/?{lookup}")
    assert response.status_code == 400, (lookup, response.status_code)
    key = lookup.split("=", 1)[0]
    statements = [q["sql"] for q in ctx.captured_queries]
    assert not [s for s in statements if f'"{table}"' in s], statements  # the table unread
    operator = SQL_OF.get(key.rsplit("__", 1)[-1])
    if operator:
        assert not [s for s in statements if operator in s and "runtime_" in s], statements
    again = superuser.get(f"/admin/runtime/{model}/?{lookup}&e=1")  # no way around it
    assert again.status_code == 400


GOOD_LOOKUPS = {
    "event": ["kind=step.started", "actor=worker-a",
              "at__gte=2026-01-01+00%3A00%3A00%2B00%3A00&at__lt=2036-01-01+00%3A00%3A00%2B00%3A00",
              "run__id__exact={run}", "run__id__exact={run}&kind=step.started&o=-2"],
    "run": ["status=waiting", "status__exact=waiting", "agent=pay", "failure_code__exact=",
            "status__exact=waiting&agent=pay&o=0"],
    "step": ["status=interrupted", "status__exact=interrupted", "effect__exact=side_effect"],
    "approval": ["status=pending", "status__exact=pending", "kind__exact=interrupted_side_effect",
                 "agent=pay"],
}


@pytest.mark.parametrize(("model", "query"),
                         [(m, q) for m, qs in GOOD_LOOKUPS.items() for q in qs])
def test_the_declared_filters_still_filter(interrupted, superuser, model, query):
    w = interrupted()
    response = superuser.get(f"/admin/runtime/{model}/?{query.format(run=w.run.pk)}")
    assert response.status_code == 200
    assert rows(response), query


@pytest.mark.parametrize("model", [*LISTS, "worker"])
def test_every_filter_link_a_list_offers_is_accepted(interrupted, superuser, model):
    """Each choice in the filter sidebar is a lookup the list accepts: the allowed set is
    derived from the declared filters, not written out beside them."""
    w = interrupted()
    urls = [f"/admin/runtime/{model}/"]
    if model == "event":
        urls.append(f"/admin/runtime/event/?run__id__exact={w.run.pk}")
    for url in urls:
        html = superuser.get(url).content.decode()
        sidebar = html.split('id="changelist-filter"', 1)[1] if model != "worker" else ""
        links = {unescape(h) for h in re.findall(r'href="(\?[^"]*)"', sidebar)}
        assert links or model == "worker"
        for link in links:
            response = superuser.get(f"/admin/runtime/{model}/{link}")
            assert response.status_code == 200, (link, response.status_code)


@pytest.mark.parametrize("model", LISTS)
@pytest.mark.parametrize("query", ["o=²", "o=" + "9" * 25, "o=-²", "p=²", "p=" + "9" * 25,
                                   "p=-3", "_facets=True", "e=1", "all="])
def test_odd_paging_and_sorting_parameters_never_fail(interrupted, superuser, model, query):
    interrupted()
    assert superuser.get(f"/admin/runtime/{model}/?{query}").status_code == 200


@pytest.mark.parametrize("value", ["²", "9" * 25, "abc"])
def test_an_odd_run_id_filter_gets_djangos_incorrect_lookup_handling(interrupted, superuser,
                                                                      value):
    interrupted()
    response = superuser.get(f"/admin/runtime/event/?run__id__exact={value}")
    assert response.status_code in (200, 302)  # empty, or Django's "?e=1" redirect
    if response.status_code == 200:
        assert rows(response) == []
    else:
        assert response["Location"] == "/admin/runtime/event/?e=1"
        assert superuser.get(response["Location"]).status_code == 200
