"""What every runtime admin page shares: read-only, lists whose counts stop at a cap, sorts and
filters only where an index serves them, ``?q=`` read as a run id, times to the millisecond.
The pages themselves are in ``runtime.admin.pages``."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from datetime import datetime
from typing import Any, ClassVar, cast

from django.contrib import admin
from django.contrib.admin.utils import get_fields_from_path
from django.contrib.admin.views.main import ORDER_VAR, PAGE_VAR, ChangeList
from django.core.paginator import Paginator
from django.db import models
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import timezone
from django.utils.functional import cached_property
from django.utils.html import format_html

from runtime.models import Run

COUNT_CAP = 10_000
MAX_ID = 2**63 - 1  # the largest id a 64-bit integer column holds (both engines)
MAX_PAGE = 1_000_000  # a page number past any real list; larger ones read as the last page

ASCII_DIGITS = re.compile(r"[0-9]+")


def run_id_term(text: str) -> int | None:
    """A run id as typed in search or a filter (``12`` or ``#12``), or None: ASCII digits only
    (``str.isdigit`` also takes ``²`` and other digits ``int`` refuses) and no larger than an
    id column holds, so no lookup overflows."""
    term = text.strip().removeprefix("#")
    if not ASCII_DIGITS.fullmatch(term):
        return None
    number = int(term)
    return number if number <= MAX_ID else None


def _page_number(request: HttpRequest) -> int:
    text = request.GET.get(PAGE_VAR, "1")
    if not ASCII_DIGITS.fullmatch(text):
        return 1
    return min(max(1, int(text)), MAX_PAGE)


class BoundedCountPaginator(Paginator):
    """A paginator whose ``count`` never scans a large table.

    Unfiltered, it is the highest primary key: one index lookup, and exact for tables the
    runtime only appends to. Filtered, it counts at most ``COUNT_CAP`` rows, or enough rows to
    reach a few pages past ``wanted_page`` when that is further (``COUNT(*)`` over a ``LIMIT``
    subquery): a deep page stays valid, and its count costs what its own OFFSET costs.
    ``capped`` says the rows go on past ``count``.
    """

    lookahead = 3  # pages past the wanted one that the page links offer
    wanted_page = 1
    capped = False

    @cached_property
    def count(self) -> int:
        qs = self.object_list
        if not isinstance(qs, QuerySet):
            return len(qs)
        if not qs.query.where:
            top = qs.model._default_manager.order_by("-pk").values_list("pk", flat=True).first()
            return int(top or 0)
        cap = max(COUNT_CAP, (self.wanted_page + self.lookahead) * self.per_page)
        found = qs.order_by()[: cap + 1].count()
        self.capped = found > cap
        return min(found, cap)


class BoundedChangeList(ChangeList):
    """Sorts only by the columns ``sortable_by`` allows (Django would sort by any ``?o=``),
    never sends a deep page to Django's "?e=1" redirect (which drops the filters), and words
    a capped count as "more than N"."""

    def get_ordering(self, request: HttpRequest, queryset: QuerySet) -> list[Any]:
        wanted = self.params.get(ORDER_VAR)
        if wanted and self.sortable_by is not None:
            kept = [p for p in wanted.split(".") if self._sortable(p)]
            if kept:
                self.params[ORDER_VAR] = ".".join(kept)
            else:
                del self.params[ORDER_VAR]
        ordering = super().get_ordering(request, queryset)
        # Django breaks ties by the primary key descending (or by the admin's default order)
        # whatever the sort's direction; in the sort's own direction one index scan serves
        # both (``at ASC, id ASC`` reads event_at forwards, ``at ASC, id DESC`` sorts it all).
        if ordering and isinstance(ordering[0], str):
            sign = "-" if ordering[0].startswith("-") else ""
            keys = {"pk", self.lookup_opts.pk.attname}
            ordering = [sign + p.lstrip("-") if isinstance(p, str) and p.lstrip("-") in keys
                        else p for p in ordering]
        return ordering

    def _sortable(self, param: str) -> bool:
        index = param.rpartition("-")[2]
        if not ASCII_DIGITS.fullmatch(index) or int(index) >= len(self.list_display):
            return False
        assert self.sortable_by is not None, "ModelAdmin.get_sortable_by gives a sequence"
        return self.list_display[int(index)] in self.sortable_by

    def get_results(self, request: HttpRequest) -> None:
        """Django's, except that a page past the end shows the last page (keeping the filters)
        and "show all" is never offered for a count that was capped."""
        paginator = self.model_admin.get_paginator(request, self.queryset, self.list_per_page)
        count = paginator.count
        capped = getattr(paginator, "capped", False)
        self.page_num = min(max(self.page_num, 1), max(paginator.num_pages, 1))
        full = self.root_queryset.count() if self.model_admin.show_full_result_count else None
        self.result_count, self.result_count_capped = count, capped
        self.show_full_result_count = self.model_admin.show_full_result_count
        self.show_admin_actions = not self.show_full_result_count or bool(full)
        self.full_result_count = full
        self.can_show_all = count <= self.list_max_show_all and not capped
        self.multi_page = capped or count > self.list_per_page
        if (self.show_all and self.can_show_all) or not self.multi_page:
            self.result_list = self.queryset._clone()
        else:
            self.result_list = paginator.page(self.page_num).object_list
        self.paginator = paginator
        more = self.page_num < paginator.num_pages
        self.next_page_query = self.get_query_string({PAGE_VAR: self.page_num + 1}) if more \
            else ""

    @property
    def count_text(self) -> str:
        """The count in words: ``1 event``, ``114,501 events``, or ``more than 10,000 events``
        when it hit its cap (never the cap itself, as if it were the total)."""
        n = self.result_count
        name = self.opts.verbose_name if n == 1 else self.opts.verbose_name_plural
        return f"more than {n:,} {name}" if self.result_count_capped else f"{n:,} {name}"


def timestamp(value: datetime | None) -> str:
    """To the millisecond, with the zone: audit events a few ms apart must read apart."""
    if value is None:
        return "-"
    local = timezone.localtime(value)
    text = f"{local:%Y-%m-%d %H:%M:%S}.{local.microsecond // 1000:03d} {local.tzname()}"
    return format_html('<time datetime="{}">{}</time>', value.isoformat(), text)


def _timestamp_display(field: models.DateTimeField) -> Callable[[Any], str]:
    @admin.display(description=field.verbose_name, ordering=field.name)
    def show(obj: Any) -> str:
        return timestamp(getattr(obj, field.name))

    return show


class ReadOnlyAdmin(admin.ModelAdmin):
    """View only: no add, change or delete, whoever asks. Every datetime column has a
    ``<name>_ms`` twin (to the millisecond, with the zone) for lists and change pages."""

    paginator: ClassVar[type[Paginator]] = BoundedCountPaginator  # a page may use Django's
    fields: ClassVar[tuple[str, ...] | None]  # names only: they are the read-only fields too
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER  # "Show counts" would COUNT every filter choice
    list_per_page = 50

    def __init__(self, model: type[models.Model], admin_site: admin.AdminSite) -> None:
        for field in model._meta.concrete_fields:
            if isinstance(field, models.DateTimeField):
                setattr(self, f"{field.name}_ms", _timestamp_display(field))
        super().__init__(model, admin_site)

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    # A flat list of names is a valid field list; the stubs' list[names or groups] is
    # invariant, so it is refused as a return type.
    def get_fields(  # type: ignore[override]
        self, request: HttpRequest, obj: Any = None
    ) -> list[str]:
        if self.fields:
            return list(self.fields)
        return [f"{f.name}_ms" if isinstance(f, models.DateTimeField) else f.name
                for f in self.model._meta.concrete_fields if f.editable and not f.auto_created]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return self.get_fields(request, obj)

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return BoundedChangeList

    def get_paginator(self, request: HttpRequest, queryset: QuerySet, per_page: int,
                      orphans: int = 0, allow_empty_first_page: bool = True) -> Paginator:
        paginator = super().get_paginator(request, queryset, per_page, orphans,
                                          allow_empty_first_page)
        if isinstance(paginator, BoundedCountPaginator):
            paginator.wanted_page = _page_number(request)
        return paginator

    # Query-string filters on the run id (exact), accepted where the list is of one run's
    # rows: an index on the run serves them.
    run_lookups: tuple[str, ...] = ()

    def lookup_allowed(self, lookup: str, value: str, request: HttpRequest | None = None
                       ) -> bool:
        """Only the filters this list declares, by the parameters their choices link to, and
        ``run_lookups``. Django would take a lookup on any column (``?actor__regex=``,
        ``?payload__contains=``, ``?id__gt=``): a query no index serves, or a server error.
        Refused, Django answers 400 ("Filtering by ... not allowed") before any query."""
        return lookup in self.allowed_lookups(request)

    def allowed_lookups(self, request: HttpRequest | None = None) -> set[str]:
        filters = self.get_list_filter(request) if request is not None else self.list_filter
        allowed = set(self.run_lookups)
        for item in filters:
            allowed |= filter_parameters(self.model, item)
        return allowed

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet, search_term: str
    ) -> tuple[QuerySet, bool]:
        """Search is by run id (an exact, indexed match); anything else, a number too large
        for an id included, matches nothing. A list without a search box ignores ``?q=``."""
        if not search_term.strip() or not self.search_fields:
            return queryset, False
        run_id = run_id_term(search_term)
        if run_id is None:
            return queryset.none(), False
        field = "pk" if queryset.model is Run else "run_id"
        return queryset.filter(**{field: run_id}), False


def filter_parameters(model: type[models.Model], item: Any) -> set[str]:
    """The query-string parameters one ``list_filter`` entry reads: a SimpleListFilter's
    ``parameter_name``; for a field, what Django's filter for it links to (``f__exact`` and
    plain ``f``, the same equality; ``f__gte`` and ``f__lt`` for a date), and ``f__isnull``
    where the column may be NULL."""
    if isinstance(item, type) and issubclass(item, admin.SimpleListFilter):
        # Django refuses a SimpleListFilter without one when it is made.
        return {cast(str, item.parameter_name)}
    path, kind = item if isinstance(item, list | tuple) else (item, None)
    field = get_fields_from_path(model, path)[-1]
    nullable = {f"{path}__isnull"} if field.null else set()
    dated = kind is None and isinstance(field, models.DateField)
    if dated or (isinstance(kind, type) and issubclass(kind, admin.DateFieldListFilter)):
        return {f"{path}__gte", f"{path}__lt"} | nullable
    if field.is_relation:
        return {f"{path}__{field.target_field.name}__exact"} | nullable
    return {path, f"{path}__exact"} | nullable


def pretty_json(value: Any) -> str:
    text = json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)
    return format_html('<pre class="payload-pretty">{}</pre>', text)


def short_json(value: Any, limit: int = 160) -> str:
    text = json.dumps(value, sort_keys=True, ensure_ascii=False, default=str)
    text = text if len(text) <= limit else text[: limit - 1] + "…"
    return format_html('<code class="payload-short">{}</code>', text)
