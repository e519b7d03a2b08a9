"""Schedules: the list with each one's latest runs, a new schedule, one schedule's page (edit,
enable or disable, turn the standing authorization off, remove) and the confirmation that
turns the standing authorization on.

Changes go through ``runtime.schedules`` only, each with the person's username; reads go
through ``runtime.selectors.schedules``. This module never writes a runtime table.
"""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import redirect
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_http_methods
from django_htmx.http import HttpResponseClientRedirect

from console.forms import (
    AuthorizeScheduleForm,
    RemoveScheduleForm,
    ScheduleCreateForm,
    ScheduleEditForm,
)
from console.permissions import MANAGE_SCHEDULE, require_manage, viewing_schedules
from console.render import page
from console.runs import known_agents
from runtime.clock import SYSTEM_CLOCK
from runtime.errors import InvalidSchedule, ScheduleNotFound
from runtime.models import Schedule
from runtime.schedules import changes as schedules
from runtime.selectors import schedules as selectors

LIST_LIMIT = 200  # schedules on the list at most, by name
RUNS_SHOWN = 20  # a schedule's page: its latest runs
EVENTS_SHOWN = 50  # and its latest changes
# The changes a schedule's page makes, by the form's ``action``. Turning the standing
# authorization ON is not one of them: it has its own confirmation page.
ACTIONS = ("edit", "enable", "disable", "unauthorize", "remove")


def _go(request: HttpRequest, url: str) -> HttpResponse:
    """After a change that leaves the page: a whole-page redirect, for htmx too."""
    if getattr(request, "htmx", None):
        return HttpResponseClientRedirect(url)
    return HttpResponseRedirect(url)


def _field_error(form: Any, exc: InvalidSchedule) -> None:
    """The runtime's reason next to the field it names, or above the form."""
    form.add_error(exc.field if exc.field in form.fields else None, exc.reason)


# -- the list ----------------------------------------------------------------------------------


@viewing_schedules
@require_http_methods(["GET"])
def schedule_list(request: HttpRequest) -> HttpResponse:
    """Every schedule not removed, by name, with when it fires next, its standing
    authorization and its latest runs. The list polls itself (next fire times and runs move
    on their own)."""
    rows, more = selectors.schedule_list(LIST_LIMIT)
    context = {
        "rows": rows,
        "more": more,
        "limit": LIST_LIMIT,
        "can_manage": request.user.has_perm(MANAGE_SCHEDULE),
        "run_base": reverse("console:run", args=[0]).removesuffix("0/"),
        "schedule_base": reverse("console:schedule", args=[0]).removesuffix("0/"),
        "now": timezone.now(),
    }
    return page(request, "console/schedules.html", context, partial="schedule-list")


# -- a new schedule ------------------------------------------------------------------------------


@viewing_schedules
@require_http_methods(["GET", "POST"])
def schedule_new(request: HttpRequest) -> HttpResponse:
    """The form for a new schedule; on success, the new schedule's page."""
    require_manage(request)
    posted = request.POST if request.method == "POST" else None
    form = ScheduleCreateForm(posted, agents=known_agents())
    status = 200
    if request.method == "POST":
        status = 422
        if form.is_valid():
            data = form.cleaned_data
            try:
                schedule = schedules.schedule_create(
                    data["name"], data["agent"], data["input"],
                    by=request.user.get_username(), now=SYSTEM_CLOCK.now(),
                    cron=data["cron"], interval_seconds=data["interval_seconds"],
                    timezone=data["timezone"], enabled=data["enabled"])
            except InvalidSchedule as exc:
                _field_error(form, exc)
            else:
                messages.success(request, f"Schedule {schedule.name} created.")
                return _go(request, reverse("console:schedule", args=[schedule.pk]))
    return page(request, "console/schedule_new.html", {"form": form, "now": timezone.now()},
                partial="schedule-form", status=status)


# -- one schedule ----------------------------------------------------------------------------------


def _schedule(pk: int) -> Schedule:
    schedule = selectors.schedule_for_page(pk)
    if schedule is None:
        raise Http404("No such schedule (or it was removed).")
    return schedule


@viewing_schedules
@require_http_methods(["GET", "POST"])
def schedule_detail(request: HttpRequest, pk: int) -> HttpResponse:
    """A schedule: what and when it runs, its standing authorization, its latest runs and its
    history of changes; for people who manage schedules, the changes."""
    schedule = _schedule(pk)
    if request.method == "POST":
        require_manage(request)
        return _change(request, schedule)
    return _render(request, schedule)


def _change(request: HttpRequest, schedule: Schedule) -> HttpResponse:
    action = request.POST.get("action", "")
    if action == "authorize":
        return _render(request, schedule, status=400, error=(
            "Turning the standing authorization on needs its confirmation: use "
            "“Authorize side effects…”. Nothing was changed."))
    if action not in ACTIONS:
        return _render(request, schedule, status=400,
                       error="Unknown change. Nothing was changed.")
    by, now = request.user.get_username(), SYSTEM_CLOCK.now()
    agents = known_agents()
    edit_form: ScheduleEditForm | None = None
    remove_form: RemoveScheduleForm | None = None
    try:
        if action == "edit":
            edit_form = ScheduleEditForm(request.POST, agents=agents,
                                         current_agent=schedule.agent)
            if not edit_form.is_valid():
                return _render(request, schedule, edit_form=edit_form, status=422)
            data = edit_form.cleaned_data
            if data["version"] != schedule.event_seq:
                return _render(request, schedule, status=409, error=(
                    "Not saved: the schedule was changed by someone else since you opened "
                    "it. This is what it is now; make your change again."))
            before, was_authorized = schedule.event_seq, schedule.authorize_side_effects
            schedule = schedules.schedule_update(
                schedule.pk, by=by, now=now, agent=data["agent"], input=data["input"],
                cron=data["cron"], interval_seconds=data["interval_seconds"],
                timezone=data["timezone"])
            notice = "Saved." if schedule.event_seq != before else "Nothing to save: no change."
            if was_authorized and not schedule.authorize_side_effects:
                notice += (" The standing authorization was turned off with this change: it "
                           "was given for what the schedule ran before.")
        elif action in ("enable", "disable"):
            schedules.schedule_set_enabled(schedule.pk, action == "enable", by=by, now=now)
            notice = "Enabled." if action == "enable" else "Disabled."
        elif action == "unauthorize":
            schedules.schedule_authorize(schedule.pk, False, by=by, now=now)
            notice = ("Standing authorization turned off: policy approvals of its runs ask a "
                      "person again.")
        else:
            remove_form = RemoveScheduleForm(request.POST)
            if not remove_form.is_valid():
                return _render(request, schedule, remove_form=remove_form, status=422)
            schedules.schedule_remove(schedule.pk, by=by, now=now)
            messages.success(request, f"Schedule {schedule.name} removed.")
            return _go(request, reverse("console:schedules"))
    except ScheduleNotFound:
        raise Http404("No such schedule (or it was removed).") from None
    except InvalidSchedule as exc:
        if edit_form is not None:
            _field_error(edit_form, exc)
            return _render(request, _schedule(schedule.pk), edit_form=edit_form, status=422)
        return _render(request, _schedule(schedule.pk), status=409,
                       error=f"Not changed: {exc.reason}.")
    if getattr(request, "htmx", None):
        return _render(request, _schedule(schedule.pk), notice=notice)
    messages.success(request, notice)
    return redirect("console:schedule", pk=schedule.pk)


def _render(request: HttpRequest, schedule: Schedule, *,
            edit_form: ScheduleEditForm | None = None,
            remove_form: RemoveScheduleForm | None = None, error: str = "", notice: str = "",
            status: int = 200) -> HttpResponse:
    can_manage = request.user.has_perm(MANAGE_SCHEDULE)
    events, events_total = selectors.schedule_events(schedule, EVENTS_SHOWN)
    context = {
        "schedule": schedule,
        "next_fire": selectors.schedule_next_fire(schedule),
        "overdue": selectors.schedule_overdue(schedule),
        "runs": selectors.schedule_runs(schedule.pk, RUNS_SHOWN),
        "runs_shown": RUNS_SHOWN,
        "events": events,
        "events_total": events_total,
        "can_manage": can_manage,
        "edit_form": edit_form or (ScheduleEditForm(schedule=schedule, agents=known_agents(),
                                                    current_agent=schedule.agent)
                                   if can_manage else None),
        "remove_form": remove_form or RemoveScheduleForm(),
        "error": error,
        "notice": notice,
        "now": timezone.now(),
    }
    return page(request, "console/schedule.html", context, partial="schedule-live",
                status=status)


# -- turning the standing authorization on -------------------------------------------------------


@viewing_schedules
@require_http_methods(["GET", "POST"])
def schedule_authorize(request: HttpRequest, pk: int) -> HttpResponse:
    """The confirmation that turns a schedule's standing authorization on: it names the agent,
    the schedule and what is authorized, and takes effect only with its box ticked, for the
    version of the schedule it was shown for."""
    require_manage(request)
    schedule = _schedule(pk)
    label = (f"Yes: let every run schedule {schedule.name} fires from now on start the side "
             f"effects agent {schedule.agent}'s policy would ask a person about, without "
             f"asking.")
    posted = request.POST if request.method == "POST" else None
    form = AuthorizeScheduleForm(posted, confirm_label=label,
                                 initial={"version": schedule.event_seq})
    status, error = 200, ""
    if request.method == "POST" and not schedule.authorize_side_effects:
        if not form.is_valid():
            status = 422
        elif form.cleaned_data["version"] != schedule.event_seq:
            # Read again: the agent (what is authorized) may have changed since.
            status, error = 409, ("Not authorized: the schedule was changed since you read "
                                  "this. Read it again as it is now.")
            form = AuthorizeScheduleForm(confirm_label=label,
                                         initial={"version": schedule.event_seq})
        else:
            try:
                schedules.schedule_authorize(schedule.pk, True, by=request.user.get_username(),
                                             now=SYSTEM_CLOCK.now())
            except ScheduleNotFound:
                raise Http404("No such schedule (or it was removed).") from None
            except InvalidSchedule as exc:
                status, error = 409, f"Not authorized: {exc.reason}."
            else:
                messages.success(request, f"Side effects authorized for schedule "
                                          f"{schedule.name}.")
                return _go(request, reverse("console:schedule", args=[schedule.pk]))
    context = {
        "schedule": schedule,
        "form": form,
        "error": error,
        "side_effect_tools": selectors.agent_side_effect_tools(schedule.agent),
        "now": timezone.now(),
    }
    return page(request, "console/schedule_authorize.html", context, partial="authorize-form",
                status=status)
