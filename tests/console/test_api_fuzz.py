"""Inputs a fuzzer found answered badly by the JSON API: cursors that decode to dates out of
range, a lone surrogate hashed for an ``Idempotency-Key``, HEAD and OPTIONS, a body not sent as
JSON, a chunked body. Each is a clear JSON error with a code and changes nothing; through
Django's test client, and (slow) against gunicorn, where a chunked body has no Content-Length."""

from __future__ import annotations

import base64
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.test import Client

from console.models import IdempotentRequest
from runtime.models import Approval, Run
from tests.console import test_api
from tests.console.test_api import DECIDER, call, decide_body
from tests.procs import ROOT

token_for = test_api.token_for  # the fixture, shared

OUT_OF_RANGE = ["WyI5OTk5LTEyLTMxVDIzOjU5OjU5LTE0OjAwIiwgMV0",
                "WyIwMDAxLTAxLTAxVDAwOjAwOjAwKzE0OjAwIiwgMV0"]


def _with_surrogate(body: dict) -> str:
    """``body`` as JSON text with ``"SURROGATE"`` written as the escape of a lone surrogate
    (ASCII on the wire; a lone surrogate once parsed)."""
    return json.dumps(body).replace('"SURROGATE"', r'"\ud800"')


def _cursor(value: object) -> str:
    return base64.urlsafe_b64encode(json.dumps(value).encode()).decode().rstrip("=")


def _invalid(response, code: str = "invalid", status: int = 422) -> dict:
    assert response.status_code == status, response.content[:300]
    assert response["Content-Type"].startswith("application/json")
    body = response.json()
    assert body["code"] == code and body["message"], body
    return body


def _post_text(path: str, token: str, text: str | bytes, content_type: str = "application/json",
               **headers: str):
    return Client().post(path, data=text, content_type=content_type,
                         headers={"Authorization": f"Bearer {token}", **headers})


# -- 1. every value checked before it is used ------------------------------------------------

def test_cursors_out_of_range_are_invalid_not_a_server_error(interrupted, token_for):
    w = interrupted()
    token = token_for("cur", *DECIDER)
    huge = 2**70
    for cursor in [*OUT_OF_RANGE, _cursor(["2026-01-01T00:00:00+00:00", huge]),
                   _cursor(["2026-01-01T00:00:00+00:00", -1]), _cursor(["+999999-01-01", 1]),
                   _cursor([[[[[]]]], 1])]:
        _invalid(call("get", f"/api/approvals/?cursor={cursor}", token))
    for cursor in (_cursor([huge]), _cursor([-5]), _cursor([True])):
        _invalid(call("get", f"/api/runs/{w.run.pk}/events?cursor={cursor}", token))
    # A cursor the API gave out still works.
    first = call("get", "/api/approvals/?limit=1", token).json()
    assert first["items"][0]["id"] == w.approval.pk


def test_a_lone_surrogate_with_an_idempotency_key_is_invalid(interrupted, token_for):
    """The body is checked before it is hashed for the idempotency record: with a key as
    without one, a 422 (not a 500), no run, no decision, no record kept."""
    w = interrupted()
    token = token_for("sur", *DECIDER, "runtime.add_run")
    runs = Run.objects.count()
    resolve = {"decision": "resolve", "expected_digest": w.approval.digest,
               "result": "SURROGATE"}
    batch = {"decision": "reject", "note": "SURROGATE",
             "approvals": [{"id": w.approval.pk, "digest": w.approval.digest}]}
    cases = [("/api/runs", {"agent": "pay", "input": "SURROGATE"}),
             ("/api/runs", {"agent": "SURROGATE", "input": {}}),
             (f"/api/approvals/{w.approval.pk}/decide", resolve),
             ("/api/approvals/999999/decide", resolve), ("/api/approvals/decide", batch)]
    for n, (path, body) in enumerate(cases):
        text = _with_surrogate(body)
        answer = _invalid(_post_text(path, token, text, **{"Idempotency-Key": f"k-{n}"}))
        assert "surrogate" in answer["message"] or answer["errors"], answer  # or the schema's
        if "999999" not in path:  # without a key, an unknown approval is a 404 first
            _invalid(_post_text(path, token, text))
    assert Run.objects.count() == runs
    assert Approval.objects.get(pk=w.approval.pk).status == "pending"
    assert IdempotentRequest.objects.count() == 0


# -- 2. HEAD and OPTIONS ---------------------------------------------------------------------

def test_head_and_options_on_every_api_path_answer_json(interrupted, token_for):
    """HEAD on a path that serves GET is GET's status and headers without a body; elsewhere,
    as OPTIONS everywhere, a JSON 405 whose ``Allow`` names what the path serves."""
    w = interrupted()
    token = token_for("hed", *DECIDER, "runtime.add_run")
    gets = ["/api/approvals/", f"/api/approvals/{w.approval.pk}", "/api/approvals/999999",
            f"/api/runs/{w.run.pk}", f"/api/runs/{w.run.pk}/events", "/api/openapi.json"]
    posts = ["/api/runs", "/api/approvals/decide", f"/api/approvals/{w.approval.pk}/decide"]
    for who in (token, None):
        for path in gets:
            got, head = call("get", path, who), call("head", path, who)
            assert head.status_code == got.status_code, (path, who)
            assert head["Content-Type"] == got["Content-Type"], path
            assert got["Content-Type"].startswith("application/json"), path
            assert head.content == b"" and got.content, path
        for path in posts:
            head = call("head", path, who)
            assert (head.status_code, head["Allow"], head.content) == (405, "POST", b"")
            assert head["Content-Type"].startswith("application/json")
        for path in gets + posts:
            options = call("options", path, who)
            body = _invalid(options, "method_not_allowed", 405)
            assert options["Allow"] in ("GET, HEAD", "POST") and options["Allow"] in (
                body["message"]), path
        _invalid(call("options", "/api/nothing", who), "not_found", 404)
        assert call("head", "/api/nothing", who).status_code == 404
    assert Approval.objects.get(pk=w.approval.pk).status == "pending"


# -- 3. a body not sent as JSON --------------------------------------------------------------

def test_a_body_not_sent_as_json_is_415_and_changes_nothing(interrupted, token_for):
    w = interrupted()
    token = token_for("typ", *DECIDER, "runtime.add_run")
    runs = Run.objects.count()
    bodies = {"/api/runs": {"agent": "pay", "input": {}},
              f"/api/approvals/{w.approval.pk}/decide": decide_body(w.approval),
              "/api/approvals/decide": {"decision": "approve", "approvals": [
                  {"id": w.approval.pk, "digest": w.approval.digest}]}}
    for path, body in bodies.items():
        text = json.dumps(body)
        for kind in ("text/plain", "", "application/x-www-form-urlencoded",
                     "application/jsonx", "text/json; charset=utf-8"):
            for key in ({}, {"Idempotency-Key": f"t-{kind}"}):
                response = _post_text(path, token, text, kind, **key)
                answer = _invalid(response, "unsupported_media_type", 415)
                assert "application/json" in answer["message"]
        assert _post_text(path, "not-a-token", text, "text/plain").status_code == 401
    assert Run.objects.count() == runs
    assert Approval.objects.get(pk=w.approval.pk).status == "pending"
    assert IdempotentRequest.objects.count() == 0
    # Parameters of application/json are fine.
    created = _post_text("/api/runs", token, json.dumps(bodies["/api/runs"]),
                         "Application/JSON; charset=utf-8")
    assert created.status_code == 201 and Run.objects.count() == runs + 1


# -- 4. a chunked body -----------------------------------------------------------------------

class _Counting(io.BytesIO):
    """``wsgi.input`` that counts what is read of it."""

    def __init__(self, data: bytes) -> None:
        super().__init__(data)
        self.taken = 0

    def read(self, size: int | None = -1) -> bytes:
        chunk = super().read(size)
        self.taken += len(chunk)
        return chunk


def _chunked(path: str, token: str, data: bytes, terminated: bool = True):
    """As gunicorn hands Django a chunked body: no CONTENT_LENGTH, the body in ``wsgi.input``
    ended at its end (``wsgi.input_terminated``)."""
    stream = _Counting(data)
    extra: dict[str, Any] = {"CONTENT_LENGTH": "", "CONTENT_TYPE": "application/json",
                             "HTTP_TRANSFER_ENCODING": "chunked", "wsgi.input": stream}
    if terminated:
        extra["wsgi.input_terminated"] = True
    response = Client().post(path, headers={"Authorization": f"Bearer {token}"}, **extra)
    return response, stream


def test_a_chunked_body_is_read_within_the_limit(interrupted, token_for, settings):
    interrupted()
    settings.RUNTIME = {**settings.RUNTIME, "MAX_PAYLOAD_BYTES": 1000}
    token = token_for("chu", *DECIDER, "runtime.add_run")
    runs = Run.objects.count()
    response, _ = _chunked("/api/runs", token, b'{"agent": "pay", "input": {"n": 1}}')
    assert response.status_code == 201, response.content
    assert Run.objects.get(pk=response.json()["id"]).input == {"n": 1}
    big = json.dumps({"agent": "pay", "input": {"x": "y" * 100_000}}).encode()
    response, stream = _chunked("/api/runs", token, big)
    assert "larger than the limit" in _invalid(response)["message"]
    assert stream.taken <= 1001  # read no further than one byte past the limit
    response, stream = _chunked("/api/runs", token, big, terminated=False)
    assert "chunked" in _invalid(response)["message"] and stream.taken == 0
    assert Run.objects.count() == runs + 1


# -- against gunicorn ------------------------------------------------------------------------

@pytest.mark.slow
def test_bad_inputs_against_gunicorn(server, interrupted, token_for):
    """The same inputs through a real server: gunicorn hands a chunked body over without a
    Content-Length; every answer is JSON with a code, and nothing changes but the one run."""
    w = interrupted()
    token = token_for("gun", *DECIDER, "runtime.add_run")
    url = server.ready()
    runs = Run.objects.count()
    auth = {"Authorization": f"Bearer {token}"}
    as_json = {**auth, "Content-Type": "application/json"}
    with httpx.Client(base_url=url, timeout=60) as http:
        def check(response: httpx.Response, status: int, code: str) -> dict:
            assert response.status_code == status, response.text[:300]
            assert response.headers["Content-Type"].startswith("application/json")
            body = response.json()
            assert body["code"] == code, body
            return body

        for cursor in OUT_OF_RANGE:
            check(http.get(f"/api/approvals/?cursor={cursor}", headers=auth), 422, "invalid")
        for path, body in [
            ("/api/runs", {"agent": "payout", "input": "SURROGATE"}),
            ("/api/approvals/999999/decide", {"decision": "resolve", "expected_digest":
                                              w.approval.digest, "result": "SURROGATE"}),
            ("/api/approvals/decide", {"decision": "reject", "note": "SURROGATE", "approvals":
                                       [{"id": w.approval.pk, "digest": w.approval.digest}]}),
        ]:
            text = _with_surrogate(body)
            check(http.post(path, content=text, headers={**as_json, "Idempotency-Key": path}),
                  422, "invalid")
        run = '{"agent": "payout", "input": {}}'
        check(http.post("/api/runs", content=run, headers={**auth, "Content-Type":
                                                           "text/plain"}), 415,
              "unsupported_media_type")
        check(http.post("/api/runs", content=run, headers=auth), 415, "unsupported_media_type")
        head = http.head("/api/approvals/", headers=auth)
        assert head.status_code == 200 and head.content == b""
        assert head.headers["Content-Type"].startswith("application/json")
        head = http.head("/api/runs", headers=auth)
        assert (head.status_code, head.headers["Allow"], head.content) == (405, "POST", b"")
        assert head.headers["Content-Type"].startswith("application/json")
        check(http.options("/api/runs", headers=auth), 405, "method_not_allowed")

        def pieces(data: bytes, size: int = 64 * 1024):
            for start in range(0, len(data), size):
                yield data[start:start + size]

        sent = http.post("/api/runs", content=pieces(run.encode()), headers=as_json)
        assert sent.request.headers.get("Transfer-Encoding") == "chunked"
        assert sent.status_code == 201, sent.text
        ten_mb = b'{"agent": "payout", "input": {"x": "' + b"y" * 10_000_000 + b'"}}'
        big = http.post("/api/runs", content=pieces(ten_mb), headers=as_json)
        assert "larger than the limit" in check(big, 422, "invalid")["message"]
        check(http.post("/api/runs", content=ten_mb, headers=as_json), 422, "invalid")
        assert http.get("/healthz").status_code == 200
    assert server.proc.poll() is None
    assert Run.objects.count() == runs + 1
    assert Approval.objects.get(pk=w.approval.pk).status == "pending"


# -- the deep fuzz: schemathesis's own command, every phase, every check -------------------

FUZZ_SEED = 40  # fixed, with deterministic generation: the same cases every run


def _fuzz(url: str, token: str, out: Path) -> tuple[subprocess.CompletedProcess[str], dict,
                                                  list[dict]]:
    """``schemathesis run`` as its users run it: examples, coverage, fuzzing and the stateful
    phase (following the schema's links with real ids and digests), every check but "schema-
    valid data is accepted" (the runtime's rules reach past a JSON schema: an agent must be
    registered, resolve needs a result, a rejection a note). Strings are UTF-8 without NUL, as
    the payload rules document; the other NUL and surrogate inputs are pinned above."""
    command = [sys.executable, "-m", "schemathesis.cli", "run", f"{url}/api/openapi.json",
               "--phases", "examples,coverage,fuzzing,stateful", "--checks", "all",
               "--exclude-checks", "positive_data_acceptance", "--continue-on-failure",
               "--seed", str(FUZZ_SEED), "--generation-deterministic", "--max-examples", "60",
               "--generation-codec", "utf-8", "--generation-allow-x00", "false",
               "-H", f"Authorization: Bearer {token}", "--request-timeout", "20",
               "--no-color", "--report", "json,har", "--report-dir", str(out)]
    # Run in the test's own directory: schemathesis keeps a cache where it runs, and a cache
    # from an earlier run must not change which cases this one makes.
    env = {**os.environ, "SCHEMATHESIS_HOOKS": "tests.console.fuzz_hooks",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    work = out / "cwd"
    work.mkdir(parents=True)
    done = subprocess.run(command, cwd=work, env=env, capture_output=True, text=True,
                          timeout=600)
    (report,) = out.glob("json-*.json")
    (har,) = out.glob("har-*.json")
    return done, json.loads(report.read_text()), json.loads(har.read_text())["log"]["entries"]


def _operation(entry: dict) -> str:
    """"POST /api/approvals/{id}/decide" from a HAR entry's method and URL."""
    path = httpx.URL(entry["request"]["url"]).path
    return f"{entry['request']['method']} {re.sub(r'/[0-9]+(?=/|$)', '/{id}', path)}"


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("who", ["decider", "nobody"])
def test_the_deep_fuzz_finds_no_server_error_and_follows_the_links(
        server, interrupted, policy_paused, token_for, tmp_path, who):
    """Every check schemathesis has passes, no answer is a 5xx, every answer is JSON, and (as
    a person who may decide and start runs) the stateful phase reaches real approvals and
    runs through the links: reads them, decides them one at a time and in a batch, starts
    runs and reads their events."""
    for _ in range(8):
        interrupted()
    for _ in range(4):
        policy_paused()
    token = (token_for("fuzz", *DECIDER, "runtime.add_run") if who == "decider"
             else token_for("fuzz-none"))
    done, report, entries = _fuzz(server.ready(), token, tmp_path / "fuzz")
    summary = done.stdout[-3000:] + done.stderr[-2000:]
    assert done.returncode == 0 and report["exit_code"] == 0, summary
    assert report["failures"] == [] and report["errors"] == [], summary
    assert {p: report["phases"][p]["status"] for p in ("coverage", "fuzzing", "stateful")} == \
        {"coverage": "success", "fuzzing": "success", "stateful": "success"}, summary
    assert len(entries) > 500, len(entries)
    answers: dict[str, set[int]] = {}
    for entry in entries:
        status = entry["response"]["status"]
        assert status < 500, (entry["request"]["url"], entry["response"]["content"])
        if entry["request"]["method"] != "HEAD":
            assert entry["response"]["content"]["mimeType"].startswith("application/json"), \
                entry["request"]["url"]
        answers.setdefault(_operation(entry), set()).add(status)
    assert server.proc.poll() is None
    if who == "nobody":
        assert all(codes <= {401, 403, 404, 405, 415, 422} for codes in answers.values()), \
            answers
        return
    reached = {"GET /api/approvals/{id}": 200, "POST /api/approvals/{id}/decide": 200,
               "POST /api/approvals/decide": 200,
               "POST /api/runs": 201, "GET /api/runs/{id}": 200,
               "GET /api/runs/{id}/events": 200}
    missed = {op: sorted(answers.get(op, ())) for op, status in reached.items()
              if status not in answers.get(op, set())}
    assert not missed, missed
    links = re.search(r"API Links:\s+(\d+) covered / (\d+) selected", done.stdout)
    assert links and int(links[1]) >= 10, summary
