"""The JSON API (/api/, console/api.py): tokens, permissions, the stable error codes, races,
idempotency, keyset pagination; against a live server, schemathesis and the example client."""

from __future__ import annotations

import subprocess
import sys
import threading
from datetime import timedelta

import httpx
import pytest
from django.core.management import call_command
from django.db import connection
from django.test import Client
from django.utils import timezone

from console.models import ApiToken, IdempotentRequest
from runtime.models import Approval, Event, Run
from tests.procs import ROOT

DECIDER = ("runtime.view_run", "runtime.decide_approval")


@pytest.fixture
def token_for(make_user):
    def make(username: str, *perms: str) -> str:
        from django.contrib.auth.models import User

        user = User.objects.filter(username=username).first() or make_user(username, *perms)
        return ApiToken.issue(user, "test")[1]

    return make


def call(method: str, path: str, token: str | None = None, client: Client | None = None,
         json: object = None, **headers: str):
    client = client or Client()
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    kwargs = {"headers": headers}
    if json is not None:
        kwargs.update(data=json, content_type="application/json")
    return getattr(client, method)(path, **kwargs)


def decide_body(approval: Approval, decision: str = "approve", **extra) -> dict:
    return {"decision": decision, "expected_digest": approval.digest, **extra}


def granted(run_id: int) -> int:
    return Event.objects.filter(run_id=run_id, kind="approval.granted").count()


# -- authentication --------------------------------------------------------------------------

def test_every_endpoint_needs_a_token(interrupted, make_user):
    w = interrupted()
    session = Client()
    session.force_login(make_user("sal", *DECIDER, "runtime.add_run"))
    for method, path, body in [
        ("get", "/api/approvals/", None), ("get", f"/api/approvals/{w.approval.pk}", None),
        ("post", f"/api/approvals/{w.approval.pk}/decide", decide_body(w.approval)),
        ("post", "/api/runs", {"agent": "pay", "input": {}}),
        ("get", f"/api/runs/{w.run.pk}", None), ("get", f"/api/runs/{w.run.pk}/events", None),
    ]:
        for client in (Client(), session):  # a session cookie alone authenticates nothing
            response = call(method, path, client=client, json=body)
            assert response.status_code == 401, (path, response.content)
            assert response.json()["code"] == "unauthorized"
            assert response["WWW-Authenticate"].startswith("Bearer")
    assert Approval.objects.get(pk=w.approval.pk).status == "pending"
    assert Run.objects.count() == 1


def test_token_only_from_the_authorization_header(interrupted, token_for):
    interrupted()
    token = token_for("tom", *DECIDER)
    assert call("get", "/api/approvals/", token).status_code == 200
    cookie = Client()
    cookie.cookies["token"] = token
    cookie.cookies["Authorization"] = f"Bearer {token}"
    assert call("get", "/api/approvals/", client=cookie).status_code == 401
    assert Client().get(f"/api/approvals/?token={token}&access_token={token}").status_code == 401
    assert call("get", "/api/approvals/", "art_not-a-token").status_code == 401
    assert Client().get("/api/approvals/", headers={"Authorization": token}).status_code == 401


def test_revoked_token_and_last_used(interrupted, token_for):
    interrupted()
    token = token_for("ria", *DECIDER)
    row = ApiToken.objects.get(user__username="ria")
    assert row.last_used_at is None and len(row.token_hash) == 64 and token not in row.token_hash
    assert call("get", "/api/approvals/", token).status_code == 200
    row.refresh_from_db()
    assert row.last_used_at is not None
    row.revoke()
    response = call("get", "/api/approvals/", token)
    assert response.status_code == 401 and response.json()["code"] == "unauthorized"


def test_inactive_user_is_refused(interrupted, token_for):
    interrupted()
    token = token_for("ina", *DECIDER)
    ApiToken.objects.get(user__username="ina").user.__class__.objects.filter(
        username="ina").update(is_active=False)
    assert call("get", "/api/approvals/", token).status_code == 401


# -- permissions -----------------------------------------------------------------------------

def test_permissions_as_the_console(interrupted, token_for):
    w = interrupted()
    nobody = token_for("nob")
    viewer = token_for("vic", "runtime.view_run")
    decider = token_for("dee", *DECIDER)
    reads = ["/api/approvals/", f"/api/approvals/{w.approval.pk}", f"/api/runs/{w.run.pk}",
             f"/api/runs/{w.run.pk}/events"]
    for path in reads:
        response = call("get", path, nobody)
        assert response.status_code == 403 and response.json()["code"] == "forbidden", path
        assert call("get", path, viewer).status_code == 200, path
    decide = f"/api/approvals/{w.approval.pk}/decide"
    for token in (nobody, viewer):
        response = call("post", decide, token, json=decide_body(w.approval))
        assert response.status_code == 403 and response.json()["code"] == "forbidden"
        response = call("post", "/api/runs", token, json={"agent": "pay", "input": {}})
        assert response.status_code == 403 and "runtime.add_run" in response.json()["message"]
    assert Approval.objects.get(pk=w.approval.pk).status == "pending"
    assert call("post", "/api/runs", decider, json={"agent": "pay"}).status_code == 403
    response = call("post", decide, decider, json=decide_body(w.approval, note="checked"))
    assert response.status_code == 200, response.content
    body = response.json()
    assert (body["status"], body["decided_by"], body["note"]) == ("approved", "dee", "checked")
    assert granted(w.run.pk) == 1


def test_read_an_approval_and_a_run(interrupted, token_for):
    w = interrupted()
    token = token_for("vic", "runtime.view_run")
    a = call("get", f"/api/approvals/{w.approval.pk}", token).json()
    assert a["tool"] == "send" and a["arguments"] == w.approval.arguments
    assert a["digest"] == w.approval.digest and a["kind"] == "interrupted_side_effect"
    assert a["status"] == "pending" and a["decided_by"] is None
    assert a["decisions"] == ["approve", "resolve", "reject"]
    assert a["steps"][0]["index"] == 1 and a["steps_total"] == 1
    run = call("get", f"/api/runs/{w.run.pk}", token).json()
    assert run["status"] == "waiting" and run["agent"] == "pay" and run["steps_total"] == 1
    for path in ("/api/approvals/999999", "/api/runs/999999", "/api/runs/999999/events"):
        response = call("get", path, token)
        assert response.status_code == 404 and response.json()["code"] == "not_found"


def test_start_a_run(interrupted, token_for):
    interrupted()
    token = token_for("sta", "runtime.view_run", "runtime.add_run")
    response = call("post", "/api/runs", token, json={"agent": "pay", "input": {"order": "B"}})
    assert response.status_code == 201, response.content
    run = Run.objects.get(pk=response.json()["id"])
    assert (run.status, run.created_by, run.input) == ("queued", "sta", {"order": "B"})
    response = call("post", "/api/runs", token, json={"agent": "nope", "input": {}})
    assert response.status_code == 422 and response.json()["code"] == "invalid"
    assert response.json()["errors"][0]["loc"][-1] == "agent"


# -- errors ----------------------------------------------------------------------------------

def test_validation_errors_are_invalid(interrupted, token_for):
    w = interrupted()
    token = token_for("val", *DECIDER)
    decide = f"/api/approvals/{w.approval.pk}/decide"
    for body in ({"decision": "maybe", "expected_digest": w.approval.digest}, {},
                 {"decision": "approve"}):
        response = call("post", decide, token, json=body)
        assert response.status_code == 422, body
        data = response.json()
        assert data["code"] == "invalid" and data["errors"], data
    response = Client().post(decide, data="{not json", content_type="application/json",
                             headers={"Authorization": f"Bearer {token}"})
    assert response.status_code == 422 and response.json()["code"] == "invalid"
    deep = {"decision": "resolve", "expected_digest": w.approval.digest, "result": []}
    for _ in range(100):
        deep["result"] = [deep["result"]]
    response = call("post", decide, token, json=deep)
    assert response.status_code == 422 and "deeper" in response.json()["message"]
    response = call("post", decide, token, json=decide_body(w.approval, "reject"))
    assert response.status_code == 422 and "note" in response.json()["message"]
    response = call("post", decide, token, json=decide_body(w.approval, "resolve"))
    assert response.status_code == 422 and response.json()["code"] == "invalid"
    for query in ("?limit=0", "?limit=abc", "?cursor=%%%", "?cursor=WzFd"):
        response = call("get", f"/api/approvals/{query}", token)
        assert response.status_code == 422 and response.json()["code"] == "invalid", query
    assert Approval.objects.get(pk=w.approval.pk).status == "pending"


def test_body_size_limit(interrupted, token_for, settings):
    w = interrupted()
    settings.RUNTIME = {**settings.RUNTIME, "MAX_PAYLOAD_BYTES": 1000}
    token = token_for("big", *DECIDER)
    response = call("post", f"/api/approvals/{w.approval.pk}/decide", token,
                    json=decide_body(w.approval, "resolve", result={"x": "y" * 2000}))
    assert response.status_code == 422 and "larger than the limit" in response.json()["message"]
    assert Approval.objects.get(pk=w.approval.pk).status == "pending"


def test_stale_digest_changes_nothing(interrupted, token_for):
    w = interrupted()
    token = token_for("sty", *DECIDER)
    response = call("post", f"/api/approvals/{w.approval.pk}/decide", token,
                    json={"decision": "approve", "expected_digest": "0" * 64})
    assert response.status_code == 409
    assert response.json()["code"] == "stale"
    assert Approval.objects.get(pk=w.approval.pk).status == "pending"
    assert granted(w.run.pk) == 0


def test_already_decided_says_who_and_when(interrupted, token_for):
    w = interrupted()
    first, second = token_for("fay", *DECIDER), token_for("gus", *DECIDER)
    path = f"/api/approvals/{w.approval.pk}/decide"
    assert call("post", path, first, json=decide_body(w.approval)).status_code == 200
    response = call("post", path, second, json=decide_body(w.approval, "reject", note="no"))
    assert response.status_code == 409
    body = response.json()
    assert (body["code"], body["status"], body["decided_by"]) == (
        "already_decided", "approved", "fay")
    assert body["decided_at"]
    assert granted(w.run.pk) == 1


def test_already_decided_words_the_status_as_the_console_does(interrupted, token_for):
    """The 409's message says what the console says ("approved to run once more, …"), not
    the stored status ("approved", "consumed"); the machine-readable ``status`` stays."""
    from console.wording import status_word

    w = interrupted()
    first, second = token_for("fay", *DECIDER), token_for("gus", *DECIDER)
    path = f"/api/approvals/{w.approval.pk}/decide"
    assert call("post", path, first, json=decide_body(w.approval)).status_code == 200
    Approval.objects.filter(pk=w.approval.pk).update(status="consumed",
                                                     consumed_at=timezone.now())
    body = call("post", path, second, json=decide_body(w.approval, "reject", note="no")).json()
    fresh = Approval.objects.get(pk=w.approval.pk)
    assert body["status"] == "consumed"
    assert f"({status_word(fresh)})" in body["message"], body["message"]
    assert "consumed" not in body["message"] and "already decided by fay at " in body["message"]


def test_every_error_under_api_is_json_with_a_code(interrupted, token_for):
    """Unknown paths, a trailing slash too many or too few, a method a path does not serve:
    JSON with a code, never the console's HTML 404 nor a redirect (APPEND_SLASH)."""
    w = interrupted()
    token = token_for("ian", *DECIDER)
    for method, path, status, code, meant in [
        ("get", "/api/approvals", 404, "not_found", "/api/approvals/"),
        ("get", f"/api/approvals/{w.approval.pk}/", 404, "not_found",
         f"/api/approvals/{w.approval.pk}"),
        ("post", "/api/runs/", 404, "not_found", "/api/runs"),
        ("get", "/api/nothing/here", 404, "not_found", None),
        ("get", "/api/nothing/here", 404, "not_found", None),
        ("post", "/api/approvals/", 405, "method_not_allowed", None),
        ("delete", f"/api/approvals/{w.approval.pk}", 405, "method_not_allowed", None),
    ]:
        for who in (token, None):  # with and without a token: the same answer
            response = call(method, path, who, json={} if method == "post" else None)
            assert response.status_code == status, (method, path, response.content[:200])
            assert response["Content-Type"].startswith("application/json"), path
            body = response.json()
            assert body["code"] == code and body["message"], body
            assert body.get("url") == meant, body
            if status == 405:
                assert response["Allow"] in body["message"]


def test_expired_is_already_decided(interrupted, token_for):
    w = interrupted()
    Approval.objects.filter(pk=w.approval.pk).update(
        expires_at=timezone.now() - timedelta(minutes=1))
    token = token_for("exa", *DECIDER)
    response = call("post", f"/api/approvals/{w.approval.pk}/decide", token,
                    json=decide_body(w.approval))
    assert response.status_code == 409
    assert (response.json()["code"], response.json()["status"]) == ("already_decided", "expired")


def test_four_eyes_is_forbidden(interrupted, token_for, settings):
    settings.RUNTIME = {**settings.RUNTIME, "FOUR_EYES": True}
    w = interrupted(created_by="sam")
    token = token_for("sam", *DECIDER)
    response = call("post", f"/api/approvals/{w.approval.pk}/decide", token,
                    json=decide_body(w.approval))
    assert response.status_code == 403 and response.json()["code"] == "forbidden"
    assert "four-eyes" in response.json()["message"]
    assert Approval.objects.get(pk=w.approval.pk).status == "pending"
    assert call("get", f"/api/approvals/{w.approval.pk}", token).json()["decisions"] == [
        "reject"]


def test_two_clients_race_one_wins(interrupted, token_for):
    w = interrupted()
    tokens = [token_for(f"racer{i}", *DECIDER) for i in range(2)]
    barrier = threading.Barrier(2)
    answers: dict[int, object] = {}

    def go(i: int) -> None:
        try:
            barrier.wait(timeout=10)
            answers[i] = call("post", f"/api/approvals/{w.approval.pk}/decide", tokens[i],
                              json=decide_body(w.approval, note=f"racer{i}"))
        except BaseException as exc:
            answers[i] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=go, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    statuses = sorted(a.status_code for a in answers.values())
    assert statuses == [200, 409], answers
    winner = next(a.json() for a in answers.values() if a.status_code == 200)
    loser = next(a.json() for a in answers.values() if a.status_code == 409)
    assert loser["code"] == "already_decided"
    assert loser["decided_by"] == winner["decided_by"] and loser["decided_at"]
    assert granted(w.run.pk) == 1


# -- idempotency -----------------------------------------------------------------------------

def test_idempotent_replay_decides_once(interrupted, token_for):
    w = interrupted()
    token = token_for("ida", *DECIDER)
    path = f"/api/approvals/{w.approval.pk}/decide"
    body = decide_body(w.approval, note="once")
    first = call("post", path, token, json=body, **{"Idempotency-Key": "k-1"})
    again = call("post", path, token, json=body, **{"Idempotency-Key": "k-1"})
    assert first.status_code == again.status_code == 200
    assert first.json() == again.json()
    assert again["Idempotent-Replayed"] == "true"
    assert granted(w.run.pk) == 1
    # Without the key a repeat is a second decision: refused as already decided.
    assert call("post", path, token, json=body).status_code == 409
    # The same key for another body or path is refused.
    other = call("post", path, token, json=decide_body(w.approval, note="twice"),
                 **{"Idempotency-Key": "k-1"})
    assert other.status_code == 422 and other.json()["code"] == "invalid"
    other = call("post", "/api/runs", token_for("ida"), json={"agent": "pay"},
                 **{"Idempotency-Key": "k-1"})
    assert other.status_code in (403, 422)
    assert IdempotentRequest.objects.filter(key="k-1").count() == 1


def test_a_key_left_in_flight_by_a_dead_process_is_freed_after_a_minute(interrupted,
                                                                         token_for):
    from datetime import timedelta

    from django.contrib.auth.models import User
    from django.utils import timezone

    w = interrupted()
    token = token_for("ivo", *DECIDER)
    path = f"/api/approvals/{w.approval.pk}/decide"
    body = decide_body(w.approval)
    from runtime.canonical import digest

    stuck = IdempotentRequest.objects.create(  # as a process that died mid-answer leaves it
        user=User.objects.get(username="ivo"), key="k-dead", method_path=f"POST {path}",
        request_digest=digest({"approval": w.approval.pk, **body}))
    busy = call("post", path, token, json=body, **{"Idempotency-Key": "k-dead"})
    assert busy.status_code == 409 and busy.json()["code"] == "retry"
    IdempotentRequest.objects.filter(pk=stuck.pk).update(
        created_at=timezone.now() - timedelta(seconds=61))
    freed = call("post", path, token, json=body, **{"Idempotency-Key": "k-dead"})
    assert freed.status_code == 200 and granted(w.run.pk) == 1


def test_idempotency_keys_are_per_user(interrupted, token_for):
    w = interrupted()
    a, b = token_for("kay", *DECIDER), token_for("lou", *DECIDER)
    path = f"/api/approvals/{w.approval.pk}/decide"
    body = decide_body(w.approval)
    assert call("post", path, a, json=body, **{"Idempotency-Key": "same"}).status_code == 200
    response = call("post", path, b, json=body, **{"Idempotency-Key": "same"})
    assert response.status_code == 409 and response.json()["decided_by"] == "kay"


def test_idempotent_start_run_starts_once(interrupted, token_for):
    interrupted()
    token = token_for("ist", "runtime.view_run", "runtime.add_run")
    before = Run.objects.count()
    answers = [call("post", "/api/runs", token, json={"agent": "pay", "input": {"n": 1}},
                    **{"Idempotency-Key": "start-1"}) for _ in range(3)]
    assert {a.status_code for a in answers} == {201}
    assert len({a.json()["id"] for a in answers}) == 1
    assert Run.objects.count() == before + 1


# -- pagination ------------------------------------------------------------------------------

def test_keyset_pagination_over_approvals(interrupted, token_for):
    made = [interrupted().approval.pk for _ in range(7)]
    token = token_for("pag", "runtime.view_run")
    seen, cursor, pages = [], None, 0
    while True:
        query = "?limit=3" + (f"&cursor={cursor}" if cursor else "")
        page = call("get", f"/api/approvals/{query}", token).json()
        seen += [item["id"] for item in page["items"]]
        pages += 1
        cursor = page["next_cursor"]
        if not cursor:
            break
    assert seen == made and pages == 3


def test_keyset_pagination_over_events(interrupted, token_for):
    w = interrupted()
    total = Run.objects.get(pk=w.run.pk).event_seq
    assert total > 4
    token = token_for("pev", "runtime.view_run")
    seqs, cursor = [], None
    while True:
        query = "?limit=2" + (f"&cursor={cursor}" if cursor else "")
        page = call("get", f"/api/runs/{w.run.pk}/events{query}", token).json()
        seqs += [e["seq"] for e in page["items"]]
        cursor = page["next_cursor"]
        if not cursor:
            break
    assert seqs == list(range(1, total + 1))


# -- tokens: the command and the admin -------------------------------------------------------

def test_apitoken_command(make_user, capsys):
    make_user("cmd", "runtime.view_run")
    call_command("apitoken", "create", "cmd", "--name", "ci")
    token = capsys.readouterr().out.strip()
    row = ApiToken.objects.get(user__username="cmd")
    assert token.startswith("art_") and row.name == "ci"
    assert call("get", "/api/approvals/", token).status_code == 200
    call_command("apitoken", "list")
    assert "\tcmd\tci\t" in capsys.readouterr().out
    call_command("apitoken", "revoke", str(row.pk))
    assert call("get", "/api/approvals/", token).status_code == 401


def test_admin_creates_a_token_shown_once(make_user):
    admin = Client()
    admin.force_login(make_user("root", superuser=True))
    user = make_user("bot", "runtime.view_run")
    response = admin.post("/admin/console/apitoken/add/", {"user": user.pk, "name": "bot"},
                          follow=True)
    assert response.status_code == 200
    text = response.content.decode()
    row = ApiToken.objects.get(user=user)
    token = text.split("shown only now: ")[1].split("<")[0].strip()
    assert call("get", "/api/approvals/", token).status_code == 200
    page = admin.get(f"/admin/console/apitoken/{row.pk}/change/").content.decode()
    assert token not in page and row.token_hash not in page


def test_openapi_schema_is_served(sqlite_path):
    schema = Client().get("/api/openapi.json").json()
    assert "/api/approvals/{approval_id}/decide" in schema["paths"]
    assert schema["components"]["securitySchemes"]


# -- a live server: schemathesis and the example client --------------------------------------

@pytest.mark.slow
def test_schemathesis_against_a_live_server(server, interrupted, policy_paused, token_for):
    """Every operation fuzzed with fixed seeds (the same cases each run), with valid and with
    invalid inputs as a person who may decide and start runs, and as one with no permission
    at all: no 5xx, every answer as the schema says."""
    import schemathesis
    from hypothesis import HealthCheck, given
    from hypothesis import settings as hsettings
    from schemathesis.checks import not_a_server_error
    from schemathesis.generation import GenerationMode
    from schemathesis.specs.openapi.checks import response_schema_conformance

    for _ in range(3):
        interrupted()
    policy_paused()
    tokens = {"decider": token_for("fuzz", *DECIDER, "runtime.add_run"),
              "nobody": token_for("fuzz-none")}
    url = server.ready()
    schema = schemathesis.openapi.from_url(f"{url}/api/openapi.json")
    checks = [not_a_server_error, response_schema_conformance]
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) == 7

    seen: dict[tuple[str, str], set[int]] = {}

    def fuzzer(operation, who: str, token: str, examples: int,
               mode: GenerationMode = GenerationMode.POSITIVE):
        @given(case=operation.as_strategy(mode))
        @hsettings(max_examples=examples, deadline=None, database=None, derandomize=True,
                   suppress_health_check=list(HealthCheck))
        def fuzz(case) -> None:
            response = case.call_and_validate(
                base_url=url, headers={"Authorization": f"Bearer {token}"}, checks=checks,
                timeout=10)
            assert response.status_code < 500, (case.operation.label, response.text)
            seen.setdefault((who, case.operation.label), set()).add(response.status_code)

        return fuzz

    for operation in operations:
        fuzzer(operation, "decider", tokens["decider"], 40)()
        fuzzer(operation, "decider", tokens["decider"], 20, GenerationMode.NEGATIVE)()
        fuzzer(operation, "nobody", tokens["nobody"], 10)()
    assert server.proc.poll() is None
    assert len(seen) == 14, seen
    statuses = {status for codes in seen.values() for status in codes}
    assert max(statuses) < 500 and {200, 403, 422} <= statuses, seen
    assert all(codes <= {401, 403, 404, 405, 415, 422}
               for (who, _), codes in seen.items() if who == "nobody"), seen


@pytest.mark.slow
def test_example_client_lists_and_approves(server, interrupted, token_for):
    w = interrupted()
    token = token_for("cli", *DECIDER)
    url = server.ready()
    base = [sys.executable, "tests/example_client.py", "--url", url, "--token", token]
    listed = subprocess.run([*base, "list"], cwd=ROOT, capture_output=True, text=True,
                            timeout=60)
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.startswith(f"{w.approval.pk}\trun {w.run.pk}\tpay")
    decided = subprocess.run([*base, "approve", str(w.approval.pk)], cwd=ROOT,
                             capture_output=True, text=True, timeout=60)
    assert decided.returncode == 0, decided.stderr
    assert decided.stdout.strip() == f"approval {w.approval.pk}: approved by cli"
    assert Approval.objects.get(pk=w.approval.pk).decided_by == "cli"
    assert granted(w.run.pk) == 1
    again = subprocess.run([*base, "approve", str(w.approval.pk)], cwd=ROOT,
                           capture_output=True, text=True, timeout=60)
    assert again.returncode == 2 and "already_decided" in again.stderr
    response = httpx.get(f"{url}/api/approvals/", cookies={"sessionid": "x"})
    assert response.status_code == 401
