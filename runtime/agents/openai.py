"""An LLM that speaks the OpenAI-compatible chat-completions protocol with tool calling.

It works against hosted APIs and local servers (vLLM, llama.cpp, Ollama) alike: only the
protocol's common fields are sent and read. One ``complete`` call is one HTTP request; every
failure is raised as a typed ``LLMError`` and the driver decides whether and when to ask again,
so each failed attempt is recorded in the run's audit log rather than retried out of sight.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any

import httpx
from django.core.exceptions import ImproperlyConfigured

from runtime import conf
from runtime.agents.llm import (
    Decision,
    FinalAnswer,
    LLMResponse,
    ToolCall,
    Transcript,
    TranscriptEntry,
    Usage,
)
from runtime.agents.tools import ToolSpec
from runtime.canonical import dumps, parse_json
from runtime.errors import InvalidPayload, LLMError

# Statuses worth asking again: request timeout, conflict, rate limit, and every server error.
RETRYABLE_STATUSES = frozenset({408, 409, 429})

ENV_BASE_URL = "RUNTIME_LLM_BASE_URL"
ENV_MODEL = "RUNTIME_LLM_MODEL"
ENV_API_KEY = "RUNTIME_LLM_API_KEY"
ENV_TIMEOUT = "RUNTIME_LLM_TIMEOUT"


class OpenAIChat:
    """``POST {base_url}/chat/completions`` with the agent's tools; one request per call.

    ``max_retries`` is read by the driver: how many times it asks again after a retryable
    failure (None: ``settings.RUNTIME["LLM_RETRIES"]``, default 3). ``system_prompt`` is a
    string or a function of the transcript. ``transport`` lets a caller plug in an httpx
    transport (a proxy, a test double); by default each thread keeps its own client.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        *,
        timeout: float | httpx.Timeout = 60.0,
        max_retries: int | None = None,
        system_prompt: str | Callable[[Transcript], str] | None = None,
        temperature: float | None = None,
        max_tokens: int | None = None,
        extra_body: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        if not base_url:
            raise ValueError("base_url is required")
        if not model:
            raise ValueError("model is required")
        self.base_url = base_url.rstrip("/")
        self.url = f"{self.base_url}/chat/completions"
        self.model = model
        self.api_key = api_key or None
        self.timeout = timeout if isinstance(timeout, httpx.Timeout) else httpx.Timeout(
            timeout, connect=min(float(timeout), 10.0))
        self.max_retries = max_retries
        self.system_prompt = system_prompt
        self.temperature, self.max_tokens = temperature, max_tokens
        self.extra_body = dict(extra_body or {})
        self.headers = {"Accept": "application/json", **dict(headers or {})}
        if self.api_key:
            self.headers["Authorization"] = f"Bearer {self.api_key}"
        self.transport = transport
        self._local = threading.local()
        self._clients: list[httpx.Client] = []
        self._lock = threading.Lock()

    def __repr__(self) -> str:  # never shows the key
        return f"<OpenAIChat {self.model} at {self.base_url}>"

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **kw: Any) -> OpenAIChat:
        """Build from ``RUNTIME_LLM_BASE_URL``, ``RUNTIME_LLM_MODEL`` and (optional, local
        servers need none) ``RUNTIME_LLM_API_KEY``; ``RUNTIME_LLM_TIMEOUT`` in seconds."""
        env = os.environ if environ is None else environ
        url, model = conf.value(ENV_BASE_URL, env).strip(), conf.value(ENV_MODEL, env).strip()
        missing = [name for name, given in ((ENV_BASE_URL, url), (ENV_MODEL, model))
                   if not given]
        if missing:
            raise ImproperlyConfigured(f"{' and '.join(missing)} must be set to configure the LLM "
                                       f"(e.g. {ENV_BASE_URL}=http://127.0.0.1:8000/v1)")
        if env.get(ENV_TIMEOUT, "").strip():  # else the constructor's own default
            kw.setdefault("timeout", conf.value(ENV_TIMEOUT, env))
        return cls(url, model, conf.value(ENV_API_KEY, env).strip() or None, **kw)

    # -- the LLM interface ------------------------------------------------------------------

    def complete(self, transcript: Transcript, tools: Sequence[ToolSpec]) -> LLMResponse:
        """One chat-completions request; raises ``LLMError`` for anything but a usable answer."""
        body = self.request_body(transcript, tools)
        try:
            response = self._client().post(self.url, json=body)
        except httpx.TransportError as exc:
            raise transport_failure(exc, self.url) from None
        return parse_response(response)

    def request_body(self, transcript: Transcript, tools: Sequence[ToolSpec]) -> dict[str, Any]:
        """The JSON sent: equal transcripts give equal bodies, so a resumed run asks the same."""
        body: dict[str, Any] = {"model": self.model, "messages": self.messages(transcript)}
        if tools:
            body["tools"] = [tool_schema(spec) for spec in tools]
        if self.temperature is not None:
            body["temperature"] = self.temperature
        if self.max_tokens is not None:
            body["max_tokens"] = self.max_tokens
        body.update(self.extra_body)
        return body

    def messages(self, transcript: Transcript) -> list[dict[str, Any]]:
        prompt = self.system_prompt
        if callable(prompt):
            prompt = prompt(transcript)
        messages: list[dict[str, Any]] = []
        if prompt:
            messages.append({"role": "system", "content": prompt})
        messages.append({"role": "user", "content": _text(transcript.input)})
        for entry in transcript.entries:
            messages.extend(entry_messages(entry))
        return messages

    def close(self) -> None:
        """Close every thread's client (their connection pools)."""
        with self._lock:
            clients, self._clients = self._clients, []
        for client in clients:
            client.close()

    def _client(self) -> httpx.Client:
        client = getattr(self._local, "client", None)
        if client is None:  # one per thread: worker threads never share a connection pool
            client = httpx.Client(timeout=self.timeout, headers=self.headers,
                                  transport=self.transport)
            self._local.client = client
            with self._lock:
                self._clients.append(client)
        return client


class AsyncOpenAIChat:
    """``OpenAIChat`` with httpx's async client: ``complete`` is a coroutine, for agents whose
    other code is async. The request, the answer and every setting are ``OpenAIChat``'s (the
    same keyword arguments); ``transport`` is an async httpx transport. Each worker thread runs
    it on its own event loop (``runtime.agents.aio``) with a client of its own."""

    def __init__(self, base_url: str, model: str, api_key: str | None = None, *,
                 transport: httpx.AsyncBaseTransport | None = None, **options: Any) -> None:
        self._wrap(OpenAIChat(base_url, model, api_key, **options), transport)

    def _wrap(self, chat: OpenAIChat, transport: httpx.AsyncBaseTransport | None) -> None:
        self.chat, self.transport = chat, transport
        self.max_retries = chat.max_retries
        self._local = threading.local()

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, *,
                 transport: httpx.AsyncBaseTransport | None = None,
                 **kw: Any) -> AsyncOpenAIChat:
        """As ``OpenAIChat.from_env``."""
        made = cls.__new__(cls)
        made._wrap(OpenAIChat.from_env(environ, **kw), transport)
        return made

    def __repr__(self) -> str:  # never shows the key
        return f"<AsyncOpenAIChat {self.chat.model} at {self.chat.base_url}>"

    async def complete(self, transcript: Transcript, tools: Sequence[ToolSpec]) -> LLMResponse:
        """One chat-completions request; raises ``LLMError`` for anything but a usable answer."""
        body = self.chat.request_body(transcript, tools)
        try:
            response = await self._client().post(self.chat.url, json=body)
        except httpx.TransportError as exc:
            raise transport_failure(exc, self.chat.url) from None
        return parse_response(response)

    def _client(self) -> httpx.AsyncClient:
        client = getattr(self._local, "client", None)
        if client is None:  # one per thread, as the thread's event loop is
            client = httpx.AsyncClient(timeout=self.chat.timeout, headers=self.chat.headers,
                                       transport=self.transport)
            self._local.client = client
        return client


def transport_failure(exc: httpx.TransportError, url: str) -> LLMError:
    """What a request that never got an answer means for the driver: ask again, or not."""
    if isinstance(exc, httpx.UnsupportedProtocol):
        return LLMError(f"bad LLM URL {url}: {exc}", retryable=False)
    if isinstance(exc, httpx.TimeoutException):
        return LLMError(f"LLM request timed out ({type(exc).__name__})", retryable=True)
    return LLMError(f"LLM connection failed ({type(exc).__name__}: {exc})", retryable=True)


def tool_call_id(step_index: int) -> str:
    """Stable per step; nine alphanumerics, a shape every server's chat template accepts."""
    return f"s{step_index:08d}"


def tool_schema(spec: ToolSpec) -> dict[str, Any]:
    return {"type": "function", "function": {
        "name": spec.name, "description": spec.description, "parameters": spec.parameters}}


def entry_messages(entry: TranscriptEntry) -> list[dict[str, Any]]:
    """A finished tool call as the assistant's request and the tool's answer."""
    call_id = tool_call_id(entry.step_index)
    outcome = {"error": entry.error} if entry.error else entry.result
    return [
        {"role": "assistant", "content": None, "tool_calls": [{
            "id": call_id, "type": "function",
            "function": {"name": entry.tool, "arguments": dumps(entry.arguments or {})}}]},
        {"role": "tool", "tool_call_id": call_id, "content": dumps(outcome)},
    ]


def parse_response(response: httpx.Response) -> LLMResponse:
    """Decisions and usage from an HTTP response, or an ``LLMError`` saying why not."""
    status = response.status_code
    if status >= 400:
        retryable = status in RETRYABLE_STATUSES or status >= 500
        raise LLMError(f"LLM returned HTTP {status}: {_error_detail(response)}",
                       retryable=retryable, status=status,
                       retry_after=retry_after(response.headers.get("Retry-After")))
    try:
        data = parse_json("the body", response.content, limited=False)
    except InvalidPayload as exc:
        raise _malformed(status, f"the body is {exc.reason}") from None
    except ValueError:
        raise _malformed(status, "the body is not JSON") from None
    try:
        message = data["choices"][0]["message"]
    except (KeyError, IndexError, TypeError):
        raise _malformed(status, "no choices[0].message") from None
    if not isinstance(message, dict):
        raise _malformed(status, "choices[0].message is not an object")
    decisions: list[Decision] = [_tool_call(raw, status) for raw in message.get("tool_calls")
                                 or []]
    if not decisions:
        content = message.get("content")
        if not isinstance(content, str):
            raise _malformed(status, "neither tool calls nor text content")
        decisions = [FinalAnswer(content)]
    return LLMResponse(decisions, _usage(data.get("usage")))


def retry_after(value: str | None) -> float | None:
    """Seconds from a ``Retry-After`` header (delta-seconds or an HTTP date); None if absent."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - datetime.now(UTC)).total_seconds())


def _tool_call(raw: Any, status: int) -> ToolCall:
    function = raw.get("function") if isinstance(raw, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(name, str) or not name:
        raise _malformed(status, f"a tool call without a function name: {_short(raw)}")
    assert isinstance(function, dict), "the name was read from it"
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        try:  # their limits are the step's to apply: a value past them fails the step
            arguments = parse_json("tool call arguments", arguments, limited=False) \
                if arguments.strip() else {}
        except InvalidPayload as exc:
            raise _malformed(status, f"tool call {name!r} has arguments {exc.reason}") from None
        except ValueError:
            raise _malformed(status, f"tool call {name!r} has arguments that are not JSON: "
                                     f"{_short(arguments)}") from None
    elif arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        raise _malformed(status, f"tool call {name!r} has arguments that are not an object")
    return ToolCall(name, arguments)


def _usage(raw: Any) -> Usage:
    if not isinstance(raw, dict):
        return Usage()
    return Usage(tokens_in=_count(raw.get("prompt_tokens")),
                 tokens_out=_count(raw.get("completion_tokens")))


def _count(value: Any) -> int:
    return value if isinstance(value, int) and value >= 0 else 0


def _malformed(status: int, why: str) -> LLMError:
    return LLMError(f"malformed LLM response: {why}", retryable=True, status=status)


def _error_detail(response: httpx.Response) -> str:
    try:
        error = parse_json("the error", response.content, limited=False).get("error")
        detail = error.get("message") if isinstance(error, dict) else error
    except (InvalidPayload, ValueError, AttributeError):
        detail = None
    return _short(detail if detail else response.text or response.reason_phrase)


def _short(value: Any, limit: int = 300) -> str:
    text = value if isinstance(value, str) else repr(value)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "..."


def _text(value: Any) -> str:
    return value if isinstance(value, str) else dumps(value)
