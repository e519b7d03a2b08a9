"""Operators' decision forms. Everything is validated here, before the runtime is called, so a
bad form changes nothing; the runtime validates again (it trusts no caller)."""

from __future__ import annotations

import json
from typing import Any, cast

from django import forms
from django.db import models

from runtime.approvals.rules import Decision
from runtime.canonical import check_payload, dumps, parse_json
from runtime.errors import InvalidPayload
from runtime.models import Schedule
from runtime.schedules.timing import MAX_INTERVAL_SECONDS, MIN_INTERVAL_SECONDS, timing_problems

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


ARGUMENT = "arg-"  # the form's name of a tool argument's field: ARGUMENT + its name


class EditForm(DecisionForm):
    """Edit, then allow (a policy approval): one field per top-level property of the tool's
    argument schema, pre-filled with the proposed values. Each field only shapes its value
    (text, a number, a box, a choice, JSON); the tool's own schema judges the whole when the
    runtime is asked (``InvalidEdit``), and ``refused`` puts its answer next to each field."""

    decision = Decision.APPROVE
    confirm_label = "Yes: run the call once, with these arguments."

    def __init__(self, *args: Any, schema: dict[str, Any], proposed: Any,
                 **kwargs: Any) -> None:
        kwargs.setdefault("prefix", "edit")
        super().__init__(*args, **kwargs)
        proposed = proposed if isinstance(proposed, dict) else {}
        required = set(schema.get("required") or ())
        self.kinds: dict[str, tuple[str, str, bool]] = {}  # field -> argument, kind, required
        fields: dict[str, forms.Field] = {}
        for name, prop in (schema.get("properties") or {}).items():
            prop = _resolved(prop, schema)
            kind = _kind(prop)
            key = ARGUMENT + name
            self.kinds[key] = (name, kind, name in required)
            fields[key] = _argument_field(name, prop, kind, name in required)
            value = proposed[name] if name in proposed else prop.get("default")
            if name in proposed or "default" in prop:
                self.initial[key] = _shown(kind, value)
                if kind == "json":  # tall enough for what it holds, up to a point
                    lines = str(self.initial[key]).count("\n") + 1
                    fields[key].widget.attrs["rows"] = min(max(lines, 2), 12)
        self.fields = {**fields, "note": self.fields["note"], "confirm": self.fields["confirm"]}

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        for key, (name, kind, _required) in self.kinds.items():
            if kind == "json" and data.get(key):
                try:
                    data[key] = json_field(data[key], f"argument {name}")
                except forms.ValidationError as exc:
                    self.add_error(key, exc)
        return data

    def arguments(self) -> dict[str, Any]:
        """The edited arguments as JSON (a valid form's); an empty optional field is left out,
        so the tool's default applies."""
        out: dict[str, Any] = {}
        for key, (name, kind, required) in self.kinds.items():
            value = self.cleaned_data.get(key)
            if kind == "boolean":
                out[name] = bool(value)
            elif value is None or (value == "" and (kind != "string" or not required)):
                continue
            elif kind == "enum":
                out[name] = json.loads(value)
            else:
                out[name] = value
        return out

    def refused(self, reason: str, fields: dict[str, str]) -> None:
        """The runtime's refusal of the edit, each part next to the field it names."""
        for name, message in fields.items():
            key = ARGUMENT + name
            if key in self.fields:
                self.add_error(key, message[:1].upper() + message[1:] + ".")
            else:
                self.add_error(None, f"{name or 'The arguments'}: {message}.")
        if not fields:
            self.add_error(None, reason[:1].upper() + reason[1:] + ".")


def _resolved(prop: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    """A property's schema with a reference to ``$defs`` followed and an optional's ``null``
    branch dropped (pydantic writes ``int | None`` as ``anyOf``)."""
    branches = prop.get("anyOf") or prop.get("allOf")
    if isinstance(branches, list):
        real = [b for b in branches if b.get("type") != "null"]
        if len(real) == 1:
            prop = {**{k: v for k, v in prop.items() if k not in ("anyOf", "allOf")}, **real[0]}
    ref = prop.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/$defs/"):
        found = (schema.get("$defs") or {}).get(ref.removeprefix("#/$defs/")) or {}
        prop = {**found, **{k: v for k, v in prop.items() if k != "$ref"}}
    return prop


def _kind(prop: dict[str, Any]) -> str:
    if isinstance(prop.get("enum"), list) and prop["enum"]:
        return "enum"
    kind = prop.get("type")
    return kind if kind in ("string", "integer", "number", "boolean") else "json"


def _argument_field(name: str, prop: dict[str, Any], kind: str, required: bool) -> forms.Field:
    """The field for one argument: text, a number, a box, a choice, or JSON in a text box."""
    help_text = str(prop.get("description") or "")[:300]
    options: dict[str, Any] = {"label": name, "required": required and kind != "boolean",
                               "help_text": help_text}
    if kind == "enum":
        choices = [(dumps(v), str(v)) for v in prop["enum"]]
        return forms.ChoiceField(choices=choices if required else [("", "—"), *choices],
                                 **options)
    if kind == "integer":
        return forms.IntegerField(**options)
    if kind == "number":
        return forms.FloatField(widget=forms.NumberInput(attrs={"step": "any"}), **options)
    if kind == "boolean":
        return forms.BooleanField(**options)
    if kind == "string":
        return forms.CharField(strip=False, empty_value="", **options,
                               widget=forms.TextInput(attrs={"spellcheck": "false",
                                                             "autocomplete": "off"}))
    options["help_text"] = help_text or "As JSON."
    return forms.CharField(widget=forms.Textarea(attrs={"rows": 4, "spellcheck": "false"}),
                           **options)


def _shown(kind: str, value: Any) -> Any:
    """A proposed value as its field shows it."""
    if kind == "enum":
        return dumps(value)
    if kind == "json":
        return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)
    return value


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

    def clean(self) -> dict[str, Any]:
        """Every problem with when it fires, at once, each next to its field (the runtime's
        ``timing_problems``: the rules are its own), beside the fields' own errors."""
        data = super().clean() or {}
        when = ("cron", "interval_seconds", "timezone")
        if any(name in self.errors for name in when):
            return data  # a field that did not parse already says why
        for problem in timing_problems(data.get("cron", ""), data.get("interval_seconds"),
                                       data.get("timezone", "")):
            self.add_error(problem.field, problem.reason[:1].upper() + problem.reason[1:] + ".")
        return data


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
