"""The transactional outbox: notifications about approvals and each delivery attempt; protocol 5
(a pause now writes its notifications: an older worker would leave approvals nobody hears of)."""

import django.db.models.deletion
from django.db import migrations, models


def set_version(apps, schema_editor):
    apps.get_model("runtime", "Protocol").objects.update_or_create(pk=1, defaults={"version": 5})


def unset_version(apps, schema_editor):
    apps.get_model("runtime", "Protocol").objects.update_or_create(pk=1, defaults={"version": 4})


class Migration(migrations.Migration):

    dependencies = [
        ('runtime', '0011_schedule_permissions'),
    ]

    operations = [
        migrations.CreateModel(
            name='Notification',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('event', models.CharField(max_length=40)),
                ('channel', models.CharField(max_length=100)),
                ('kind', models.CharField(max_length=16)),
                ('target', models.CharField(max_length=500)),
                ('body', models.JSONField()),
                ('idempotency_key', models.CharField(max_length=100, unique=True)),
                ('status', models.CharField(choices=[('pending', 'Pending'), ('delivered', 'Delivered'), ('failed', 'Failed')], default='pending', max_length=16)),
                ('attempts', models.IntegerField(default=0)),
                ('next_attempt_at', models.DateTimeField()),
                ('last_error', models.TextField(blank=True)),
                ('created_at', models.DateTimeField()),
                ('delivered_at', models.DateTimeField(blank=True, null=True)),
                ('approval', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='notifications', to='runtime.approval')),
            ],
        ),
        migrations.CreateModel(
            name='NotificationAttempt',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('number', models.IntegerField()),
                ('at', models.DateTimeField()),
                ('ok', models.BooleanField()),
                ('status_code', models.IntegerField(blank=True, null=True)),
                ('error', models.TextField(blank=True)),
                ('next_attempt_at', models.DateTimeField(blank=True, null=True)),
                ('notification', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='attempt_log', to='runtime.notification')),
            ],
        ),
        migrations.AddIndex(
            model_name='notification',
            index=models.Index(fields=['status', 'next_attempt_at'], name='notification_due'),
        ),
        migrations.RunPython(set_version, unset_version),
    ]
