"""``/metrics`` is never public: 404 until ``RUNTIME_METRICS_TOKEN`` is set, then only for a
request that carries that token as a bearer token (what it serves is tested in
tests/runtime/test_metrics.py)."""

from __future__ import annotations

import pytest
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

from runtime import conf
from runtime.conf import ConfigError

TOKEN = "s3cret-metrics-token-0123456789"


@pytest.fixture
def token(settings) -> str:
    settings.RUNTIME = {**settings.RUNTIME, "METRICS_TOKEN": TOKEN}
    return TOKEN


def test_without_a_configured_token_there_is_no_metrics_page(sqlite_path, settings):
    settings.RUNTIME = {**settings.RUNTIME, "METRICS_TOKEN": ""}
    assert Client().get("/metrics").status_code == 404
    assert Client().get("/metrics", headers={"Authorization": "Bearer "}).status_code == 404
    assert Client().get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"}
                        ).status_code == 404


@pytest.mark.parametrize("authorization", [
    None, "", "Bearer", "Bearer ", "Bearer wrong-token-of-enough-length",
    f"Bearer {TOKEN}x", f"Bearer {TOKEN[:-1]}", f"Basic {TOKEN}", TOKEN,
], ids=["none", "empty", "scheme-only", "blank", "wrong", "longer", "shorter", "basic", "bare"])
def test_a_request_without_the_token_is_refused_and_told_nothing(sqlite_path, token,
                                                                    authorization):
    headers = {} if authorization is None else {"Authorization": authorization}
    response = Client().get(f"/metrics?token={TOKEN}", headers=headers)
    assert response.status_code == 401
    assert response["WWW-Authenticate"] == 'Bearer realm="metrics"'
    assert response.content == b"Unauthorized.\n"
    assert "no-cache" in response["Cache-Control"] or "no-store" in response["Cache-Control"]


def test_the_token_opens_it_to_a_scraper_with_no_session(sqlite_path, token):
    for scheme in ("Bearer", "bearer"):
        response = Client().get("/metrics", headers={"Authorization": f"{scheme} {TOKEN}"})
        assert response.status_code == 200
        assert response["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
        names = {f.name for f in text_string_to_metric_families(response.content.decode())}
        assert {"agent_runtime_approvals_pending", "agent_runtime_workers_live",
                "agent_runtime_runs"} <= names
    head = Client().head("/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    assert head.status_code == 200
    post = Client().post("/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    assert post.status_code == 405


def test_a_logged_in_person_without_the_token_is_refused_too(make_user, token):
    client = Client()
    client.force_login(make_user("root", superuser=True))
    assert client.get("/metrics").status_code == 401


@pytest.mark.parametrize("weak", ["short", "sixteen chars xx", "has\ta tab in it long"])
def test_a_weak_token_stops_start_up(weak):
    with pytest.raises(ConfigError) as info:
        conf.read({"RUNTIME_METRICS_TOKEN": weak})
    assert "RUNTIME_METRICS_TOKEN" in str(info.value) and weak not in str(info.value)


def test_healthz_stays_public_and_unchanged(sqlite_path, token):
    assert Client().get("/healthz").json() == {"database": "ok"}
