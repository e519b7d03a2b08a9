"""Input limits: JSON nesting is bounded (RUNTIME["MAX_PAYLOAD_DEPTH"], 32 by default)
everywhere a payload enters (run input, tool arguments and results, final answers; resolve
results are tested through the console, tests/console/test_limits.py), measured without
recursion, so any depth is a clear ``InvalidPayload`` and never a ``RecursionError``, a crash,
or a stored value that breaks a page."""

from __future__ import annotations

import json
import sys

import httpx
import pytest
from django.core.management import CommandError, call_command

from runtime import Agent, FinalAnswer, ScriptedLLM, ToolCall, resume, start, tool
from runtime.agents.agent import registry
from runtime.agents.llm import LLMResponse, Usage
from runtime.agents.openai import parse_response
from runtime.audit.chain import verify
from runtime.canonical import (
    DEFAULT_MAX_PAYLOAD_DEPTH,
    check_payload,
    dumps,
    max_payload_depth,
    nesting_depth,
    parse_json,
)
from runtime.errors import InvalidPayload, LLMError
from runtime.models import Event, Run, Step
from tests.kit import Ledger, make_agent

LIMIT = DEFAULT_MAX_PAYLOAD_DEPTH
TOO_DEEP = f"nested deeper than {LIMIT} levels"
# Past the limit; past what the JSON encoder's recursion takes at the depth the runtime calls
# it (the pages broke at about 900); and far past Python's recursion limit.
DEPTHS = [LIMIT + 1, 1_000, 100_000]


def nest(depth: int, leaf: object = "x") -> object:
    """A value ``depth`` containers deep (objects and arrays in turn), built without
    recursion."""
    value = leaf
    for level in range(depth):
        value = [value] if level % 2 else {"k": value}
    return value


def nested_text(depth: int) -> str:
    """JSON text ``depth`` containers deep (``nest`` without the encoder's recursion)."""
    opening = "".join("[" if level % 2 else '{"k":' for level in reversed(range(depth)))
    closing = "".join("]" if level % 2 else "}" for level in range(depth))
    return opening + '"x"' + closing


def test_the_default_limit_is_32_levels(settings):
    settings.RUNTIME = {k: v for k, v in settings.RUNTIME.items() if k != "MAX_PAYLOAD_DEPTH"}
    assert max_payload_depth() == 32
    assert sys.getrecursionlimit() >= 1000  # the margin the default leaves pages


# -- measuring depth --------------------------------------------------------------------------


@pytest.mark.parametrize(("value", "depth"), [
    ("x", 0), (1, 0), (None, 0), ([], 1), ({}, 1), ([1, "a", None], 1), ({"a": "b"}, 1),
    ({"a": [1]}, 2), ([[], [[]], {"a": {"b": []}}], 4), ((1, (2,)), 2),
    ({"wide": [[1]] * 1000, "deep": nest(7)}, 8),
])
def test_nesting_depth_counts_containers_on_the_deepest_path(value, depth):
    assert nesting_depth(value, 100) == depth


def test_nesting_depth_stops_past_its_cap_without_recursion():
    deep = nest(1_000_000)  # a million levels: any recursion would have failed long before
    assert nesting_depth(deep, LIMIT) == LIMIT + 1
    assert nesting_depth(nest(500), 1_000) == 500
    looped: list = []
    looped.append(looped)  # a value that contains itself is infinitely deep
    assert nesting_depth(looped, LIMIT) == LIMIT + 1


def test_nested_text_matches_nest():
    assert json.loads(nested_text(5)) == nest(5)
    assert nesting_depth(json.loads(nested_text(LIMIT)), 100) == LIMIT


# -- check_payload and parse_json ------------------------------------------------------------


def test_a_payload_at_the_limit_passes_and_one_level_more_is_refused():
    assert check_payload("v", nest(LIMIT)) == nest(LIMIT)
    with pytest.raises(InvalidPayload) as info:
        check_payload("tool arguments", nest(LIMIT + 1))
    assert info.value.what == "tool arguments" and info.value.reason == TOO_DEEP
    assert str(info.value) == f"tool arguments: {TOO_DEEP}"


@pytest.mark.parametrize("depth", DEPTHS)
def test_any_depth_is_refused_clearly_never_a_recursion_error(depth):
    with pytest.raises(InvalidPayload, match=TOO_DEEP):
        check_payload("v", nest(depth))
    with pytest.raises(InvalidPayload, match=TOO_DEEP):
        parse_json("v", nested_text(depth))


def test_the_limit_is_a_setting(settings):
    settings.RUNTIME = {**settings.RUNTIME, "MAX_PAYLOAD_DEPTH": 4}
    assert check_payload("v", nest(4)) == nest(4)
    with pytest.raises(InvalidPayload, match="nested deeper than 4 levels"):
        check_payload("v", nest(5))
    with pytest.raises(InvalidPayload, match="nested deeper than 4 levels"):
        parse_json("v", nested_text(5))


def test_parse_json_refuses_text_larger_than_the_limit_before_parsing(settings, monkeypatch):
    settings.RUNTIME = {**settings.RUNTIME, "MAX_PAYLOAD_BYTES": 100}
    parsed: list[str] = []
    real = json.loads
    monkeypatch.setattr(json, "loads", lambda text, **kw: parsed.append(text) or real(text, **kw))
    big = json.dumps(["é" * 60])  # 60 characters, 120 bytes of UTF-8: bytes are counted
    with pytest.raises(InvalidPayload, match="bytes is larger than the limit of 100 bytes"):
        parse_json("--input", big)
    assert parsed == []
    assert parse_json("--input", '{"a": [1, 2]}') == {"a": [1, 2]}
    with pytest.raises(json.JSONDecodeError):  # not JSON: json's own error, for the caller
        parse_json("--input", "{nope")


def test_dumps_of_a_value_too_deep_to_encode_is_a_value_error():
    """``_checked_decisions`` (runtime/deciding.py) dumps an LLM's tool arguments before
    anything checks them: a ValueError there fails the LLM request cleanly."""
    with pytest.raises(ValueError, match="nested too deeply to encode"):
        dumps(nest(100_000))


def test_a_lone_surrogate_is_refused_not_a_crash():
    value = json.loads('{"note": "\\udc80"}')  # valid JSON text, but not UTF-8 once decoded
    with pytest.raises(InvalidPayload, match="lone surrogate"):
        check_payload("the result", value)


# -- where payloads enter: run input, tool arguments, tool results, final answers -----------


@pytest.mark.engines
@pytest.mark.parametrize("depth", DEPTHS)
def test_deep_run_input_is_refused_and_nothing_is_written(database, tmp_path, depth):
    agent = make_agent("deep", [FinalAnswer("ok")], Ledger(tmp_path / "l"))
    with registry.override(agent), pytest.raises(InvalidPayload, match=f"run input: {TOO_DEEP}"):
        start("deep", {"order": nest(depth)})
    assert not Run.objects.exists() and not Event.objects.exists()


@pytest.mark.engines
def test_run_input_at_the_limit_is_stored_and_read_back(database, tmp_path):
    value = nest(LIMIT)
    with registry.override(make_agent("deep", [FinalAnswer("ok")], Ledger(tmp_path / "l"))):
        run = resume(start("deep", value).pk)
    assert run.status == "succeeded" and Run.objects.get(pk=run.pk).input == value
    assert verify(run).ok


def _errors_seen_by_llm(transcript):
    if transcript.entries and transcript.entries[-1].error:
        return FinalAnswer({"saw": transcript.entries[-1].error})
    return None


def test_deep_tool_arguments_fail_the_step_as_other_invalid_arguments_do(database, tmp_path):
    """As for arguments too large: nothing deep is stored, the step fails with the reason,
    the tool is not called, and the LLM is shown the error."""
    ledger = Ledger(tmp_path / "l")
    llm = ScriptedLLM(lambda t: _errors_seen_by_llm(t) or ToolCall("read", {"key": nest(40)}))
    with registry.override(make_agent("deepargs", [], ledger, llm=llm)):
        run = resume(start("deepargs", {}).pk)
    step = Step.objects.get(run_id=run.pk, index=1)
    assert step.status == "failed" and step.error == f"tool arguments: {TOO_DEEP}"
    assert step.arguments is None and ledger.count() == 0
    decided = Event.objects.get(run_id=run.pk, kind="step.decided", step_index=1)
    assert decided.payload["arguments"] is None
    failed = Event.objects.get(run_id=run.pk, kind="step.tool_failed", step_index=1)
    assert failed.payload["started"] is False
    assert run.status == "succeeded" and run.output == {"saw": f"tool arguments: {TOO_DEEP}"}
    assert verify(run).ok


def test_tool_arguments_too_deep_to_encode_fail_the_run_cleanly(database, tmp_path):
    """Past what the encoder's recursion takes, the runtime's check of the LLM's answer
    (``_checked_decisions``) refuses it, as it does arguments JSON cannot hold: the request
    fails and the run with it, with the reason, and nothing deep is stored."""
    ledger = Ledger(tmp_path / "l")
    llm = ScriptedLLM([ToolCall("read", {"key": nest(100_000)})])
    with registry.override(make_agent("deeperargs", [], ledger, llm=llm)):
        run = resume(start("deeperargs", {}).pk)
    assert run.status == "failed" and run.failure_code == "error"
    assert "LLM request failed" in run.failure_message
    assert f"nested too deeply to encode as JSON (the limit is {LIMIT} levels)" in \
        run.failure_message
    assert not Step.objects.filter(run_id=run.pk, arguments__isnull=False).exists()
    assert ledger.count() == 0 and verify(run).ok


@pytest.mark.parametrize("depth", DEPTHS)
def test_a_deep_tool_result_fails_the_step_and_the_run_goes_on(database, tmp_path, depth):
    @tool(effect="read_only")
    def deep() -> object:
        """Return something too deep to store."""
        return {"rows": nest(depth)}

    llm = ScriptedLLM(lambda t: _errors_seen_by_llm(t) or ToolCall("deep"))
    with registry.override(Agent("deepresult", llm, [deep])):
        run = resume(start("deepresult", {}).pk)
    step = Step.objects.get(run_id=run.pk, index=1)
    assert step.status == "failed" and step.result is None
    assert step.error == f"result of deep: {TOO_DEEP}"
    failed = Event.objects.get(run_id=run.pk, kind="step.tool_failed")
    assert failed.payload["started"] is True and TOO_DEEP in failed.payload["error"]
    assert run.status == "succeeded" and run.output == {"saw": step.error}
    assert verify(run).ok


@pytest.mark.parametrize("depth", DEPTHS)
def test_a_deep_final_answer_fails_the_run(database, tmp_path, depth):
    llm = ScriptedLLM([FinalAnswer({"answer": nest(depth)})])
    with registry.override(make_agent("deepfinal", [], Ledger(tmp_path / "l"), llm=llm)):
        run = resume(start("deepfinal", {}).pk)
    assert run.status == "failed" and run.failure_code == "error"
    assert run.failure_message == f"final answer: {TOO_DEEP}" and run.output is None
    assert verify(run).ok


@pytest.mark.engines
def test_a_later_decision_that_cannot_be_stored_fails_the_answer_not_the_worker(database, tmp_path):
    """One answer with a tool call and, after it, a final answer too deep to keep: the later
    decision would wait in the run row, so the answer fails as a whole, cleanly, and the run
    is not left running with nobody's loop on it."""
    llm = ScriptedLLM(lambda transcript: LLMResponse(
        [ToolCall("lookup", {"q": 1}), FinalAnswer({"answer": nest(LIMIT + 5)})],
        Usage(tokens_in=1, tokens_out=1)))
    with registry.override(make_agent("later", [], Ledger(tmp_path / "l"), llm=llm)):
        run = resume(start("later", {}).pk)
    assert run.status == "failed" and run.failure_code == "error"
    assert TOO_DEEP in run.failure_message
    assert Run.objects.get(pk=run.pk).planned == []
    assert verify(run).ok


# -- JSON text parsed from outside: the commands' --input, an LLM server's tool calls ---------


@pytest.mark.parametrize("command", ["startrun", "runagent"])
def test_commands_refuse_deep_input_that_parses(database, command):
    with pytest.raises(CommandError, match=TOO_DEEP):
        call_command(command, "hello", "--input", nested_text(40))
    assert not Run.objects.exists()


@pytest.mark.parametrize("command", ["startrun", "runagent"])
def test_commands_refuse_input_too_deep_to_parse(database, command):
    with pytest.raises(CommandError, match=TOO_DEEP):
        call_command(command, "hello", "--input", nested_text(100_000))
    assert not Run.objects.exists()


def _chat(arguments: str) -> httpx.Response:
    call = {"id": "c1", "type": "function",
            "function": {"name": "lookup", "arguments": arguments}}
    return httpx.Response(200, json={"choices": [{"message": {"tool_calls": [call]}}]})


def test_openai_tool_arguments_that_parse_reach_the_runtimes_check():
    """Arguments the parser takes come back as a ToolCall; ``apply_decision``'s check_payload
    then fails the step (as test_deep_tool_arguments_fail_the_step... shows)."""
    [call] = parse_response(_chat('{"q":' + nested_text(39) + "}")).decisions
    assert nesting_depth(call.arguments, 100) == 40


@pytest.mark.parametrize("body", ["arguments", "whole body"])
def test_openai_answers_too_deep_to_parse_are_malformed_answers(body):
    if body == "arguments":
        response = _chat(nested_text(100_000))
    else:
        response = httpx.Response(200, content=nested_text(100_000).encode())
    with pytest.raises(LLMError, match="malformed LLM response") as info:
        parse_response(response)
    assert info.value.retryable
