"""Audit exports: every export of the audit log taken away is itself on record, in a table
hash-chained like the checkpoints and append-only like the rest of the audit log (the same
triggers, written out here as they were at this migration). The ``export_audit`` permission
is given to people one by one."""

from django.db import migrations, models

TABLE = "runtime_auditexport"


def triggers_up(apps, schema_editor):
    vendor = schema_editor.connection.vendor
    if vendor == "sqlite":
        for op in ("update", "delete"):
            schema_editor.execute(
                f"""CREATE TRIGGER {TABLE}_no_{op} BEFORE {op.upper()} ON {TABLE}
                BEGIN SELECT RAISE(ABORT, '{TABLE} is append-only'); END""")
    elif vendor == "postgresql":
        schema_editor.execute(
            f"""CREATE TRIGGER {TABLE}_no_update_delete BEFORE UPDATE OR DELETE ON {TABLE}
            FOR EACH ROW EXECUTE FUNCTION runtime_event_append_only()""")
        schema_editor.execute(
            f"""CREATE TRIGGER {TABLE}_no_truncate BEFORE TRUNCATE ON {TABLE}
            FOR EACH STATEMENT EXECUTE FUNCTION runtime_event_append_only()""")


def triggers_down(apps, schema_editor):
    vendor = schema_editor.connection.vendor
    if vendor == "sqlite":
        for op in ("update", "delete"):
            schema_editor.execute(f"DROP TRIGGER IF EXISTS {TABLE}_no_{op}")
    elif vendor == "postgresql":
        for name in ("no_update_delete", "no_truncate"):
            schema_editor.execute(f"DROP TRIGGER IF EXISTS {TABLE}_{name} ON {TABLE}")


class Migration(migrations.Migration):

    dependencies = [
        ('runtime', '0016_deciding_where_people_are'),
    ]

    operations = [
        migrations.CreateModel(
            name='AuditExport',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('seq', models.BigIntegerField(unique=True)),
                ('at', models.DateTimeField()),
                ('by', models.CharField(blank=True, max_length=150)),
                ('what', models.CharField(max_length=16)),
                ('format', models.CharField(max_length=8)),
                ('filters', models.JSONField(default=dict)),
                ('rows', models.BigIntegerField()),
                ('complete', models.BooleanField()),
                ('last_hash', models.CharField(blank=True, help_text="The chain hash on the export's last line.", max_length=64)),
                ('sha256', models.CharField(help_text='SHA-256 of the exported bytes.', max_length=64)),
                ('prev_hash', models.CharField(blank=True, max_length=64)),
                ('hash', models.CharField(max_length=64)),
            ],
            options={
                'permissions': [('export_audit', 'Can export the audit log')],
            },
        ),
        migrations.RunPython(triggers_up, triggers_down),
    ]
