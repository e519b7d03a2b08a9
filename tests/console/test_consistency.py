"""One way of saying each thing across the console: costs with their unit, times to the second
in UTC, a channel's kind only when its name does not already say it, the outside-world link
only for agents that have one, and a refused request logged on one line."""

from __future__ import annotations

import logging
import re
from datetime import UTC, datetime
from decimal import Decimal

import pytest
from django.test import Client

from console.templatetags.console import cost, utc, utc_clock
from runtime.models import Run

TIME = re.compile(r'<time datetime="(\d{4}-\d\d-\d\dT[\d:.]+\+00:00)"[^>]*>([^<]*)</time>')


@pytest.mark.parametrize(("value", "shown"), [
    (Decimal("0"), "$0.00"), (Decimal("0.000000"), "$0.00"), (Decimal("0.0123"), "$0.0123"),
    (Decimal("0.000150"), "$0.00015"), (Decimal("12.5"), "$12.50"), (Decimal("3"), "$3.00"),
    ("0.0000", "$0.00"), (None, "—")])
def test_a_cost_is_dollars_with_at_least_two_decimals(value, shown):
    assert cost(value) == shown


def test_a_time_is_utc_to_the_second_in_a_time_element():
    moment = datetime(2026, 12, 3, 20, 11, 8, 456789, tzinfo=UTC)
    assert str(utc(moment)) == ('<time datetime="2026-12-03T20:11:08.456789+00:00">'
                                '2026-12-03 20:11:08 UTC</time>')
    assert str(utc("2026-12-03T20:11:08.456789+00:00")) == str(utc(moment))  # ISO text too
    assert utc("not a time") == "not a time" and utc(None) == "—"
    assert ">20:11:08</time>" in str(utc_clock(moment))


def test_the_run_pages_show_cost_and_times_one_way(interrupted, operator):
    w = interrupted()
    Run.objects.filter(pk=w.run.pk).update(cost=Decimal("0.012345"))
    for path in ("/runs/", f"/runs/{w.run.pk}/"):
        html = operator.get(path).content.decode()
        assert re.search(r'data-testid="cost">\$0\.012345<', html), path
        # What people read as the page's own words: no attributes, no recorded payloads.
        text = re.sub(r"<[^>]*>", " ", re.sub(r"<code[^>]*>.*?</code>", "", html, flags=re.S))
        assert not re.search(r"\d\d:\d\d:\d\d\.\d", text), path  # no fractions of a second
        assert not re.search(r"\d{4}-\d\d-\d\dT\d", text), path  # no raw ISO
        assert "0.0000" not in text, path
    html = operator.get(f"/runs/{w.run.pk}/").content.decode()
    shown = TIME.findall(html)
    moment_or_age = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC|\d\d:\d\d:\d\d|\d+[dhms]( \d+[hms])?"
    assert shown and all(re.fullmatch(moment_or_age, text) for _, text in shown), shown
    assert "UTC UTC" not in html


def test_a_channel_named_as_its_kind_is_not_repeated(settings, interrupted, operator):
    settings.RUNTIME = {**settings.RUNTIME, "NOTIFY": [
        {"name": "webhook", "kind": "webhook", "target": "http://127.0.0.1:9/hook"},
        {"name": "ops-mail", "kind": "email", "target": "ops@example.com"}]}
    w = interrupted()
    html = operator.get(f"/approvals/{w.approval.pk}/").content.decode()
    cells = re.findall(r'<td data-label="Channel">(.*?)</td>', html, re.S)
    assert sorted(cells) == ['ops-mail <span class="hint">(email)</span>', "webhook"], cells


def test_the_demos_outside_world_is_linked_only_from_the_demos_agents(interrupted, operator,
                                                                     settings):
    w = interrupted()  # agent "pay": it has no outside world in the demo
    assert settings.CONSOLE_CHECK_URL.startswith("/demo/world/")
    html = operator.get(f"/approvals/{w.approval.pk}/").content.decode()
    assert 'data-testid="check-outside"' not in html
    settings.CONSOLE_CHECK_URL = "https://payments.example.com/search?key={key}"
    settings.CONSOLE_CHECK_AGENTS = None  # a URL set for a deployment: every agent
    html = operator.get(f"/approvals/{w.approval.pk}/").content.decode()
    assert re.search(r'href="https://payments\.example\.com/search\?key=[^"]+" '
                     r'data-testid="check-outside"', html)


def test_a_refused_request_is_logged_on_one_line(viewer, interrupted, caplog):
    """A 403 (a person without the permission) is one line in the server's log, without the
    traceback of the exception that refused it; the configured handler's filter does it."""
    w = interrupted()
    from console.logs import RefusalsOnOneLine

    [handler] = [h for h in logging.getLogger().handlers
                 if any(isinstance(f, RefusalsOnOneLine) for f in h.filters)]
    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if all(f.filter(record) for f in handler.filters):
                lines.append(handler.format(record))

    keep = Keep()
    logging.getLogger("django.request").addHandler(keep)
    try:
        response = viewer.post(f"/approvals/{w.approval.pk}/", {
            "decision": "approve", "approve-confirm": "on"})
    finally:
        logging.getLogger("django.request").removeHandler(keep)
    assert response.status_code == 403
    assert lines and all("\n" not in line for line in lines), lines
    assert "Traceback" not in "".join(lines)


def test_no_api_path_answers_html(interrupted):
    for path in ("/api/approvals", "/api/approvals/1/", "/api/x"):
        response = Client().get(path)
        assert response["Content-Type"].startswith("application/json"), path
