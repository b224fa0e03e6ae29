"""`qualification_days` (SPEC §8.1): how long a verdict of `manage.py qualify` stays valid.

SQLite cannot add a column with a check constraint in place: Django rebuilds the table, and the
rebuild drops the table's triggers, among them the ones that move ConfigVersion (pools/0004). They
are created again here; PostgreSQL alters the table in place and keeps them."""

from django.db import migrations, models

TABLE = "pools_gatewaysettings"
BUMP = (
    "INSERT INTO pools_configversion (id, value) VALUES (1, 1) "
    "ON CONFLICT (id) DO UPDATE SET value = pools_configversion.value + 1"
)


def recreate_sqlite_triggers(apps, schema_editor):
    if schema_editor.connection.vendor != "sqlite":
        return
    for event in ("INSERT", "UPDATE", "DELETE"):
        name = f"{TABLE}_config_version_{event.lower()}"
        schema_editor.execute(f"DROP TRIGGER IF EXISTS {name}")
        schema_editor.execute(f"CREATE TRIGGER {name} AFTER {event} ON {TABLE} BEGIN {BUMP}; END")


class Migration(migrations.Migration):
    dependencies = [
        ("pools", "0004_config_version_triggers"),
    ]

    operations = [
        migrations.AddField(
            model_name="gatewaysettings",
            name="qualification_days",
            field=models.PositiveIntegerField(
                default=30, help_text="How long a verdict of manage.py qualify stays valid."
            ),
        ),
        migrations.AddConstraint(
            model_name="gatewaysettings",
            constraint=models.CheckConstraint(
                condition=models.Q(("qualification_days__gte", 1)),
                name="gatewaysettings_qualification_days_min",
            ),
        ),
        migrations.RunPython(recreate_sqlite_triggers, migrations.RunPython.noop),
    ]
