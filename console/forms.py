"""Operators' decision forms. Everything is validated here, before the runtime is called, so a
bad form changes nothing; the runtime validates again (it trusts no caller)."""

from __future__ import annotations

import json
from typing import Any, cast

from django import forms
from django.db import models

from runtime.approvals.rules import Decision
from runtime.canonical import check_payload, parse_json
from runtime.errors import InvalidPayload
from runtime.models import Schedule
from runtime.schedules.timing import MAX_INTERVAL_SECONDS, MIN_INTERVAL_SECONDS

NOTE_MAX = 2000


class DecisionForm(forms.Form):
    """Base of the three decisions: a note and an explicit confirmation."""

    decision: Decision
    confirm_label = ""
    note = forms.CharField(required=False, max_length=NOTE_MAX,
                           widget=forms.Textarea(attrs={"rows": 2}))
    confirm = forms.BooleanField(required=True)

    def __init__(self, *args: Any, confirm_label: str = "", **kwargs: Any) -> None:
        """``confirm_label`` words the confirmation for the approval's kind."""
        kwargs.setdefault("prefix", self.decision)
        super().__init__(*args, **kwargs)
        self.fields["confirm"].label = confirm_label or self.confirm_label
        self.fields["confirm"].error_messages["required"] = "Tick the box to confirm."


class ApproveForm(DecisionForm):
    decision = Decision.APPROVE
    confirm_label = "Yes: run this exact request once more."


class ResolveForm(DecisionForm):
    decision = Decision.RESOLVE
    confirm_label = "Yes: it happened; record this result and continue."
    result = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 5, "spellcheck": "false"}),
        help_text='The result you found, as JSON (e.g. {"charged": 500} or "done").')
    field_order = ["result", "note", "confirm"]

    def clean_result(self) -> Any:
        return json_field(self.cleaned_data["result"], "the result")


def json_field(text: str, what: str) -> Any:
    """JSON text from a form as a value within the runtime's limits. The text's size is
    checked before it is parsed, and no depth reaches the parser's recursion
    (``parse_json``): too large or too deep is a form error like bad JSON, never a server
    error."""
    try:
        value = parse_json(what, text, parse_constant=_refuse_constant)
        check_payload(what, value)  # the runtime's own limits, before it is asked
    except InvalidPayload as exc:
        raise forms.ValidationError(f"{what.capitalize()} cannot be stored: {exc.reason}.") \
            from None
    except json.JSONDecodeError as exc:
        raise forms.ValidationError(
            f"Not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno}).") from None
    except ValueError as exc:
        raise forms.ValidationError(str(exc)) from None
    return value


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"Not valid JSON: {name} is not a JSON number.")


class RejectForm(DecisionForm):
    decision = Decision.REJECT
    confirm_label = "Yes: end the run; do not call the tool again."
    note = forms.CharField(required=True, max_length=NOTE_MAX,
                           widget=forms.Textarea(attrs={"rows": 2}),
                           help_text="Required: why the run must stop.")


DECISION_FORMS: dict[Decision, type[DecisionForm]] = {
    f.decision: f for f in (ApproveForm, ResolveForm, RejectForm)}
assert set(DECISION_FORMS) == set(Decision), "a form for every decision"


class CancelRunForm(forms.Form):
    reason = forms.CharField(required=False, max_length=NOTE_MAX)
    confirm = forms.BooleanField(required=True, label="Yes: cancel this run.",
                                 error_messages={"required": "Tick the box to confirm."})


# -- schedules ------------------------------------------------------------------------------------

def _max_length(name: str) -> int:
    field = Schedule._meta.get_field(name)
    assert isinstance(field, models.CharField) and field.max_length is not None, name
    return field.max_length


class ScheduleForm(forms.Form):
    """What a schedule runs and when. Only the shape of each field is checked here (sizes,
    JSON, a whole number); whether it makes a schedule is the runtime's to say
    (``InvalidSchedule``), and its answer is shown next to the field it names."""

    agent = forms.ChoiceField(help_text="Every run of this schedule runs this agent.")
    input = forms.CharField(
        initial="{}", widget=forms.Textarea(attrs={"rows": 4, "spellcheck": "false"}),
        help_text='What every run starts with, as JSON (e.g. {"order_id": 1001}).')
    cron = forms.CharField(
        label="Cron expression", required=False, max_length=_max_length("cron"),
        widget=forms.TextInput(attrs={"placeholder": "*/15 * * * *", "spellcheck": "false",
                                      "autocomplete": "off"}),
        help_text="Minute hour day month weekday, read in the time zone below "
                  "(or @hourly, @daily, …). Leave it empty to run on an interval.")
    interval_seconds = forms.IntegerField(
        label="Or every N seconds", required=False,
        widget=forms.NumberInput(attrs={"min": MIN_INTERVAL_SECONDS,
                                        "max": MAX_INTERVAL_SECONDS}),
        help_text="A fixed interval instead of a cron expression.")
    timezone = forms.CharField(
        label="Time zone", initial="UTC", max_length=_max_length("timezone"),
        widget=forms.TextInput(attrs={"spellcheck": "false", "autocomplete": "off"}),
        help_text="A zone name such as UTC or Europe/Berlin.")

    def __init__(self, *args: Any, agents: list[str], current_agent: str = "",
                 **kwargs: Any) -> None:
        """``agents``: the configured agents to choose from; a schedule's ``current_agent``
        is offered too when it is no longer configured, so saving never switches agents
        behind the person's back (the runtime then says the agent is unknown)."""
        super().__init__(*args, **kwargs)
        choices = [(a, a) for a in agents]
        if current_agent and current_agent not in agents:
            choices.append((current_agent, f"{current_agent} (not configured here)"))
        cast(forms.ChoiceField, self.fields["agent"]).choices = choices

    def clean_input(self) -> Any:
        return json_field(self.cleaned_data["input"], "the input")


class ScheduleCreateForm(ScheduleForm):
    name = forms.CharField(max_length=_max_length("name"),
                           widget=forms.TextInput(attrs={"autocomplete": "off"}),
                           help_text="Unique; runs it creates are started by schedule:NAME.")
    enabled = forms.BooleanField(required=False, initial=True,
                                 label="Enabled: start firing at once")
    field_order = ["name", "agent", "input", "cron", "interval_seconds", "timezone", "enabled"]


class ScheduleEditForm(ScheduleForm):
    """The schedule's editable fields, and the version of the schedule the person saw."""

    version = forms.IntegerField(widget=forms.HiddenInput, min_value=0)

    def __init__(self, *args: Any, schedule: Schedule | None = None, **kwargs: Any) -> None:
        if schedule is not None and not args and "initial" not in kwargs:
            kwargs["initial"] = {
                "agent": schedule.agent, "cron": schedule.cron,
                "input": json.dumps(schedule.input, indent=2, sort_keys=True,
                                    ensure_ascii=False),
                "interval_seconds": schedule.interval_seconds, "timezone": schedule.timezone,
                "version": schedule.event_seq}
        kwargs.setdefault("prefix", "edit")
        super().__init__(*args, **kwargs)


class AuthorizeScheduleForm(forms.Form):
    """Turning the standing authorization on: the version of the schedule the person read the
    confirmation for, and the ticked box."""

    version = forms.IntegerField(widget=forms.HiddenInput, min_value=0)
    confirm = forms.BooleanField(required=True,
                                 error_messages={"required": "Tick the box to confirm."})

    def __init__(self, *args: Any, confirm_label: str = "", **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["confirm"].label = confirm_label


class RemoveScheduleForm(forms.Form):
    confirm = forms.BooleanField(required=True, label="Yes: remove this schedule for good.",
                                 error_messages={"required": "Tick the box to confirm."})

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("prefix", "remove")
        super().__init__(*args, **kwargs)
