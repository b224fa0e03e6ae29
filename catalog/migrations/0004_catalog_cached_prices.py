"""Cached-input rates on a catalog entry's price (SPEC §7.3).

SQLite adds a check constraint by rebuilding the table, which drops its triggers: the ConfigVersion
triggers of pools 0004 on this table are created again here (PostgreSQL alters in place and keeps
them), or a price change would not reach the routers' cached configuration."""

from django.db import migrations, models

TABLE = "catalog_catalogentry"
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
        ("catalog", "0003_evidence_detail_length"),
        ("pools", "0016_budget_hold"),
    ]

    operations = [
        migrations.AddField(
            model_name="catalogentry",
            name="cache_write_per_mtok_micros",
            field=models.BigIntegerField(
                blank=True,
                help_text="Input written to the prompt cache. Empty: priced at the input rate.",
                null=True,
            ),
        ),
        migrations.AddField(
            model_name="catalogentry",
            name="cached_input_per_mtok_micros",
            field=models.BigIntegerField(
                blank=True,
                help_text="Input read from the prompt cache. Empty: priced at the input rate.",
                null=True,
            ),
        ),
        migrations.AddConstraint(
            model_name="catalogentry",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    ("cached_input_per_mtok_micros__isnull", True),
                    ("cached_input_per_mtok_micros__gte", 0),
                    _connector="OR",
                ),
                name="catalogentry_cached_input_price_nonneg",
            ),
        ),
        migrations.AddConstraint(
            model_name="catalogentry",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    ("cache_write_per_mtok_micros__isnull", True),
                    ("cache_write_per_mtok_micros__gte", 0),
                    _connector="OR",
                ),
                name="catalogentry_cache_write_price_nonneg",
            ),
        ),
        migrations.RunPython(recreate_sqlite_triggers, migrations.RunPython.noop),
    ]
