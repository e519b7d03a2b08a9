"""The audit anchors: the global chain of run creations and the checkpoint record, both
append-only in the database like the events; existing runs are entered in id order; the
protocol becomes 3 (creating a run now writes its creation entry)."""

from django.db import migrations, models

from runtime.storage.creations import creation_hash

TABLES = ("runtime_runcreation", "runtime_auditcheckpoint")


def _sqlite(table):
    return [f"""CREATE TRIGGER {table}_no_{op} BEFORE {op.upper()} ON {table}
               BEGIN SELECT RAISE(ABORT, '{table} is append-only'); END"""
            for op in ("update", "delete")]


def _postgres(table):
    return [f"""CREATE TRIGGER {table}_no_update_delete BEFORE UPDATE OR DELETE ON {table}
                FOR EACH ROW EXECUTE FUNCTION runtime_event_append_only()""",
            f"""CREATE TRIGGER {table}_no_truncate BEFORE TRUNCATE ON {table}
                FOR EACH STATEMENT EXECUTE FUNCTION runtime_event_append_only()"""]


# Migration 0002's refusal, reused for the new tables, now names the table it guards.
POSTGRES_FUNCTION = """CREATE OR REPLACE FUNCTION runtime_event_append_only() RETURNS trigger AS $$
    BEGIN RAISE EXCEPTION '% is append-only', TG_TABLE_NAME; END $$ LANGUAGE plpgsql"""


def triggers_up(apps, schema_editor):
    vendor = schema_editor.connection.vendor
    if vendor == "postgresql":
        schema_editor.execute(POSTGRES_FUNCTION, params=None)  # its % is not a placeholder
    for table in TABLES:
        for sql in {"sqlite": _sqlite, "postgresql": _postgres}.get(vendor, lambda t: [])(table):
            schema_editor.execute(sql)


def triggers_down(apps, schema_editor):
    vendor = schema_editor.connection.vendor
    for table in TABLES:
        if vendor == "sqlite":
            for op in ("update", "delete"):
                schema_editor.execute(f"DROP TRIGGER IF EXISTS {table}_no_{op}")
        elif vendor == "postgresql":
            for name in ("no_update_delete", "no_truncate"):
                schema_editor.execute(f"DROP TRIGGER IF EXISTS {table}_{name} ON {table}")


def backfill(apps, schema_editor):
    """Enter every existing run, in id order, into the global chain."""
    run_model = apps.get_model("runtime", "Run")
    event_model = apps.get_model("runtime", "Event")
    creation_model = apps.get_model("runtime", "RunCreation")
    prev, seq, batch = "", 0, []
    runs = run_model.objects.order_by("pk").values_list("pk", "agent", "created_by", "created_at")
    for run_id, agent, created_by, at in runs.iterator(chunk_size=2000):
        first = event_model.objects.filter(run_id=run_id, seq=1).values_list(
            "hash", flat=True).first() or ""
        seq += 1
        prev = creation_hash(prev, seq=seq, run_id=run_id, agent=agent, created_by=created_by,
                             at=at, first_hash=first)
        batch.append(creation_model(seq=seq, run_id=run_id, agent=agent, created_by=created_by,
                                    at=at, first_hash=first, hash=prev))
        if len(batch) == 2000:
            creation_model.objects.bulk_create(batch)
            batch = []
    creation_model.objects.bulk_create(batch)


def set_version(apps, schema_editor):
    apps.get_model("runtime", "Protocol").objects.update_or_create(pk=1, defaults={"version": 3})


def unset_version(apps, schema_editor):
    apps.get_model("runtime", "Protocol").objects.update_or_create(pk=1, defaults={"version": 2})


class Migration(migrations.Migration):

    dependencies = [
        ('runtime', '0008_operator_groups'),
    ]

    operations = [
        migrations.CreateModel(
            name='AuditCheckpoint',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('seq', models.BigIntegerField(unique=True)),
                ('at', models.DateTimeField()),
                ('by', models.CharField(blank=True, max_length=150)),
                ('creations_seq', models.BigIntegerField()),
                ('creations_hash', models.CharField(blank=True, max_length=64)),
                ('runs', models.BigIntegerField()),
                ('heads_digest', models.CharField(max_length=64)),
                ('prev_hash', models.CharField(blank=True, max_length=64)),
                ('hash', models.CharField(max_length=64)),
            ],
        ),
        migrations.CreateModel(
            name='RunCreation',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('seq', models.BigIntegerField(unique=True)),
                ('run_id', models.BigIntegerField(unique=True)),
                ('agent', models.CharField(max_length=200)),
                ('created_by', models.CharField(blank=True, max_length=150)),
                ('at', models.DateTimeField()),
                ('first_hash', models.CharField(help_text="The hash of the run's event #1.", max_length=64)),
                ('hash', models.CharField(max_length=64)),
            ],
        ),
        migrations.RunPython(backfill, migrations.RunPython.noop),
        migrations.RunPython(triggers_up, triggers_down),
        migrations.RunPython(set_version, unset_version),
    ]
