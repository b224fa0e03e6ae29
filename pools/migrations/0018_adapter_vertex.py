import importlib

from django.db import migrations, models

# The adapter's choices are a check constraint: SQLite rebuilds the table to change it, and the rebuild
# drops the table's triggers, so the config version triggers (0004) are created again (as in 0010-0013).
_triggers = importlib.import_module("pools.migrations.0004_config_version_triggers")


def triggers_again(apps, schema_editor):
    if schema_editor.connection.vendor == "sqlite":
        _triggers.drop(apps, schema_editor)
        _triggers.create(apps, schema_editor)


ADAPTERS = [
    "openai",
    "anthropic",
    "openrouter",
    "azure_openai",
    "openai_compatible",
    "gemini",
    "bedrock",
    "vertex",
]


class Migration(migrations.Migration):
    dependencies = [
        ("pools", "0017_headroom_floor"),
    ]

    operations = [
        migrations.RemoveConstraint(
            model_name="assignment",
            name="assignment_adapter_valid",
        ),
        migrations.AlterField(
            model_name="assignment",
            name="adapter",
            field=models.CharField(
                choices=[
                    ("openai", "Openai"),
                    ("anthropic", "Anthropic"),
                    ("openrouter", "Openrouter"),
                    ("azure_openai", "Azure Openai"),
                    ("openai_compatible", "Openai Compatible"),
                    ("gemini", "Gemini"),
                    ("bedrock", "Bedrock"),
                    ("vertex", "Vertex"),
                ],
                max_length=20,
            ),
        ),
        migrations.AddConstraint(
            model_name="assignment",
            constraint=models.CheckConstraint(
                condition=models.Q(("adapter__in", ADAPTERS)), name="assignment_adapter_valid"
            ),
        ),
        migrations.RunPython(triggers_again, migrations.RunPython.noop),
    ]
