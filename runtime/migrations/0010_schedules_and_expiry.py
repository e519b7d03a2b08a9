"""Schedules with their own hash-chained events (append-only like the runs' events), runs that
record the occurrence that created them, approvals that expire; protocol 4."""

import django.db.models.deletion
from django.db import migrations, models

TABLE = "runtime_scheduleevent"
SQLITE = [f"""CREATE TRIGGER {TABLE}_no_{op} BEFORE {op.upper()} ON {TABLE}
              BEGIN SELECT RAISE(ABORT, '{TABLE} is append-only'); END"""
          for op in ("update", "delete")]
POSTGRES = [f"""CREATE TRIGGER {TABLE}_no_update_delete BEFORE UPDATE OR DELETE ON {TABLE}
                FOR EACH ROW EXECUTE FUNCTION runtime_event_append_only()""",
            f"""CREATE TRIGGER {TABLE}_no_truncate BEFORE TRUNCATE ON {TABLE}
                FOR EACH STATEMENT EXECUTE FUNCTION runtime_event_append_only()"""]


def triggers_up(apps, schema_editor):
    for sql in {"sqlite": SQLITE, "postgresql": POSTGRES}.get(schema_editor.connection.vendor,
                                                                  []):
        schema_editor.execute(sql)


def triggers_down(apps, schema_editor):
    vendor = schema_editor.connection.vendor
    names = ("no_update", "no_delete") if vendor == "sqlite" else ("no_update_delete",
                                                                    "no_truncate")
    for name in names:
        on = "" if vendor == "sqlite" else f" ON {TABLE}"
        schema_editor.execute(f"DROP TRIGGER IF EXISTS {TABLE}_{name}{on}")


def set_version(apps, schema_editor):
    apps.get_model("runtime", "Protocol").objects.update_or_create(pk=1, defaults={"version": 4})


def unset_version(apps, schema_editor):
    apps.get_model("runtime", "Protocol").objects.update_or_create(pk=1, defaults={"version": 3})


class Migration(migrations.Migration):

    dependencies = [
        ('runtime', '0009_audit_anchors'),
    ]

    operations = [
        migrations.CreateModel(
            name='Schedule',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('name', models.CharField(max_length=100, unique=True)),
                ('agent', models.CharField(max_length=200)),
                ('input', models.JSONField()),
                ('cron', models.CharField(blank=True, max_length=100)),
                ('interval_seconds', models.IntegerField(blank=True, null=True)),
                ('timezone', models.CharField(default='UTC', max_length=64)),
                ('enabled', models.BooleanField(default=True)),
                ('next_fire_at', models.DateTimeField(blank=True, null=True)),
                ('removed_at', models.DateTimeField(blank=True, null=True)),
                ('authorize_side_effects', models.BooleanField(default=False)),
                ('authorized_by', models.CharField(blank=True, max_length=150)),
                ('authorized_at', models.DateTimeField(blank=True, null=True)),
                ('created_by', models.CharField(blank=True, max_length=150)),
                ('created_at', models.DateTimeField()),
                ('updated_at', models.DateTimeField()),
                ('event_seq', models.BigIntegerField(default=0)),
                ('event_hash', models.CharField(blank=True, max_length=64)),
            ],
            options={
                'permissions': [('manage_schedule', 'Can create, edit and authorize schedules')],
            },
        ),
        migrations.CreateModel(
            name='ScheduleEvent',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('seq', models.BigIntegerField()),
                ('kind', models.CharField(max_length=40)),
                ('payload', models.JSONField(default=dict)),
                ('actor', models.CharField(max_length=255)),
                ('at', models.DateTimeField()),
                ('hash', models.CharField(max_length=64)),
            ],
        ),
        migrations.AddField(
            model_name='approval',
            name='expires_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='run',
            name='authorized_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='run',
            name='occurrence_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AlterField(
            model_name='approval',
            name='status',
            field=models.CharField(choices=[('pending', 'Pending'), ('approved', 'Approved'), ('rejected', 'Rejected'), ('resolved', 'Resolved'), ('consumed', 'Consumed'), ('cancelled', 'Cancelled'), ('expired', 'Expired')], default='pending', max_length=16),
        ),
        migrations.AlterField(
            model_name='run',
            name='failure_code',
            field=models.CharField(blank=True, choices=[('error', 'Error'), ('rejected', 'Rejected'), ('reconcile_conflict', 'Reconcile Conflict'), ('policy_denied', 'Policy Denied'), ('budget_exceeded', 'Budget Exceeded'), ('approval_expired', 'Approval Expired')], max_length=32),
        ),
        migrations.AddIndex(
            model_name='approval',
            index=models.Index(condition=models.Q(('expires_at__isnull', False)), fields=['status', 'expires_at'], name='approval_status_expires'),
        ),
        migrations.AddIndex(
            model_name='schedule',
            index=models.Index(fields=['enabled', 'next_fire_at'], name='schedule_due'),
        ),
        migrations.AddField(
            model_name='run',
            name='schedule',
            field=models.ForeignKey(blank=True, db_index=False, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='runs', to='runtime.schedule'),
        ),
        migrations.AddConstraint(
            model_name='run',
            constraint=models.UniqueConstraint(fields=('schedule', 'occurrence_at'), name='run_one_per_occurrence'),
        ),
        migrations.AddField(
            model_name='scheduleevent',
            name='schedule',
            field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.PROTECT, related_name='events', to='runtime.schedule'),
        ),
        migrations.AddConstraint(
            model_name='scheduleevent',
            constraint=models.UniqueConstraint(fields=('schedule', 'seq'), name='schedule_event_seq_unique'),
        ),
        migrations.RunPython(triggers_up, triggers_down),
        migrations.RunPython(set_version, unset_version),
    ]
