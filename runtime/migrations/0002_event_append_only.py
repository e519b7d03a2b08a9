"""Make the audit log append-only in the database itself: UPDATE and DELETE are refused."""

from django.db import migrations

SQLITE_UP = [
    """CREATE TRIGGER runtime_event_no_update BEFORE UPDATE ON runtime_event
       BEGIN SELECT RAISE(ABORT, 'runtime_event is append-only'); END""",
    """CREATE TRIGGER runtime_event_no_delete BEFORE DELETE ON runtime_event
       BEGIN SELECT RAISE(ABORT, 'runtime_event is append-only'); END""",
]
SQLITE_DOWN = [
    "DROP TRIGGER IF EXISTS runtime_event_no_update",
    "DROP TRIGGER IF EXISTS runtime_event_no_delete",
]
POSTGRES_UP = [
    """CREATE OR REPLACE FUNCTION runtime_event_append_only() RETURNS trigger AS $$
       BEGIN RAISE EXCEPTION 'runtime_event is append-only'; END $$ LANGUAGE plpgsql""",
    """CREATE TRIGGER runtime_event_no_update_delete BEFORE UPDATE OR DELETE ON runtime_event
       FOR EACH ROW EXECUTE FUNCTION runtime_event_append_only()""",
    """CREATE TRIGGER runtime_event_no_truncate BEFORE TRUNCATE ON runtime_event
       FOR EACH STATEMENT EXECUTE FUNCTION runtime_event_append_only()""",
]
POSTGRES_DOWN = [
    "DROP TRIGGER IF EXISTS runtime_event_no_update_delete ON runtime_event",
    "DROP TRIGGER IF EXISTS runtime_event_no_truncate ON runtime_event",
    "DROP FUNCTION IF EXISTS runtime_event_append_only()",
]


def _run(statements_by_vendor):
    def apply(apps, schema_editor):
        for sql in statements_by_vendor.get(schema_editor.connection.vendor, []):
            schema_editor.execute(sql)

    return apply


class Migration(migrations.Migration):
    dependencies = [("runtime", "0001_initial")]

    operations = [
        migrations.RunPython(
            _run({"sqlite": SQLITE_UP, "postgresql": POSTGRES_UP}),
            _run({"sqlite": SQLITE_DOWN, "postgresql": POSTGRES_DOWN}),
        ),
    ]
