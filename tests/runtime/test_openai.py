"""The OpenAI-compatible adapter against a real HTTP server on loopback, through real runs:
the conversation it sends, what it makes of answers, and every failure becoming a recorded,
bounded retry (or a cleanly failed run), never a half-recorded step."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured

from runtime import Agent, Budget, LLMError, OpenAIChat, resume, start, tool
from runtime.agents.agent import registry
from runtime.agents.openai import retry_after
from runtime.audit.chain import verify
from runtime.canonical import dumps
from runtime.errors import LeaseLost, SimulatedCrash
from runtime.leasing.heartbeat import LeaseKeeper
from runtime.loop.driver import Driver
from runtime.models import Event, Run, Step
from tests.kit import events_of

# -- a fake chat-completions server ---------------------------------------------------------


class FakeServer:
    """Records every request and answers from a script: one item per request, in order.

    An item is ``{"status", "body", "headers"}`` or ``{"hang": True}`` (hold the request until
    the test ends, so a short client timeout fires)."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.script: list[dict[str, Any]] = []
        self.release = threading.Event()
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                with server._lock:
                    server.requests.append({"path": self.path, "headers": dict(self.headers),
                                            "body": json.loads(raw)})
                    item = server.script.pop(0) if server.script else {"status": 599}
                if item.get("hang"):
                    server.release.wait(30)
                    return
                body = item.get("body", {})
                data = body if isinstance(body, bytes) else json.dumps(body).encode()
                try:
                    self.send_response(item.get("status", 200))
                    for name, value in item.get("headers", {}).items():
                        self.send_header(name, value)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:  # the client gave up (a timeout test)
                    pass

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,),
                                       daemon=True)
        self.thread.start()

    def then(self, *items: dict[str, Any]) -> FakeServer:
        with self._lock:
            self.script.extend(items)
        return self

    def bodies(self) -> list[dict[str, Any]]:
        return [r["body"] for r in self.requests]

    def stop(self) -> None:
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(10)


@pytest.fixture
def server() -> Iterator[FakeServer]:
    fake = FakeServer()
    yield fake
    fake.stop()


def answer(content: str | None = None, calls: list[tuple[str, Any]] = (),
           usage: tuple[int, int] = (10, 5)) -> dict[str, Any]:
    """A 200 chat-completions body; call arguments given as a dict are JSON-encoded."""
    tool_calls = [{"id": f"call_{i}", "type": "function", "function": {
        "name": name, "arguments": args if isinstance(args, str) else json.dumps(args)}}
        for i, (name, args) in enumerate(calls)]
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return {"status": 200, "body": {
        "id": "x", "object": "chat.completion", "model": "m",
        "choices": [{"index": 0, "message": message,
                     "finish_reason": "tool_calls" if tool_calls else "stop"}],
        "usage": {"prompt_tokens": usage[0], "completion_tokens": usage[1],
                  "total_tokens": sum(usage)}}}


def error(status: int, message: str = "nope", **headers: str) -> dict[str, Any]:
    return {"status": status, "body": {"error": {"message": message, "type": "x"}},
            "headers": {k.replace("_", "-"): v for k, v in headers.items()}}


# -- the agent and how it is run -------------------------------------------------------------


@tool(effect="read_only")
def lookup_order(order_id: str, verbose: bool = False) -> dict:
    """Find an order by its id."""
    return {"order_id": order_id, "paid_cents": 4200}


class Sleeper:
    """The driver's wait before a retry: records the time asked for, passes none of it.
    ``then`` runs on the first call (a crash, a takeover, a stop request)."""

    def __init__(self, then: Callable[[], None] | None = None) -> None:
        self.slept: list[float] = []
        self.then = then

    def __call__(self, seconds: float) -> None:
        self.slept.append(seconds)
        if self.then is not None:
            action, self.then = self.then, None
            action()

    @property
    def total(self) -> float:
        return sum(self.slept)


def agent_for(server: FakeServer, name: str = "oa", **kw: Any) -> Agent:
    budget = kw.pop("budget", None)
    llm = OpenAIChat(server.url, "test-model", "sk-secret", **{"timeout": 5.0, **kw})
    return Agent(name, llm, [lookup_order], budget=budget)


def run_agent(agent: Agent, sleeper: Sleeper | None = None, **kw: Any) -> Run:
    with registry.override(agent):
        return resume(start(agent.name, {"order": "A-1"}).pk, sleep=sleeper or Sleeper(), **kw)


def failures(run: Run) -> list[dict[str, Any]]:
    return list(Event.objects.filter(run_id=run.pk, kind="llm.failed").order_by("seq")
                .values_list("payload", flat=True))


# -- the protocol ----------------------------------------------------------------------------


def test_a_tool_call_round_trip_through_a_real_run(sqlite_path, server):
    server.then(answer(calls=[("lookup_order", {"order_id": "A-1"})], usage=(11, 7)),
                answer("refund issued", usage=(20, 3)))
    run = run_agent(agent_for(server, system_prompt="You handle refunds."))

    assert run.status == "succeeded" and run.output == "refund issued"
    assert (run.llm_requests, run.tokens_in, run.tokens_out) == (2, 31, 10)
    first, second = server.requests
    assert first["path"] == "/v1/chat/completions"
    assert first["headers"]["Authorization"] == "Bearer sk-secret"
    assert first["body"]["model"] == "test-model"
    assert first["body"]["tools"] == [{"type": "function", "function": {
        "name": "lookup_order", "description": "Find an order by its id.",
        "parameters": lookup_order.json_schema()}}]
    assert first["body"]["messages"] == [
        {"role": "system", "content": "You handle refunds."},
        {"role": "user", "content": '{"order":"A-1"}'},
    ]
    step = Step.objects.get(run_id=run.pk, index=1)
    assert second["body"]["messages"][2:] == [
        {"role": "assistant", "content": None, "tool_calls": [{
            "id": "s00000001", "type": "function",
            "function": {"name": "lookup_order", "arguments": '{"order_id":"A-1"}'}}]},
        {"role": "tool", "tool_call_id": "s00000001", "content": dumps(step.result)},
    ]
    assert step.result == {"order_id": "A-1", "paid_cents": 4200}
    assert failures(run) == [] and verify(run).ok


def test_a_tool_error_is_sent_back_as_the_tool_message(sqlite_path, server):
    server.then(answer(calls=[("lookup_order", {"order": "A-1"})]), answer("sorry"))
    run = run_agent(agent_for(server))
    assert run.status == "succeeded"
    tool_message = server.bodies()[1]["messages"][-1]
    assert tool_message["role"] == "tool"
    assert "order_id: Field required" in json.loads(tool_message["content"])["error"]
    assert "system" not in [m["role"] for m in server.bodies()[0]["messages"]]


def test_several_tool_calls_in_one_answer_are_consecutive_steps(sqlite_path, server):
    server.then(answer(calls=[("lookup_order", {"order_id": "A"}),
                              ("lookup_order", '{"order_id": "B"}')]),
                answer("both found"))
    run = run_agent(agent_for(server))
    assert run.status == "succeeded" and run.llm_requests == 2
    ids = [m["tool_call_id"] for m in server.bodies()[1]["messages"] if m["role"] == "tool"]
    assert ids == ["s00000001", "s00000002"]


# -- failures that are retried ---------------------------------------------------------------


@pytest.mark.parametrize(("retry_after", "cap", "waited"), [("7", 30, 7.0), ("3600", 5, 5.0)])
def test_a_rate_limit_waits_for_retry_after_then_retries(sqlite_path, server, settings, retry_after,
                                                         cap, waited):
    settings.RUNTIME = {**settings.RUNTIME, "LLM_RETRY_MAX_SECONDS": cap}
    server.then(error(429, "slow down", Retry_After=retry_after), answer("ok", usage=(8, 2)))
    sleeper = Sleeper()
    run = run_agent(agent_for(server), sleeper)

    assert run.status == "succeeded" and run.output == "ok"
    assert sleeper.total == pytest.approx(waited) and max(sleeper.slept) <= 0.2 + 1e-9
    assert failures(run) == [{"error": "LLM returned HTTP 429: slow down", "attempt": 1,
                              "retryable": True, "status": 429, "retry_in": waited}]
    kinds = events_of(run)
    assert kinds[kinds.index("llm.requested"):] == [
        "llm.requested", "llm.failed", "llm.requested", "llm.responded", "step.decided",
        "run.succeeded", "lease.released"]
    retry = Event.objects.filter(run_id=run.pk, kind="llm.requested").last()
    assert retry.payload == {"request": 1, "attempt": 2}
    # The retry is the same request: no new step, usage charged once, one request counted.
    assert Step.objects.filter(run_id=run.pk).count() == 1
    assert (run.llm_requests, run.tokens_in, run.tokens_out) == (1, 8, 2)
    assert server.bodies()[0] == server.bodies()[1]


@pytest.mark.parametrize(("failure", "expect"), [
    (error(500, "upstream broke"), "LLM returned HTTP 500: upstream broke"),
    (error(503, "overloaded"), "LLM returned HTTP 503: overloaded"),
    ({"status": 200, "body": b"<html>gateway</html>"}, "malformed LLM response: the body is "
                                                       "not JSON"),
    ({"status": 200, "body": {"choices": []}}, "malformed LLM response: no choices[0]"),
    (answer(calls=[("lookup_order", '{"order_id": ')]),
     "tool call 'lookup_order' has arguments that are not JSON"),
    (answer(calls=[("lookup_order", "[1, 2]")]), "arguments that are not an object"),
])
def test_server_errors_and_malformed_answers_are_retried(sqlite_path, server, failure, expect):
    server.then(failure, answer(calls=[("lookup_order", {"order_id": "A"})]), answer("done"))
    sleeper = Sleeper()
    run = run_agent(agent_for(server), sleeper)

    assert run.status == "succeeded" and run.output == "done"
    [failed] = failures(run)
    assert expect in failed["error"] and failed["retryable"] is True and failed["attempt"] == 1
    assert 0.5 <= sleeper.total <= 1.0  # first backoff: 1s with jitter down to half
    assert failed["retry_in"] == pytest.approx(sleeper.total)
    assert len(server.requests) == 3 and run.llm_requests == 2
    assert Step.objects.filter(run_id=run.pk).count() == 2


def test_a_timeout_is_retried(sqlite_path, server):
    server.then({"hang": True}, answer("after the timeout"))
    run = run_agent(agent_for(server, timeout=0.3))
    assert run.status == "succeeded" and run.output == "after the timeout"
    [failed] = failures(run)
    assert failed["error"] == "LLM request timed out (ReadTimeout)"
    assert failed["retryable"] is True and "status" not in failed


def test_a_refused_connection_is_retried_then_fails_the_run(sqlite_path):
    probe = FakeServer()
    url = probe.url
    probe.stop()  # nothing listens on this port any more
    agent = Agent("gone", OpenAIChat(url, "m", max_retries=1), [lookup_order])
    run = run_agent(agent)
    assert run.status == "failed" and run.failure_code == "error"
    assert [f["attempt"] for f in failures(run)] == [1, 2]
    assert "LLM connection failed (ConnectError" in run.failure_message


def test_retries_do_not_count_toward_max_llm_requests(sqlite_path, server):
    server.then(error(500), error(502), answer("ok"))
    run = run_agent(agent_for(server, budget=Budget(max_llm_requests=1)))
    assert run.status == "succeeded" and run.llm_requests == 1
    assert len(server.requests) == 3


# -- failures that end the run ---------------------------------------------------------------


def test_exhausted_retries_fail_the_run_without_a_half_recorded_step(sqlite_path, server):
    server.then(error(500, "a"), error(500, "b"), error(500, "c"), answer("too late"))
    sleeper = Sleeper()
    run = run_agent(agent_for(server, max_retries=2), sleeper)

    assert run.status == "failed" and run.failure_code == "error"
    assert run.failure_message == "LLM request failed: LLM returned HTTP 500: c"
    assert len(server.requests) == 3
    payloads = failures(run)
    assert [(f["attempt"], f["retryable"], "retry_in" in f) for f in payloads] == [
        (1, True, True), (2, True, True), (3, True, False)]
    assert sleeper.total == pytest.approx(payloads[0]["retry_in"] + payloads[1]["retry_in"])
    step = Step.objects.get(run_id=run.pk)
    assert step.status == "failed" and step.error == "LLM returned HTTP 500: c"
    assert step.tool == "" and "step.decided" not in events_of(run)
    assert events_of(run)[-4:] == ["llm.requested", "llm.failed", "run.failed",
                                   "lease.released"]
    assert (run.llm_requests, run.tokens_in, run.tokens_out) == (1, 0, 0)
    assert verify(run).ok


def test_the_retry_limit_defaults_to_the_setting(sqlite_path, server, settings):
    settings.RUNTIME = {**settings.RUNTIME, "LLM_RETRIES": 1}
    server.then(error(500), error(500), answer("too late"))
    run = run_agent(agent_for(server))
    assert run.status == "failed" and len(failures(run)) == 2 and len(server.requests) == 2


@pytest.mark.parametrize(("status", "message"), [(400, "bad request body"),
                                                 (401, "invalid api key"),
                                                 (404, "no such model")])
def test_client_errors_fail_the_run_at_once(sqlite_path, server, status, message):
    server.then(error(status, message), answer("never asked"))
    sleeper = Sleeper()
    run = run_agent(agent_for(server), sleeper)

    assert run.status == "failed" and run.failure_code == "error"
    assert run.failure_message == f"LLM request failed: LLM returned HTTP {status}: {message}"
    assert failures(run) == [{"error": f"LLM returned HTTP {status}: {message}", "attempt": 1,
                              "retryable": False, "status": status}]
    assert len(server.requests) == 1 and sleeper.slept == []
    assert Step.objects.get(run_id=run.pk).status == "failed"
    assert "sk-secret" not in json.dumps(list(Event.objects.values_list("payload", flat=True)))


# -- interruptions during the wait before a retry --------------------------------------------


def test_a_crash_while_waiting_to_retry_leaves_the_step_resumable(sqlite_path, server, clock):
    server.then(answer(calls=[("lookup_order", {"order_id": "A"})]), error(500),
                answer("done"))

    def crash() -> None:
        raise SimulatedCrash("while waiting to retry", None, 2)

    agent = agent_for(server)
    with registry.override(agent):
        run = start("oa", {"order": "A"})
        with pytest.raises(SimulatedCrash):
            resume(run.pk, clock=clock, lease_seconds=5, sleep=Sleeper(crash))
        step = Step.objects.get(run_id=run.pk, index=2)
        assert step.status == "deciding" and events_of(run)[-1] == "llm.failed"
        clock.advance(10)
        run = resume(run.pk, clock=clock, lease_seconds=5, sleep=Sleeper())

    assert run.status == "succeeded" and run.output == "done"
    kinds = events_of(run)
    assert kinds.count("step.decided") == 2 and "step.interrupted" in kinds
    # The resumed run asks exactly what the interrupted one asked.
    assert len(server.requests) == 3 and server.bodies()[1] == server.bodies()[2]
    assert verify(run).ok


def test_a_lease_lost_while_waiting_stops_before_the_retry(sqlite_path, server, clock):
    server.then(error(503), answer("done by the new owner"))
    keeper = LeaseKeeper(5, clock=clock)  # its heartbeat is run by hand below
    other = Driver(name="other", lease_seconds=5, clock=clock, keeper=LeaseKeeper(5, clock=clock))
    taken: list = []

    def taken_over() -> None:
        clock.advance(10)
        taken.append(other.acquire(run.pk))
        keeper.renew_now()  # the heartbeat finds the lease gone

    with registry.override(agent_for(server)):
        run = start("oa", {})
        first = Driver(name="first", lease_seconds=5, clock=clock, keeper=keeper,
                       sleep=Sleeper(taken_over))
        with pytest.raises(LeaseLost, match="heartbeat"):  # noticed while waiting
            first.drive(run.pk)
        assert len(server.requests) == 1  # the retry never went out
        run = other.execute(taken[0])

    assert run.status == "succeeded" and run.output == "done by the new owner"
    assert len(server.requests) == 2 and verify(run).ok


def test_a_stop_request_while_waiting_releases_the_run(sqlite_path, server):
    server.then(error(429, Retry_After="20"), answer("done later"))
    stop = threading.Event()
    with registry.override(agent_for(server)):
        run = start("oa", {})
        driver = Driver(name="w", lease_seconds=30, keeper=LeaseKeeper(30),
                        sleep=Sleeper(stop.set))
        run = driver.execute(driver.acquire(run.pk), should_stop=stop.is_set)
        assert run.status == "queued" and events_of(run)[-3:] == [
            "llm.failed", "run.released", "lease.released"]
        assert Step.objects.get(run_id=run.pk).status == "deciding"
        run = resume(run.pk, sleep=Sleeper())
    assert run.status == "succeeded" and len(server.requests) == 2


# -- configuration ---------------------------------------------------------------------------


def test_from_env_names_what_is_missing():
    with pytest.raises(ImproperlyConfigured, match="RUNTIME_LLM_BASE_URL and RUNTIME_LLM_MODEL"):
        OpenAIChat.from_env({})
    with pytest.raises(ImproperlyConfigured, match=r"^RUNTIME_LLM_MODEL must be set"):
        OpenAIChat.from_env({"RUNTIME_LLM_BASE_URL": "http://127.0.0.1:1/v1"})
    with pytest.raises(ImproperlyConfigured, match="RUNTIME_LLM_TIMEOUT must be a number"):
        OpenAIChat.from_env({"RUNTIME_LLM_BASE_URL": "http://h/v1", "RUNTIME_LLM_MODEL": "m",
                             "RUNTIME_LLM_TIMEOUT": "soon"})


def test_from_env_builds_a_client_with_or_without_a_key(monkeypatch):
    monkeypatch.setenv("RUNTIME_LLM_BASE_URL", "http://127.0.0.1:8000/v1/")
    monkeypatch.setenv("RUNTIME_LLM_MODEL", "qwen2.5")
    monkeypatch.delenv("RUNTIME_LLM_API_KEY", raising=False)
    local = OpenAIChat.from_env(max_retries=5)
    assert (local.url, local.model, local.max_retries) == (
        "http://127.0.0.1:8000/v1/chat/completions", "qwen2.5", 5)
    assert "Authorization" not in local.headers
    monkeypatch.setenv("RUNTIME_LLM_API_KEY", "sk-x")
    hosted = OpenAIChat.from_env()
    assert hosted.headers["Authorization"] == "Bearer sk-x" and "sk-x" not in repr(hosted)


def test_llm_error_carries_typed_attributes():
    exc = LLMError("rate limited", retryable=True, retry_after=2.5, status=429)
    assert (exc.retryable, exc.retry_after, exc.status, str(exc)) == (
        True, 2.5, 429, "rate limited")


def test_retry_after_reads_seconds_and_http_dates():
    assert retry_after("12") == 12.0 and retry_after("-3") == 0.0 and retry_after(None) is None
    assert retry_after("soon") is None
    when = datetime.now(UTC) + timedelta(seconds=90)
    assert 80 <= retry_after(format_datetime(when, usegmt=True)) <= 90
