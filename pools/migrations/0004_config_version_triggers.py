"""Triggers that move ConfigVersion on any write to a table routing caches.

An upsert, so the counter row is (re)created if it is missing, and per statement on PostgreSQL
(SQLite only has row triggers)."""

from django.db import migrations

TABLES = [
    "pools_pool",
    "pools_assignment",
    "pools_gatewaysettings",
    "pools_modelalias",
    "pools_modelfallback",
    "catalog_catalogentry",
]
BUMP = (
    "INSERT INTO pools_configversion (id, value) VALUES (1, 1) "
    "ON CONFLICT (id) DO UPDATE SET value = pools_configversion.value + 1"
)


def create(apps, schema_editor):
    run = schema_editor.execute
    if schema_editor.connection.vendor == "postgresql":
        run(
            "CREATE OR REPLACE FUNCTION gateway_config_version_bump() RETURNS trigger AS $$ "
            f"BEGIN {BUMP}; RETURN NULL; END $$ LANGUAGE plpgsql"
        )
        for table in TABLES:
            run(
                f"CREATE TRIGGER {table}_config_version AFTER INSERT OR UPDATE OR DELETE ON {table} "
                "FOR EACH STATEMENT EXECUTE FUNCTION gateway_config_version_bump()"
            )
    elif schema_editor.connection.vendor == "sqlite":
        for table in TABLES:
            for event in ("INSERT", "UPDATE", "DELETE"):
                run(
                    f"CREATE TRIGGER {table}_config_version_{event.lower()} AFTER {event} ON {table} "
                    f"BEGIN {BUMP}; END"
                )
    else:
        raise NotImplementedError(f"config version triggers for {schema_editor.connection.vendor}")


def drop(apps, schema_editor):
    run = schema_editor.execute
    if schema_editor.connection.vendor == "postgresql":
        for table in TABLES:
            run(f"DROP TRIGGER IF EXISTS {table}_config_version ON {table}")
        run("DROP FUNCTION IF EXISTS gateway_config_version_bump()")
    else:
        for table in TABLES:
            for event in ("insert", "update", "delete"):
                run(f"DROP TRIGGER IF EXISTS {table}_config_version_{event}")


class Migration(migrations.Migration):
    dependencies = [
        ("pools", "0003_config_version"),
        ("catalog", "0001_initial"),
    ]

    operations = [migrations.RunPython(create, drop)]
