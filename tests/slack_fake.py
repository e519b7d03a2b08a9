"""A local fake of Slack for the tests: its Web API (``chat.postMessage``, ``chat.update``,
``views.open``) and its response URLs on 127.0.0.1, answering as Slack does (HTTP 200 with
``"ok": false`` for an error), keeping every call and every message as it now reads; and
interactions signed as Slack signs them (v0 HMAC-SHA256 of ``v0:{timestamp}:{body}``)."""

from __future__ import annotations

import hashlib
import hmac
import itertools
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlencode

TOKEN = "xoxb-0000-test-bot-token"
SECRET = "8f742231b10e8888abcd99yyyzzz85a5"


class FakeSlack:
    """Slack on loopback. ``calls``: (method, body) in order; ``messages``: (channel, ts) to
    the message as it reads now; ``responses``: what was posted to response URLs."""

    def __init__(self, token: str = TOKEN) -> None:
        self.token = token
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.messages: dict[tuple[str, str], dict[str, Any]] = {}
        self.responses: list[dict[str, Any]] = []
        self.refusals: dict[str, list[str]] = {}
        self.lock = threading.Lock()
        self._ts = itertools.count(1)
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                body = json.loads(raw or b"{}")
                if self.path.startswith("/respond/"):
                    with fake.lock:
                        fake.responses.append(body)
                    self._answer(b"ok", "text/plain")
                    return
                method = self.path.removeprefix("/api/")
                answer = fake.api(method, self.headers.get("Authorization", ""), body)
                self._answer(json.dumps(answer).encode(), "application/json")

            def _answer(self, data: bytes, kind: str) -> None:
                self.send_response(200)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base = f"http://127.0.0.1:{self.server.server_port}"
        self.url = f"{self.base}/api"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def api(self, method: str, auth: str, body: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            self.calls.append((method, body))
            if auth != f"Bearer {self.token}":
                return {"ok": False, "error": "invalid_auth"}
            if self.refusals.get(method):
                return {"ok": False, "error": self.refusals[method].pop(0)}
            if method == "chat.postMessage":
                ts = f"1767225600.{next(self._ts):06d}"
                self.messages[(body["channel"], ts)] = body
                return {"ok": True, "channel": body["channel"], "ts": ts, "message": body}
            if method == "chat.update":
                where = (body.get("channel"), body.get("ts"))
                if where not in self.messages:
                    return {"ok": False, "error": "message_not_found"}
                self.messages[where] = body  # type: ignore[index]
                return {"ok": True, "channel": where[0], "ts": where[1], "text": body["text"]}
            if method == "views.open":
                if not body.get("trigger_id"):
                    return {"ok": False, "error": "invalid_trigger_id"}
                return {"ok": True, "view": {"id": "V0FORM", **body["view"]}}
            return {"ok": False, "error": "unknown_method"}

    def refuse(self, method: str, *errors: str) -> None:
        """Answer the next calls of ``method`` with these errors (HTTP 200, ``ok: false``)."""
        with self.lock:
            self.refusals.setdefault(method, []).extend(errors)

    def calls_to(self, method: str) -> list[dict[str, Any]]:
        with self.lock:
            return [body for m, body in self.calls if m == method]

    def response_url(self, n: int = 1) -> str:
        return f"{self.base}/respond/{n}"

    def said(self) -> list[str]:
        """The texts told to people through response URLs, in order."""
        with self.lock:
            return [r["text"] for r in self.responses]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def signed(payload: dict[str, Any], timestamp: int, secret: str = SECRET) -> dict[str, Any]:
    """A form body and Slack's signature headers for an interaction payload, as a Django test
    client's ``post`` takes them."""
    body = urlencode({"payload": json.dumps(payload)})
    base = f"v0:{timestamp}:{body}".encode()
    signature = "v0=" + hmac.new(secret.encode(), base, hashlib.sha256).hexdigest()
    return {"data": body, "content_type": "application/x-www-form-urlencoded",
            "headers": {"X-Slack-Request-Timestamp": str(timestamp),
                        "X-Slack-Signature": signature}}


def buttons_of(message: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The buttons of a posted message, by action id."""
    return {e["action_id"]: e for b in message["blocks"] if b["type"] == "actions"
            for e in b["elements"]}


def press(message: dict[str, Any], action: str, user: str, response_url: str,
          value: str | None = None) -> dict[str, Any]:
    """The ``block_actions`` payload Slack sends when ``user`` presses a button of
    ``message``."""
    button = buttons_of(message)[action]
    return {"type": "block_actions", "user": {"id": user, "username": user.lower()},
            "trigger_id": f"trigger-{user}", "response_url": response_url,
            "container": {"type": "message", "channel_id": message["channel"]},
            "message": {"blocks": message["blocks"]},
            "actions": [{"type": "button", "action_id": action, "block_id": "x",
                         "value": button["value"] if value is None else value}]}


def submit(view: dict[str, Any], user: str, **typed: str) -> dict[str, Any]:
    """The ``view_submission`` payload for ``view`` (as given to ``views.open``) with the text
    ``typed`` into its inputs."""
    values = {block: {"value": {"type": "plain_text_input", "value": text}}
              for block, text in typed.items()}
    return {"type": "view_submission", "user": {"id": user},
            "view": {**view, "id": "V0FORM", "state": {"values": values}}}
