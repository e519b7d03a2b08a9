"""runtime.dbnet: the bounds on every wait a PostgreSQL connection makes on the network."""

from __future__ import annotations

import pytest

from runtime.dbnet import network_timeout, postgres_network_options, with_network_options

PG = {"ENGINE": "django.db.backends.postgresql", "NAME": "runtime", "OPTIONS": {}}


def test_every_wait_is_bounded_by_the_timeout():
    options = postgres_network_options({}, 12)
    assert options["connect_timeout"] == 12 and options["tcp_user_timeout"] == 12000
    assert options["keepalives"] == 1
    # a dead peer of an idle connection is found within the timeout
    found = options["keepalives_idle"] + options["keepalives_interval"] * options[
        "keepalives_count"]
    assert found <= 12
    assert "-c idle_in_transaction_session_timeout=12000" in options["options"]
    assert "-c tcp_keepalives_idle=4" in options["options"]


def test_what_the_url_sets_wins():
    given = {"connect_timeout": 3, "tcp_user_timeout": 0,
             "options": "-c idle_in_transaction_session_timeout=0 -c search_path=app"}
    options = postgres_network_options(given, 15)
    assert options["connect_timeout"] == 3 and options["tcp_user_timeout"] == 0
    assert options["options"].count("idle_in_transaction_session_timeout") == 1
    assert "idle_in_transaction_session_timeout=0" in options["options"]
    assert "search_path=app" in options["options"] and "tcp_keepalives_count=3" in options[
        "options"]
    assert given["options"] == "-c idle_in_transaction_session_timeout=0 -c search_path=app"


@pytest.mark.parametrize("seconds", [0, 1.5, 3601, -1])
def test_a_timeout_out_of_bounds_is_refused(seconds):
    with pytest.raises(ValueError, match="between 2 and 3600 seconds"):
        postgres_network_options({}, seconds)


def test_only_postgresql_is_touched():
    sqlite = {"ENGINE": "runtime.backends.sqlite3", "NAME": "x", "OPTIONS": {"timeout": 5}}
    assert with_network_options(sqlite) is sqlite
    config = with_network_options(PG, 20)
    assert config["OPTIONS"]["tcp_user_timeout"] == 20000 and PG["OPTIONS"] == {}


def test_the_timeout_comes_from_the_environment():
    assert network_timeout({}) == 15
    assert network_timeout({"RUNTIME_PG_NETWORK_TIMEOUT": "40"}) == 40
    with pytest.raises(ValueError, match="RUNTIME_PG_NETWORK_TIMEOUT must be a number"):
        network_timeout({"RUNTIME_PG_NETWORK_TIMEOUT": "soon"})


def test_the_projects_postgresql_settings_carry_the_bounds(monkeypatch):
    from tests.engines import postgres_config

    monkeypatch.setenv("RUNTIME_PG_NETWORK_TIMEOUT", "9")
    options = postgres_config("postgres://u@db.example:5432/runtime")["OPTIONS"]
    assert options["tcp_user_timeout"] == 9000 and options["connect_timeout"] == 9
