"""On PostgreSQL the application can run as a role that cannot undo the audit log's
protection (``manage.py auditrole``): it reads and writes the runtime's rows, starts and
finishes runs, but cannot drop or disable a trigger, nor update, delete or truncate the audit
tables. Real connections as that role against a throwaway database on the local server."""

from __future__ import annotations

import io
from collections.abc import Iterator
from urllib.parse import urlsplit

import psycopg
import pytest
from django.core.management import CommandError, call_command

from tests.engines import unique_name
from tests.runtime.test_postgres import manage

pytestmark = pytest.mark.engines("postgres")


@pytest.fixture
def app_role(database, pg_admin: psycopg.Connection) -> Iterator[str]:
    """A login role that owns nothing (roles are server-wide: dropped after the test)."""
    name = unique_name("app").lower()
    pg_admin.execute(f'CREATE ROLE "{name}" LOGIN')
    try:
        yield name
    finally:
        with psycopg.connect(database.url, autocommit=True) as conn:
            conn.execute(f'REASSIGN OWNED BY "{name}" TO CURRENT_USER')
            conn.execute(f'DROP OWNED BY "{name}"')
        pg_admin.execute(f'DROP ROLE "{name}"')


def as_role(url: str, role: str) -> str:
    parts = urlsplit(url)
    return parts._replace(netloc=f"{role}@{parts.hostname}:{parts.port or 5432}").geturl()


def test_the_printed_grants_are_the_applied_ones(database, app_role):
    out = io.StringIO()
    call_command("auditrole", app_role, stdout=out)
    printed = out.getvalue()
    assert f'GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO "{app_role}";' \
        in printed
    assert "REVOKE UPDATE, DELETE, TRUNCATE ON runtime_event, runtime_runcreation, " \
        "runtime_auditcheckpoint, runtime_scheduleevent, runtime_pruning, runtime_prunedrun, " \
        f'runtime_auditexport FROM "{app_role}";' in printed


def test_an_application_role_runs_everything_and_cannot_touch_the_audit_log(database, app_role,
                                                                           tmp_path):
    out = io.StringIO()
    call_command("auditrole", app_role, "--apply", stdout=out)
    assert "cannot alter the audit log" in out.getvalue()
    url = as_role(database.url, app_role)
    # The application's whole path as that role: a run started, worked to its end, verified.
    hello = manage(url, tmp_path, "runagent", "hello", "--input", '{"name": "Ada"}')
    assert hello.returncode == 0, hello.stderr
    done = manage(url, tmp_path, "verifyaudit")
    assert done.returncode == 0, done.stderr
    with psycopg.connect(url, autocommit=True) as conn:
        for sql in ("DROP TRIGGER runtime_event_no_update_delete ON runtime_event",
                    "ALTER TABLE runtime_event DISABLE TRIGGER runtime_event_no_update_delete",
                    "DROP FUNCTION runtime_event_append_only() CASCADE",
                    "UPDATE runtime_event SET actor = 'mallory'",
                    "DELETE FROM runtime_runcreation",
                    "TRUNCATE runtime_auditcheckpoint",
                    "UPDATE django_migrations SET name = 'x'",
                    "CREATE TABLE runtime_shadow (id int)",
                    "SET session_replication_role = replica"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(sql)
        assert conn.execute("SELECT count(*) FROM runtime_event").fetchone()[0] > 0


def test_a_role_that_could_drop_the_triggers_is_named(database, app_role, pg_admin):
    call_command("auditrole", app_role, "--apply", stdout=io.StringIO())
    with psycopg.connect(database.url, autocommit=True) as conn:
        conn.execute(f'ALTER TABLE runtime_step OWNER TO "{app_role}"')
    with pytest.raises(CommandError, match=r"owns .*runtime_step.*can drop the triggers"):
        call_command("auditrole", app_role, "--apply", stdout=io.StringIO())


def test_bad_role_names_and_missing_roles_are_refused(database):
    with pytest.raises(CommandError, match="not a plain role name"):
        call_command("auditrole", 'x"; DROP TABLE runtime_run; --', stdout=io.StringIO())
    with pytest.raises(CommandError, match="does not exist"):
        call_command("auditrole", "nobody_here_at_all", "--apply", stdout=io.StringIO())

