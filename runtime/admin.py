"""The Django admin over the runtime's tables: read-only for everyone, superusers included.

State changes go through the runtime's functions, which write the state and its audit event in
one transaction; an admin form editing a row would bypass both. The audit log may hold millions
of events, so its lists never COUNT the whole table and filter choices never scan it.
"""

from __future__ import annotations

import json
from typing import Any

from django.contrib import admin
from django.core.paginator import Paginator
from django.db.models import QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils.functional import cached_property
from django.utils.html import format_html

from .agents import registry
from .audit import EVENT_KINDS
from .models import Approval, Event, Run, Step, Worker

COUNT_CAP = 10_000


class BoundedCountPaginator(Paginator):
    """A paginator whose ``count`` never scans a large table.

    Unfiltered, it is the highest primary key: one index lookup, and exact for tables the
    runtime only appends to. Filtered, it counts at most ``COUNT_CAP`` rows
    (``COUNT(*)`` over a ``LIMIT`` subquery), so deep filtered pages stop at the cap.
    """

    @cached_property
    def count(self) -> int:
        qs = self.object_list
        if not isinstance(qs, QuerySet):
            return len(qs)
        if not qs.query.where:
            top = qs.model._default_manager.order_by("-pk").values_list("pk", flat=True).first()
            return int(top or 0)
        return qs.order_by()[:COUNT_CAP].count()


class ReadOnlyAdmin(admin.ModelAdmin):
    """View only: no add, change or delete, whoever asks."""

    paginator = BoundedCountPaginator
    show_full_result_count = False
    list_per_page = 50

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet, search_term: str
    ) -> tuple[QuerySet, bool]:
        """Search is by run id (an exact, indexed match); anything else matches nothing."""
        term = search_term.strip().removeprefix("#")
        if not term:
            return queryset, False
        if not term.isdigit():
            return queryset.none(), False
        field = "pk" if queryset.model is Run else "run_id"
        return queryset.filter(**{field: int(term)}), False


def _pretty(value: Any) -> str:
    text = json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)
    return format_html('<pre style="white-space: pre-wrap; margin: 0">{}</pre>', text)


def _short(value: Any, limit: int = 100) -> str:
    text = json.dumps(value, sort_keys=True, ensure_ascii=False, default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"


class EventKindFilter(admin.SimpleListFilter):
    """Choices from the event catalogue, not a DISTINCT over the audit log."""

    title = "kind"
    parameter_name = "kind"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(k, k) for k in sorted(EVENT_KINDS)]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        return queryset.filter(kind=self.value()) if self.value() else queryset


class EventActorFilter(admin.SimpleListFilter):
    """Actors seen in the latest events (a bounded read), plus the one filtered on."""

    title = "actor"
    parameter_name = "actor"
    recent = 500

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        latest = Event.objects.order_by("-pk").values_list("actor", flat=True)[: self.recent]
        actors = set(latest) | ({self.value()} if self.value() else set())
        return [(a, a) for a in sorted(actors)]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        return queryset.filter(actor=self.value()) if self.value() else queryset


class AgentFilter(admin.SimpleListFilter):
    """Agents from settings, not a DISTINCT over the runs table."""

    title = "agent"
    parameter_name = "agent"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        names = set(registry.all()) | ({self.value()} if self.value() else set())
        return [(n, n) for n in sorted(names)]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        field = "agent" if queryset.model is Run else "run__agent"
        return queryset.filter(**{field: self.value()}) if self.value() else queryset


@admin.register(Event)
class EventAdmin(ReadOnlyAdmin):
    """The audit log: newest first; for one run (``?run__id__exact=N``), in sequence order."""

    list_display = ("at", "run_link", "seq", "kind", "step_index", "actor", "payload_short")
    list_display_links = ("seq",)
    list_filter = (EventKindFilter, EventActorFilter, ("at", admin.DateFieldListFilter))
    search_fields = ("=run__id",)
    search_help_text = "Run id"
    fields = ("run_link", "seq", "step_index", "kind", "actor", "at", "payload_pretty", "hash")
    readonly_fields = fields

    def get_ordering(self, request: HttpRequest) -> tuple[str, ...]:
        if request.GET.get("run__id__exact") or request.GET.get("run__id"):
            return ("seq",)
        return ("-at", "-id")

    @admin.display(description="run", ordering="run_id")
    def run_link(self, obj: Event) -> str:
        return format_html('<a href="{}">#{}</a> (<a href="?run__id__exact={}">events</a>)',
                           reverse("admin:runtime_run_change", args=[obj.run_id]), obj.run_id,
                           obj.run_id)

    @admin.display(description="payload")
    def payload_short(self, obj: Event) -> str:
        return _short(obj.payload)

    @admin.display(description="payload")
    def payload_pretty(self, obj: Event) -> str:
        return _pretty(obj.payload)


@admin.register(Run)
class RunAdmin(ReadOnlyAdmin):
    list_display = ("id", "agent", "status", "failure_code", "lease_owner", "lease_expires_at",
                    "llm_requests", "cost", "created_by", "created_at")
    list_filter = ("status", AgentFilter, "failure_code")
    search_fields = ("=id",)
    search_help_text = "Run id"
    ordering = ("-id",)


@admin.register(Step)
class StepAdmin(ReadOnlyAdmin):
    list_display = ("id", "run_id", "index", "status", "tool", "effect", "attempt", "started_at")
    list_filter = ("status", "effect")
    search_fields = ("=run__id",)
    search_help_text = "Run id"
    ordering = ("-id",)


@admin.register(Approval)
class ApprovalAdmin(ReadOnlyAdmin):
    list_display = ("id", "run_id", "kind", "status", "tool", "effect", "created_at",
                    "decided_by", "decided_at")
    list_filter = ("status", "kind", AgentFilter)
    search_fields = ("=run__id",)
    search_help_text = "Run id"
    ordering = ("-id",)


@admin.register(Worker)
class WorkerAdmin(ReadOnlyAdmin):
    paginator = Paginator  # one row per process: small, and rows are deleted on clean exit
    list_display = ("owner", "host", "pid", "concurrency", "lease_seconds", "started_at",
                    "heartbeat_at", "runs_held")
    ordering = ("host", "started_at")
