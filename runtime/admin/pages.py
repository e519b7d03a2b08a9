"""The Django admin over the runtime's tables: read-only for everyone, superusers included.

State changes go through the runtime's functions, which write the state and its audit event in
one transaction; an admin form editing a row would bypass both. The audit log may hold millions
of events, so no list COUNTs or sorts the whole table, and no filter choice scans it: counts stop
at a cap (and say "more than"), columns sort only where an index gives the order, the
actor filter lists people and live workers, not every actor ever seen, and a list accepts only
the query-string filters an index serves: its declared filters' own parameters, and a run id
where it lists one run's rows (``lookup_allowed``); ``?q=`` is a run id or, on the audit log,
an exact actor (``run_id_term``, ``get_search_results``).
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.contrib.auth import get_user_model
from django.core.paginator import Paginator
from django.db.models import Exists, OuterRef, QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html

from runtime.admin.base import (
    ASCII_DIGITS,
    COUNT_CAP,
    MAX_ID,
    BoundedCountPaginator,
    ReadOnlyAdmin,
    pretty_json,
    run_id_term,
    short_json,
)
from runtime.agents.agent import registry
from runtime.models import (
    Approval,
    AuditCheckpoint,
    Event,
    Notification,
    NotificationAttempt,
    Run,
    RunCreation,
    Schedule,
    ScheduleEvent,
    Step,
    Worker,
)
from runtime.selectors import live_workers
from runtime.storage.events import EVENT_KINDS

__all__ = ["COUNT_CAP", "MAX_ID", "BoundedCountPaginator", "ReadOnlyAdmin", "run_id_term"]

class EventKindFilter(admin.SimpleListFilter):
    """Choices from the event catalogue, not a DISTINCT over the audit log."""

    title = "kind"
    parameter_name = "kind"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(k, k) for k in sorted(EVENT_KINDS)]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        return queryset.filter(kind=self.value()) if self.value() else queryset


class EventActorFilter(admin.SimpleListFilter):
    """People who acted (one index probe of (actor, at) per user), "system" if it acted, the
    live workers, and the value filtered on. A dead worker's id is not listed, or the list
    would grow with every restart: search for it, or open ``?actor=<owner id>``."""

    title = "actor"
    parameter_name = "actor"
    people = 200

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        acted = Exists(Event.objects.filter(actor=OuterRef("username")))
        users = get_user_model()._default_manager.filter(acted).order_by("username")
        choices = {name: name for name in users.values_list("username", flat=True)[: self.people]}
        if Event.objects.filter(actor="system").exists():
            choices["system"] = "system"
        for owner in live_workers(timezone.now()):
            choices.setdefault(owner, f"{owner} (live worker)")
        value = self.value()
        if value:
            choices.setdefault(value, value)
        return sorted(choices.items())

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        return queryset.filter(actor=self.value()) if self.value() else queryset


class AgentFilter(admin.SimpleListFilter):
    """Agents from settings, not a DISTINCT over the runs table."""

    title = "agent"
    parameter_name = "agent"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        value = self.value()
        names = set(registry.all()) | ({value} if value else set())
        return [(n, n) for n in sorted(names)]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        field = "agent" if queryset.model is Run else "run__agent"
        return queryset.filter(**{field: self.value()}) if self.value() else queryset


# The one filter on the run id the audit log accepts (``lookup_allowed``): what the run page's
# "audit log of this run" link and each event's "events" link send.
RUN_PARAMS = ("run__id__exact",)


def one_run(request: HttpRequest) -> bool:
    """Whether the list is of one run's events (filtered, or searched by run id), which the
    unique (run, seq) index reads in sequence order."""
    if any(run_id_term(request.GET.get(p, "")) is not None for p in RUN_PARAMS):
        return True
    return run_id_term(request.GET.get("q", "")) is not None


@admin.register(Event)
class EventAdmin(ReadOnlyAdmin):
    """The audit log: newest first; for one run (``?run__id__exact=N``), in sequence order.
    Sortable by time (the (at) index, or (kind, at) and (actor, at) when filtered), or for one
    run by sequence (the (run, seq) index); any other sort would read and sort every row."""

    list_display = ("at_ms", "run_link", "seq", "kind", "step_index", "actor", "payload_short")
    list_display_links = ("seq",)
    list_filter = (EventKindFilter, EventActorFilter, ("at", admin.DateFieldListFilter))
    search_fields = ("=run__id",)
    search_help_text = "A run id (12 or #12), or an actor exactly (a username or a worker id)"
    run_lookups = RUN_PARAMS
    fields = ("run_link", "seq", "step_index", "kind", "actor", "at_ms", "payload_pretty",
              "hash")

    def get_ordering(self, request: HttpRequest) -> tuple[str, ...]:
        return ("seq",) if one_run(request) else ("-at", "-id")

    def get_sortable_by(self, request: HttpRequest) -> tuple[str, ...]:
        """One run's events sort by seq (its index); time order would sort them all."""
        return ("seq",) if one_run(request) else ("at_ms",)

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet, search_term: str
    ) -> tuple[QuerySet, bool]:
        """A run id, or else an exact actor (read through the (actor, at) index): how a dead
        worker's events are found now that the actor filter no longer lists it. A number
        (ASCII digits) is a run id, one too large for an id matching nothing; any other text
        (``²`` included) is an actor, matched exactly."""
        term = search_term.strip()
        if term and not ASCII_DIGITS.fullmatch(term.removeprefix("#")):
            return queryset.filter(actor=term), False
        return super().get_search_results(request, queryset, search_term)

    @admin.display(description="run")
    def run_link(self, obj: Event) -> str:
        return format_html('<a href="{}">#{}</a> (<a href="?run__id__exact={}">events</a>)',
                           reverse("admin:runtime_run_change", args=[obj.run_id]), obj.run_id,
                           obj.run_id)

    @admin.display(description="payload")
    def payload_short(self, obj: Event) -> str:
        return short_json(obj.payload)

    @admin.display(description="payload")
    def payload_pretty(self, obj: Event) -> str:
        return pretty_json(obj.payload)


@admin.register(Run)
class RunAdmin(ReadOnlyAdmin):
    """Sortable by id only: the (status, id) and (agent, id) indexes serve it filtered too."""

    list_display = ("id", "agent", "status", "failure_code", "lease_owner", "lease_expires_at_ms",
                    "llm_requests", "cost", "created_by", "created_at_ms")
    list_filter = ("status", AgentFilter, "failure_code")
    search_fields = ("=id",)
    search_help_text = "Run id"
    ordering = ("-id",)
    sortable_by = ("id",)


@admin.register(Step)
class StepAdmin(ReadOnlyAdmin):
    list_display = ("id", "run_id", "index", "status", "tool", "effect", "attempt",
                    "started_at_ms")
    list_filter = ("status", "effect")
    search_fields = ("=run__id",)
    search_help_text = "Run id"
    ordering = ("-id",)
    sortable_by = ("id",)


@admin.register(Approval)
class ApprovalAdmin(ReadOnlyAdmin):
    list_display = ("id", "run_id", "kind", "status", "tool", "effect", "created_at_ms",
                    "decided_by", "decided_at_ms")
    list_filter = ("status", "kind", AgentFilter)
    search_fields = ("=run__id",)
    search_help_text = "Run id"
    ordering = ("-id",)
    sortable_by = ("id",)


@admin.register(Worker)
class WorkerAdmin(ReadOnlyAdmin):
    """One row per registered process: a small table, counted and sorted as Django likes."""

    paginator = Paginator  # rows are deleted on clean exit
    list_display = ("owner", "host", "pid", "concurrency", "lease_seconds", "started_at_ms",
                    "heartbeat_at_ms", "runs_held")
    ordering = ("host", "started_at")


@admin.register(RunCreation)
class RunCreationAdmin(ReadOnlyAdmin):
    """The global audit chain, newest first (its seq index serves the order)."""

    list_display = ("seq", "run_id", "agent", "created_by", "at_ms", "hash")
    ordering = ("-seq",)
    sortable_by = ("seq",)


@admin.register(AuditCheckpoint)
class AuditCheckpointAdmin(ReadOnlyAdmin):
    """Checkpoints taken (``manage.py auditcheckpoint``); the signed files live elsewhere."""

    paginator = Paginator  # one row an hour at most
    list_display = ("seq", "at_ms", "by", "runs", "creations_seq", "hash")
    ordering = ("-seq",)
    sortable_by = ("seq",)


@admin.register(Schedule)
class ScheduleAdmin(ReadOnlyAdmin):
    """Schedules, removed ones included (the console lists the others); changes go through
    the console or ``manage.py schedule``, which record them in the schedule's chain."""

    list_display = ("id", "name", "agent", "cron", "interval_seconds", "timezone", "enabled",
                    "next_fire_at_ms", "authorize_side_effects", "authorized_by",
                    "authorized_at_ms", "removed_at_ms")
    ordering = ("-id",)
    sortable_by = ("id",)


@admin.register(ScheduleEvent)
class ScheduleEventAdmin(ReadOnlyAdmin):
    """Every change of every schedule, newest first: each schedule's own hash chain."""

    list_display = ("id", "schedule_id", "seq", "kind", "actor", "at_ms", "payload_short")
    fields = ("schedule", "seq", "kind", "actor", "at_ms", "payload_pretty", "hash")
    ordering = ("-id",)
    sortable_by = ("id",)

    @admin.display(description="payload")
    def payload_short(self, obj: ScheduleEvent) -> str:
        return short_json(obj.payload)

    @admin.display(description="payload")
    def payload_pretty(self, obj: ScheduleEvent) -> str:
        return pretty_json(obj.payload)


@admin.register(Notification)
class NotificationAdmin(ReadOnlyAdmin):
    """The outbox: what was sent to whom about which approval, and how delivery went."""

    list_display = ("id", "approval_id", "event", "channel", "kind", "status", "attempts",
                    "next_attempt_at_ms", "delivered_at_ms")
    list_filter = ("status",)  # the (status, next_attempt_at) index serves it
    ordering = ("-id",)
    sortable_by = ("id",)


@admin.register(NotificationAttempt)
class NotificationAttemptAdmin(ReadOnlyAdmin):
    list_display = ("id", "notification_id", "number", "at_ms", "ok", "status_code", "error")
    ordering = ("-id",)
    sortable_by = ("id",)
