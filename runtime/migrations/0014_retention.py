"""Retention: the record of prunings (each batch of finished runs archived and removed, chained
by hash) and of the runs they removed, both append-only; the append-only triggers on events now
let exactly one DELETE through, of an event whose run is entered in runtime_prunedrun (which
`manage.py prune` writes in the same transaction). UPDATE stays refused everywhere, and so does
every other DELETE. The statements are written out here as they were at this migration, so a
later change of runtime.storage.triggers cannot change what this migration did."""

from django.db import migrations, models

NEW_TABLES = ("runtime_pruning", "runtime_prunedrun")

SQLITE_EVENT_DELETE = """CREATE TRIGGER runtime_event_no_delete BEFORE DELETE ON runtime_event
    WHEN NOT EXISTS (SELECT 1 FROM runtime_prunedrun WHERE run_id = OLD.run_id)
    BEGIN SELECT RAISE(ABORT, 'runtime_event is append-only'); END"""
SQLITE_EVENT_DELETE_BEFORE = """CREATE TRIGGER runtime_event_no_delete BEFORE DELETE ON runtime_event
    BEGIN SELECT RAISE(ABORT, 'runtime_event is append-only'); END"""

# Its % is not a placeholder: executed with params=None.
POSTGRES_FUNCTION = """CREATE OR REPLACE FUNCTION runtime_event_append_only() RETURNS trigger AS $$
    BEGIN
        IF TG_OP = 'DELETE' AND TG_TABLE_NAME = 'runtime_event' THEN
            IF EXISTS (SELECT 1 FROM runtime_prunedrun WHERE run_id = OLD.run_id) THEN
                RETURN OLD;
            END IF;
        END IF;
        RAISE EXCEPTION '% is append-only', TG_TABLE_NAME;
    END $$ LANGUAGE plpgsql"""
POSTGRES_FUNCTION_BEFORE = """CREATE OR REPLACE FUNCTION runtime_event_append_only() RETURNS trigger AS $$
    BEGIN RAISE EXCEPTION '% is append-only', TG_TABLE_NAME; END $$ LANGUAGE plpgsql"""


def _sqlite(table):
    return [f"""CREATE TRIGGER {table}_no_{op} BEFORE {op.upper()} ON {table}
               BEGIN SELECT RAISE(ABORT, '{table} is append-only'); END"""
            for op in ("update", "delete")]


def _postgres(table):
    return [f"""CREATE TRIGGER {table}_no_update_delete BEFORE UPDATE OR DELETE ON {table}
                FOR EACH ROW EXECUTE FUNCTION runtime_event_append_only()""",
            f"""CREATE TRIGGER {table}_no_truncate BEFORE TRUNCATE ON {table}
                FOR EACH STATEMENT EXECUTE FUNCTION runtime_event_append_only()"""]


def triggers_up(apps, schema_editor):
    vendor = schema_editor.connection.vendor
    if vendor == "sqlite":
        schema_editor.execute("DROP TRIGGER runtime_event_no_delete")
        schema_editor.execute(SQLITE_EVENT_DELETE)
        for table in NEW_TABLES:
            for sql in _sqlite(table):
                schema_editor.execute(sql)
    elif vendor == "postgresql":
        schema_editor.execute(POSTGRES_FUNCTION, params=None)
        for table in NEW_TABLES:
            for sql in _postgres(table):
                schema_editor.execute(sql)


def triggers_down(apps, schema_editor):
    vendor = schema_editor.connection.vendor
    if vendor == "sqlite":
        for table in NEW_TABLES:
            for op in ("update", "delete"):
                schema_editor.execute(f"DROP TRIGGER IF EXISTS {table}_no_{op}")
        schema_editor.execute("DROP TRIGGER runtime_event_no_delete")
        schema_editor.execute(SQLITE_EVENT_DELETE_BEFORE)
    elif vendor == "postgresql":
        for table in NEW_TABLES:
            for name in ("no_update_delete", "no_truncate"):
                schema_editor.execute(f"DROP TRIGGER IF EXISTS {table}_{name} ON {table}")
        schema_editor.execute(POSTGRES_FUNCTION_BEFORE, params=None)


class Migration(migrations.Migration):

    dependencies = [
        ('runtime', '0013_restores_and_deploys'),
    ]

    operations = [
        migrations.CreateModel(
            name='PrunedRun',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('run_id', models.BigIntegerField(unique=True)),
                ('pruning_seq', models.BigIntegerField(db_index=True)),
                ('event_seq', models.BigIntegerField()),
                ('event_hash', models.CharField(max_length=64)),
            ],
        ),
        migrations.CreateModel(
            name='Pruning',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('seq', models.BigIntegerField(unique=True)),
                ('at', models.DateTimeField()),
                ('by', models.CharField(blank=True, max_length=150)),
                ('finished_before', models.DateTimeField()),
                ('checkpoint_seq', models.BigIntegerField(blank=True, null=True)),
                ('first_run_id', models.BigIntegerField()),
                ('last_run_id', models.BigIntegerField()),
                ('runs', models.IntegerField()),
                ('events', models.BigIntegerField()),
                ('heads_digest', models.CharField(max_length=64)),
                ('archive', models.CharField(help_text="The archive file's name.", max_length=255)),
                ('archive_sha256', models.CharField(max_length=64)),
                ('prev_hash', models.CharField(blank=True, max_length=64)),
                ('hash', models.CharField(max_length=64)),
            ],
        ),
        migrations.RunPython(triggers_up, triggers_down),
    ]
