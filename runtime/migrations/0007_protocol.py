"""The database carries the runtime's protocol version (2: plans, database-clock leases)."""

from django.db import migrations, models


def set_version(apps, schema_editor):
    apps.get_model("runtime", "Protocol").objects.update_or_create(pk=1, defaults={"version": 2})


class Migration(migrations.Migration):
    dependencies = [("runtime", "0006_drop_redundant_run_indexes")]

    operations = [
        migrations.CreateModel(
            name="Protocol",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True,
                                           serialize=False, verbose_name="ID")),
                ("version", models.IntegerField()),
            ],
        ),
        migrations.RunPython(set_version, migrations.RunPython.noop),
    ]
