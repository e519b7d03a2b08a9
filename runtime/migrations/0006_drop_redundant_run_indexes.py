"""Drop the foreign-key indexes on event.run and step.run: the unique (run, seq) and (run, index)
constraints' indexes lead with run and serve every lookup by run, and each event and step
insert writes one index fewer.

Only the indexes are dropped (a plain AlterField would rebuild the event table on SQLite, and
with it lose the append-only triggers)."""

import django.db.models.deletion
from django.db import migrations, models

INDEXES = [("runtime_event", "runtime_event_run_id_d25e86d3"),
           ("runtime_step", "runtime_step_run_id_7d62677f")]


class Migration(migrations.Migration):

    dependencies = [
        ("runtime", "0005_event_actor_index"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[
                migrations.RunSQL(f'DROP INDEX IF EXISTS "{name}"',
                                  reverse_sql=f'CREATE INDEX "{name}" ON "{table}" ("run_id")')
                for table, name in INDEXES
            ],
            state_operations=[
                migrations.AlterField(
                    model_name="event",
                    name="run",
                    field=models.ForeignKey(db_index=False,
                                            on_delete=django.db.models.deletion.PROTECT,
                                            related_name="events", to="runtime.run"),
                ),
                migrations.AlterField(
                    model_name="step",
                    name="run",
                    field=models.ForeignKey(db_index=False,
                                            on_delete=django.db.models.deletion.PROTECT,
                                            related_name="steps", to="runtime.run"),
                ),
            ],
        ),
    ]
