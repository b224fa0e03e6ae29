import importlib

from django.db import migrations, models

# The tri-state is a check constraint: SQLite rebuilds the table to add it, and the rebuild drops the
# table's triggers, so the config version triggers (0004) are created again (as in 0010 to 0013).
_triggers = importlib.import_module("pools.migrations.0004_config_version_triggers")


def triggers_again(apps, schema_editor):
    if schema_editor.connection.vendor == "sqlite":
        _triggers.drop(apps, schema_editor)
        _triggers.create(apps, schema_editor)


class Migration(migrations.Migration):
    dependencies = [
        ("pools", "0013_adapter_bedrock"),
    ]

    operations = [
        migrations.AddField(
            model_name="assignment",
            name="stream_options",
            field=models.CharField(
                choices=[("true", "True"), ("false", "False"), ("unknown", "Unknown")],
                default="unknown",
                help_text="openai_compatible: true asks each stream for its usage; false never sends stream_options.",
                max_length=7,
            ),
        ),
        migrations.AddConstraint(
            model_name="assignment",
            constraint=models.CheckConstraint(
                condition=models.Q(("stream_options__in", ["true", "false", "unknown"])),
                name="assignment_stream_options_tristate",
            ),
        ),
        migrations.RunPython(triggers_again, migrations.RunPython.noop),
    ]
