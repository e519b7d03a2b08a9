"""The audit export in the admin: a form whose submit streams a download that verifies against
the chain and is on record; it needs staff status and ``runtime.export_audit``."""

from __future__ import annotations

import hashlib
import io

import pytest
from playwright.sync_api import expect

from runtime.audit import export as export_module
from runtime.audit.export_check import audit_export_verify
from runtime.models import AuditExport, Event
from tests.console.browser import PHONE, shot
from tests.console.conftest import PASSWORD, client_for

URL = "/admin/runtime/auditexport/export/"
LIST = "/admin/runtime/auditexport/"


@pytest.fixture
def auditor(make_user):
    return client_for(make_user("audrey", "runtime.export_audit", "runtime.view_auditexport",
                                staff=True))


@pytest.fixture
def some_runs(interrupted):
    return [interrupted(), interrupted()]


def download(client, **fields) -> tuple[object, bytes]:
    response = client.post(URL, {"what": "events", "format": "csv", **fields})
    assert response.status_code == 200, response.content[:500]
    body = b"".join(response.streaming_content)
    response.close()
    return response, body


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_the_download_streams_verifies_and_is_recorded(auditor, some_runs, fmt):
    response, body = download(auditor, format=fmt)
    assert response.streaming
    assert response["Content-Disposition"].startswith('attachment; filename="audit-events-')
    assert response["Content-Disposition"].endswith(f'.{fmt}"')
    result = audit_export_verify(io.StringIO(body.decode(), newline=""))
    assert result.ok, result.problems
    assert result.lines == result.verified == Event.objects.count()
    row = AuditExport.objects.get()
    assert (row.by, row.format, row.rows, row.complete) == ("audrey", fmt, result.lines, True)
    assert row.sha256 == hashlib.sha256(body).hexdigest()


def test_filters_reach_the_export_and_its_record(auditor, some_runs):
    run = some_runs[1].run
    _, body = download(auditor, format="jsonl", run=str(run.pk), since="2020-01-01")
    assert len(body.splitlines()) == Event.objects.filter(run_id=run.pk).count()
    assert AuditExport.objects.get().filters == {"run": run.pk,
                                                 "since": "2020-01-01T00:00:00.000000+00:00"}


def test_a_download_cut_short_is_recorded_with_what_was_sent(auditor, some_runs, monkeypatch):
    monkeypatch.setattr(export_module, "CHUNK", 2)
    response = auditor.post(URL, {"what": "events", "format": "jsonl"})
    first = next(iter(response.streaming_content))
    response.close()  # the browser went away
    row = AuditExport.objects.get()
    assert not row.complete and row.rows == len(first.splitlines()) < Event.objects.count()


@pytest.mark.parametrize(("fields", "message"), [
    ({"since": "yesterday"}, "is not an ISO 8601 time"),
    ({"since": "2026-02-01", "until": "2026-01-01"}, "must be later than since"),
    ({"run": "-4"}, "greater than or equal to 1"),
    ({"agent": "a" * 201}, "at most 200 characters"),
    ({"format": "xml"}, "Select a valid choice"),
])
def test_a_bad_input_answers_the_form_with_its_error(auditor, some_runs, fields, message):
    response = auditor.post(URL, {"what": "events", "format": "csv", **fields})
    assert response.status_code == 400
    assert message in response.content.decode()
    assert not AuditExport.objects.exists()


def test_exporting_needs_the_permission(make_user, some_runs):
    staff = client_for(make_user("sam", "runtime.view_event", "runtime.view_auditexport",
                                 staff=True))
    assert staff.get(URL).status_code == 403
    assert staff.post(URL, {"what": "events", "format": "csv"}).status_code == 403
    assert "Export the audit log" not in staff.get(LIST).content.decode()
    not_staff = client_for(make_user("nina", "runtime.export_audit"))
    assert not_staff.post(URL, {"what": "events", "format": "csv"}).status_code == 302
    assert not AuditExport.objects.exists()


def test_the_record_of_exports_is_listed_read_only(auditor, some_runs):
    download(auditor)
    page = auditor.get(LIST)
    assert page.status_code == 200
    html = page.content.decode()
    assert URL in html and AuditExport.objects.get().sha256[:16] in html
    assert f"{LIST}add/" not in html
    form = auditor.get(URL)
    assert form.status_code == 200 and 'name="since"' in form.content.decode()
    change = auditor.get(f"{LIST}{AuditExport.objects.get().pk}/change/")
    assert change.status_code == 200 and 'name="_save"' not in change.content.decode()
    for shown in (html, form.content.decode(), change.content.decode()):
        assert not any(s in shown for s in ("{{", "{%", "}}", "%}")), shown[:300]


@pytest.mark.slow
def test_the_export_page_in_the_browser(make_user, some_runs, log_in, tmp_path):
    """From the record of exports to the form, a refused time shown on the form, then the
    download; screenshots at desktop and phone width."""
    make_user("audrey", "runtime.export_audit", "runtime.view_auditexport", "runtime.view_run",
              staff=True, password=PASSWORD)
    page = log_in("audrey")
    page.goto(LIST)
    page.get_by_role("link", name="Export the audit log").click()
    page.fill("#id_since", "last tuesday")
    page.click("input[type=submit]")
    expect(page.locator(".errorlist")).to_contain_text("is not an ISO 8601 time")
    shot(page, "admin-export-form.png")
    page.fill("#id_since", "2020-01-01")
    page.select_option("#id_format", "jsonl")
    with page.expect_download() as info:
        page.click("input[type=submit]")
    saved = tmp_path / info.value.suggested_filename
    info.value.save_as(saved)
    assert saved.suffix == ".jsonl"
    result = audit_export_verify(saved.read_text().splitlines())
    assert result.ok and result.lines == Event.objects.count()
    assert AuditExport.objects.get().sha256 == hashlib.sha256(saved.read_bytes()).hexdigest()
    page.goto(LIST)
    expect(page.locator("#result_list")).to_contain_text(AuditExport.objects.get().sha256[:16])
    shot(page, "admin-exports-list.png")
    phone = log_in("audrey", viewport=PHONE)
    phone.goto(URL)
    assert phone.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
    shot(phone, "admin-export-form-phone.png")
