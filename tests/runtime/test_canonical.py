"""Canonical JSON: what is stored comes back the same on both engines, so every hash over it
holds; what one engine cannot store is refused with a clear error on both."""

from __future__ import annotations

import json

import pytest

from runtime import start
from runtime.agents.agent import registry
from runtime.audit.chain import verify
from runtime.canonical import check_payload, dumps
from runtime.errors import InvalidPayload
from runtime.models import Event, Run
from tests.kit import FinalAnswer, Ledger, make_agent

pytestmark = pytest.mark.engines

AWKWARD = {"big": 1e16, "bigger": 1.5e300, "negative_zero": -0.0, "tiny": 1e-7, "half": 0.5,
           "exact": 2**70, "text": "a \\u0000 that is only text", "nested": [[-0.0, 1e20]]}


def test_awkward_numbers_come_back_as_they_were_hashed(database, tmp_path):
    agent = make_agent("canon", [FinalAnswer("ok")], Ledger(tmp_path / "ledger"))
    with registry.override(agent):
        run = start("canon", AWKWARD)
    stored = Run.objects.get(pk=run.pk).input
    assert dumps(stored) == dumps(check_payload("input", AWKWARD))
    created = Event.objects.get(run_id=run.pk, kind="run.created")
    assert created.payload["input"] == stored
    assert verify(run.pk).ok  # the chain recomputed from what the database gave back


@pytest.mark.parametrize("bad", [{"note": "a\x00b"}, {"k\x00": 1}, ["\x00"]])
def test_a_nul_character_is_refused_on_both_engines_and_nothing_is_written(database, tmp_path, bad):
    agent = make_agent("canon", [FinalAnswer("ok")], Ledger(tmp_path / "ledger"))
    with registry.override(agent), pytest.raises(InvalidPayload, match="NUL character"):
        start("canon", bad)
    assert not Run.objects.exists() and not Event.objects.exists()


@pytest.mark.parametrize("bad", [{"note": "\udc80"}, ["\ud800"], {"k\udfff": 1}])
def test_a_lone_surrogate_is_refused_on_both_engines_and_nothing_is_written(
        database, tmp_path, bad):
    """Valid JSON text can carry one (``"\\udc80"``), but it is not UTF-8: neither engine
    stores it, and encoding it was a crash (UnicodeEncodeError), not a refusal."""
    agent = make_agent("canon", [FinalAnswer("ok")], Ledger(tmp_path / "ledger"))
    with registry.override(agent), pytest.raises(InvalidPayload, match="lone surrogate"):
        start("canon", bad)
    assert not Run.objects.exists() and not Event.objects.exists()


CANONICAL_OPTIONS = {"sort_keys": True, "separators": (",", ":"), "ensure_ascii": False,
                     "allow_nan": False}


@pytest.mark.parametrize("value", [
    "plain", "ü \u2028 \" \\ \t", "\ud800", 0, -1, 2**70, -0.0, 1e16, 1e-7, 0.1, None, True,
    [], {}, (1, "two"), {"b": [1, {"z": None, "a": "é"}], "a": {"nested": [[1.5]]}},
    {1: "int key", 2.5: "float key"}, {False: "bool key"}, AWKWARD,
], ids=repr)
def test_the_canonical_form_is_json_dumps_with_the_canonical_options(value):
    """The encoder made once writes every value exactly as ``json.dumps`` with the canonical
    options does: the chains hashed before it must still verify."""
    assert dumps(value) == json.dumps(value, **CANONICAL_OPTIONS)


@pytest.mark.parametrize("value", [float("nan"), {"a": float("inf")}, [object()],
                                   {"a": 1, 2: "mixed keys cannot be sorted"}],
                         ids=lambda v: "[object()]" if v and isinstance(v, list) else repr(v))
def test_what_json_cannot_hold_is_refused_as_json_dumps_refuses_it(value):
    with pytest.raises((TypeError, ValueError)) as ours:
        dumps(value)
    with pytest.raises((TypeError, ValueError)) as theirs:
        json.dumps(value, **CANONICAL_OPTIONS)
    assert type(ours.value) is type(theirs.value)


def test_a_value_that_contains_itself_is_a_value_error():
    value: dict = {}
    value["self"] = value
    with pytest.raises(ValueError, match="nested too deeply"):
        dumps(value)
