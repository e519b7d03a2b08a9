"""runtime.storage.postgres.network: the bounds on every wait a PostgreSQL connection makes on the
network."""

from __future__ import annotations

import pytest

from runtime.storage.postgres.network import (
    DEFAULT_POOL_SIZE,
    network_timeout,
    pool_size,
    postgres_network_options,
    with_network_options,
    with_pool,
)

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
    sqlite = {"ENGINE": "runtime.storage.sqlite", "NAME": "x", "OPTIONS": {"timeout": 5}}
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


def test_a_postgresql_entry_gets_a_pool_of_the_size_asked():
    config = with_pool(PG, 32, 7)
    assert config["OPTIONS"]["pool"] == {"min_size": 1, "max_size": 32, "timeout": 7}
    assert PG["OPTIONS"] == {}  # a new entry; the one given is unchanged
    sqlite = {"ENGINE": "runtime.storage.sqlite", "NAME": "x", "OPTIONS": {}}
    assert with_pool(sqlite, 32, 7) is sqlite


@pytest.mark.parametrize("config", [
    {**PG, "OPTIONS": {"pool": {"max_size": 4}}},  # the URL's or the settings' own pool wins
    {**PG, "CONN_MAX_AGE": 60},  # persistent connections, which Django will not pool
], ids=["own-pool", "persistent"])
def test_a_pool_is_not_added_where_the_settings_choose_otherwise(config):
    assert with_pool(config, 20, 15) is config


def test_the_pool_size_comes_from_the_environment_and_zero_turns_it_off():
    assert pool_size({}) == DEFAULT_POOL_SIZE
    assert pool_size({"RUNTIME_PG_POOL_SIZE": "64"}) == 64
    assert pool_size({"RUNTIME_PG_POOL_SIZE": "0"}) == 0
    assert with_pool(PG, 0, 15) is PG


@pytest.mark.parametrize("raw", ["-1", "1001", "many", "2.5"])
def test_a_pool_size_out_of_bounds_is_refused(raw):
    with pytest.raises(ValueError, match="RUNTIME_PG_POOL_SIZE must be a whole number from 0"):
        pool_size({"RUNTIME_PG_POOL_SIZE": raw})


def test_the_pool_size_and_its_wait_come_from_the_environment(monkeypatch):
    monkeypatch.setenv("RUNTIME_PG_POOL_SIZE", "12")
    monkeypatch.setenv("RUNTIME_PG_NETWORK_TIMEOUT", "9")
    assert with_pool(PG)["OPTIONS"]["pool"] == {"min_size": 1, "max_size": 12, "timeout": 9}
