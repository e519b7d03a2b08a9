"""The audit export in the admin: the record of exports (read-only), and a form whose submit
downloads an export, streamed (``runtime.audit.export``) and on record like any other.

Downloading needs staff status and ``runtime.export_audit``: an export carries every payload
it covers, which ``view_event`` alone does not reach in bulk.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.http.response import HttpResponseBase
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils import timezone

from runtime.admin.base import MAX_ID, ReadOnlyAdmin
from runtime.audit.export import (
    FORMATS,
    LIMITS,
    MAX_TIME_TEXT,
    WHATS,
    ExportFilters,
    audit_export_stream,
    export_filters,
)
from runtime.errors import ExportRefused
from runtime.models import AuditExport

PERMISSION = "runtime.export_audit"
CONTENT_TYPES = {"csv": "text/csv; charset=utf-8", "jsonl": "application/x-ndjson"}


class ExportForm(forms.Form):
    """What to export; every field bounded, the filters checked by ``export_filters``."""

    what = forms.ChoiceField(choices=[(w, w) for w in WHATS], initial="events")
    format = forms.ChoiceField(choices=[("csv", "CSV"), ("jsonl", "JSON lines")],
                               initial="csv")
    since = forms.CharField(required=False, max_length=MAX_TIME_TEXT,
                            help_text="ISO 8601, inclusive (UTC when no zone is given), "
                                      "e.g. 2026-01-31 or 2026-01-31T09:00:00+00:00")
    until = forms.CharField(required=False, max_length=MAX_TIME_TEXT,
                            help_text="ISO 8601, exclusive")
    agent = forms.CharField(required=False, max_length=LIMITS["agent"])
    run = forms.IntegerField(required=False, min_value=1, max_value=MAX_ID)
    actor = forms.CharField(required=False, max_length=LIMITS["actor"],
                            help_text="an event's actor exactly; for decisions, who decided")

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if self.errors:
            return data
        try:
            data["filters"] = export_filters(
                since=data.get("since"), until=data.get("until"), agent=data.get("agent"),
                run=data.get("run"), actor=data.get("actor"))
        except ExportRefused as exc:
            self.add_error(exc.field if exc.field in self.fields else None, exc.reason)
        return data


@admin.register(AuditExport)
class AuditExportAdmin(ReadOnlyAdmin):
    """Every export taken, newest first (its seq index serves the order), and the page that
    takes one (``export/``)."""

    list_display = ("seq", "at_ms", "by", "what", "format", "filters", "rows", "complete",
                    "sha256_short")
    ordering = ("-seq",)
    sortable_by = ("seq",)
    change_list_template = "admin/runtime/auditexport/change_list.html"

    @admin.display(description="SHA-256")
    def sha256_short(self, obj: AuditExport) -> str:
        """The start of the file's SHA-256 (the whole on the export's own page): enough to
        tell files apart without widening the list past the screen."""
        return f"{obj.sha256[:16]}…"

    def get_urls(self) -> list[URLPattern]:
        page = path("export/", self.admin_site.admin_view(self.export_view),
                    name="runtime_auditexport_export")
        return [page, *super().get_urls()]

    def changelist_view(self, request: HttpRequest,
                        extra_context: dict[str, Any] | None = None) -> HttpResponse:
        extra = {**(extra_context or {}), "can_export": request.user.has_perm(PERMISSION)}
        return super().changelist_view(request, extra)

    def export_view(self, request: HttpRequest) -> HttpResponseBase:
        """GET: the form. POST: the download, streamed; the export is recorded when the last
        byte is sent, or when the download is cut (with what was sent)."""
        if not request.user.has_perm(PERMISSION):
            raise PermissionDenied
        form = ExportForm(request.POST if request.method == "POST" else None)
        if request.method == "POST" and form.is_valid():
            filters: ExportFilters = form.cleaned_data["filters"]
            fmt, what = form.cleaned_data["format"], form.cleaned_data["what"]
            stream = audit_export_stream(what=what, format=fmt, filters=filters,
                                         by=request.user.get_username())
            response = StreamingHttpResponse(stream, content_type=CONTENT_TYPES[fmt])
            stamp = timezone.now().strftime("%Y%m%dT%H%M%SZ")
            response["Content-Disposition"] = (
                f'attachment; filename="audit-{what}-{stamp}.{fmt}"')
            response["Cache-Control"] = "no-store"
            return response
        context = {**self.admin_site.each_context(request), "title": "Export the audit log",
                   "form": form, "opts": self.opts, "formats": FORMATS,
                   "list_url": reverse("admin:runtime_auditexport_changelist")}
        return TemplateResponse(request, "admin/runtime/auditexport/export.html", context,
                                status=400 if form.is_bound else 200)
