"""Operators' decision forms. Everything is validated here, before the runtime is called, so a
bad form changes nothing; the runtime validates again (it trusts no caller)."""

from __future__ import annotations

import json
from typing import Any

from django import forms

from runtime.canonical import check_payload, parse_json
from runtime.errors import InvalidPayload

NOTE_MAX = 2000


class DecisionForm(forms.Form):
    """Base of the three decisions: a note and an explicit confirmation."""

    decision = ""
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
    decision = "approve"
    confirm_label = "Yes: run this exact request once more."


class ResolveForm(DecisionForm):
    decision = "resolve"
    confirm_label = "Yes: it happened; record this result and continue."
    result = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 5, "spellcheck": "false"}),
        help_text='The result you found, as JSON (e.g. {"charged": 500} or "done").')
    field_order = ["result", "note", "confirm"]

    def clean_result(self) -> Any:
        """The result as JSON within the runtime's limits. The text's size is checked before
        it is parsed, and no depth reaches the parser's recursion (``parse_json``): too large
        or too deep is a form error like bad JSON, never a server error."""
        text = self.cleaned_data["result"]
        try:
            value = parse_json("the result", text, parse_constant=_refuse_constant)
            check_payload("the result", value)  # the runtime's own limits, before it is asked
        except InvalidPayload as exc:
            raise forms.ValidationError(f"The result cannot be stored: {exc.reason}.") from None
        except json.JSONDecodeError as exc:
            raise forms.ValidationError(
                f"Not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno}).") from None
        except ValueError as exc:
            raise forms.ValidationError(str(exc)) from None
        return value


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"Not valid JSON: {name} is not a JSON number.")


class RejectForm(DecisionForm):
    decision = "reject"
    confirm_label = "Yes: end the run; do not call the tool again."
    note = forms.CharField(required=True, max_length=NOTE_MAX,
                           widget=forms.Textarea(attrs={"rows": 2}),
                           help_text="Required: why the run must stop.")


DECISION_FORMS: dict[str, type[DecisionForm]] = {
    f.decision: f for f in (ApproveForm, ResolveForm, RejectForm)}


class CancelRunForm(forms.Form):
    reason = forms.CharField(required=False, max_length=NOTE_MAX)
    confirm = forms.BooleanField(required=True, label="Yes: cancel this run.",
                                 error_messages={"required": "Tick the box to confirm."})
