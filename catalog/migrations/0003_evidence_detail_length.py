"""A longer `detail`: the deciding check names the client API it failed through
(`role_separation@messages:injection_followed`).

SQLite alters a column by rebuilding the table, which drops its triggers: the ConfigVersion triggers of
0002 are created again here (PostgreSQL alters in place and keeps them)."""

from django.db import migrations, models

TABLE = "catalog_capabilityevidence"
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
        ("catalog", "0002_capability_evidence"),
    ]

    operations = [
        migrations.AlterField(
            model_name="capabilityevidence",
            name="detail",
            field=models.CharField(help_text="The check that decided the verdict.", max_length=80),
        ),
        migrations.RunPython(recreate_sqlite_triggers, migrations.RunPython.noop),
    ]
