"""Settings in one place (runtime.conf): every environment variable with a bad value stops
start-up with one line naming it and what it accepts, never a traceback; every default is
written once; the configuration reference in the docs is the one generated from it."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.core.management.base import SystemCheckError

from runtime import conf
from runtime.conf import DEFAULTS, LIST, TEXT, VARIABLES, ConfigError
from runtime.management.commands.configreference import reference

ROOT = Path(__file__).resolve().parents[2]

# A value each kind refuses. Variables of free text accept any value: they are listed here so
# that a new variable must be either checked or named as free text on purpose.
FREE_TEXT = {v.name for v in VARIABLES if v.kind in (TEXT, LIST)}
BAD = {v.name: ("-1" if v.name == "RUNTIME_WORKER_CPU" else "?" * 3 if v.name in (
    "DJANGO_PROXY_SSL_HEADER",) else "mysql://db/x" if v.name == "DATABASE_URL" else "soon")
    for v in VARIABLES if v.name not in FREE_TEXT}


def test_every_variable_is_checked_or_free_text_on_purpose():
    assert set(BAD) | FREE_TEXT == {v.name for v in VARIABLES}
    assert {
        "RUNTIME_APPROVAL_URL", "RUNTIME_NOTIFY_WEBHOOK", "RUNTIME_NOTIFY_SLACK",
        "RUNTIME_NOTIFY_EMAIL", "RUNTIME_AUDIT_KEY", "RUNTIME_VAR_DIR", "RUNTIME_LLM_BASE_URL",
        "RUNTIME_LLM_MODEL", "RUNTIME_LLM_API_KEY", "DJANGO_SECRET_KEY", "CONSOLE_CHECK_URL",
        "EMAIL_HOST", "EMAIL_HOST_USER", "EMAIL_HOST_PASSWORD", "DEFAULT_FROM_EMAIL",
        "RUNTIME_DEMO_DIR", "CONSOLE_PASSWORD", "RUNTIME_AGENTS", "DJANGO_ALLOWED_HOSTS",
        "DJANGO_CSRF_TRUSTED_ORIGINS",
        "RUNTIME_CHECKPOINT_DIR", "RUNTIME_SLACK_API_URL",
        } == FREE_TEXT


@pytest.mark.parametrize("name", sorted(BAD))
def test_a_bad_value_stops_start_up_with_a_line_naming_the_variable(name, tmp_path):
    variable = conf.BY_NAME[name]
    env = {**os.environ, "RUNTIME_VAR_DIR": str(tmp_path / "var"), name: BAD[name]}
    env.pop("DATABASE_URL", None) if name != "DATABASE_URL" else None
    done = subprocess.run([sys.executable, "manage.py", "check"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == [done.stderr.strip()]  # one line
    assert done.stderr.startswith(f"configuration error: {name} must be ")
    assert variable.kind.accepted in done.stderr
    if variable.secret:
        assert BAD[name] not in done.stderr
    else:
        assert repr(BAD[name]) in done.stderr
    assert not (tmp_path / "var").exists()  # stopped before anything was made


@pytest.mark.parametrize("name", sorted(BAD))
def test_a_bad_value_is_a_config_error_naming_it(name):
    with pytest.raises(ConfigError) as info:
        conf.read({name: BAD[name]})
    assert info.value.name == name and isinstance(info.value, ImproperlyConfigured | ValueError)


def test_unset_or_empty_variables_take_their_defaults():
    values = conf.read({})
    assert values == conf.read({v.name: "" for v in VARIABLES if v.kind is not TEXT})
    assert values == conf.read({v.name: "  " for v in VARIABLES if v.kind is not TEXT})
    assert all(values[v.name] == v.default for v in VARIABLES)


def test_flags_read_the_usual_spellings():
    for text, expected in (("1", True), ("yes", True), ("ON", True), ("0", False),
                           ("false", False), ("off", False)):
        assert conf.value("RUNTIME_FOUR_EYES", {"RUNTIME_FOUR_EYES": text}) is expected


def test_the_runtime_settings_defaults_are_those_of_their_variables():
    for variable in VARIABLES:
        if variable.key:
            assert DEFAULTS[variable.key] == variable.default


def test_no_module_but_conf_reads_the_runtime_settings_or_their_environment():
    """Defaults once: the runtime reads ``RUNTIME`` through ``conf.setting`` and the
    environment through ``conf`` (the test kit's own variables and the bench aside)."""
    offenders = []
    for path in (ROOT / "runtime").rglob("*.py"):
        if path.name == "conf.py" or {"testkit", "benchkit", "migrations"} & set(path.parts):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Attribute) and node.attr == "RUNTIME"
                    and isinstance(node.value, ast.Name) and node.value.id == "settings"):
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} settings.RUNTIME")
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in ("get", "getenv")
                    and "environ" in ast.unparse(node.func.value)):
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} environ.get")
    allowed = {"runtime/crashpoints.py"}  # the crash kit's arming, not a setting
    assert [o for o in offenders if o.split(":")[0] not in allowed] == []


def test_the_configuration_reference_is_the_generated_one():
    written = (ROOT / "docs" / "reference" / "configuration.md").read_text()
    assert written == reference(), (
        "docs/reference/configuration.md is stale: run "
        "`manage.py configreference --out docs/reference/configuration.md`")
    for variable in VARIABLES:
        assert f"`{variable.name}`" in written


def test_the_check_reports_unknown_runtime_keys_and_bad_values(settings):
    settings.RUNTIME = {**settings.RUNTIME, "LEASE_SECONDS": "soon", "LEASE_SECOND": 3}
    with pytest.raises(SystemCheckError) as info:
        call_command("check")
    text = str(info.value)
    assert "runtime.E002" in text
    assert "RUNTIME['LEASE_SECONDS'] must be a number of seconds" in text
    assert "RUNTIME['LEASE_SECOND'] is not a runtime setting" in text
