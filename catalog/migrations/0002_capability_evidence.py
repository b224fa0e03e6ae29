"""Capability evidence (SPEC §8.1), and the trigger that moves ConfigVersion on every write to it.

Routing caches the routes' effective capabilities per process (`routing.selectors`), so a recorded
verdict must reach every node on its next request: the same trigger as pools/0004 does that, with
no query added to the request path."""

import django.db.models.deletion
from django.db import migrations, models

TABLE = "catalog_capabilityevidence"
BUMP = (
    "INSERT INTO pools_configversion (id, value) VALUES (1, 1) "
    "ON CONFLICT (id) DO UPDATE SET value = pools_configversion.value + 1"
)


def create_trigger(apps, schema_editor):
    run = schema_editor.execute
    if schema_editor.connection.vendor == "postgresql":
        # gateway_config_version_bump() is created by pools/0004.
        run(
            f"CREATE TRIGGER {TABLE}_config_version AFTER INSERT OR UPDATE OR DELETE ON {TABLE} "
            "FOR EACH STATEMENT EXECUTE FUNCTION gateway_config_version_bump()"
        )
    elif schema_editor.connection.vendor == "sqlite":
        for event in ("INSERT", "UPDATE", "DELETE"):
            run(
                f"CREATE TRIGGER {TABLE}_config_version_{event.lower()} AFTER {event} ON {TABLE} "
                f"BEGIN {BUMP}; END"
            )
    else:
        raise NotImplementedError(f"config version triggers for {schema_editor.connection.vendor}")


def drop_trigger(apps, schema_editor):
    run = schema_editor.execute
    if schema_editor.connection.vendor == "postgresql":
        run(f"DROP TRIGGER IF EXISTS {TABLE}_config_version ON {TABLE}")
    else:
        for event in ("insert", "update", "delete"):
            run(f"DROP TRIGGER IF EXISTS {TABLE}_config_version_{event}")


class Migration(migrations.Migration):
    dependencies = [
        ("catalog", "0001_initial"),
        ("pools", "0004_config_version_triggers"),
    ]

    operations = [
        migrations.CreateModel(
            name="CapabilityEvidence",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("model", models.CharField(max_length=200)),
                (
                    "capability",
                    models.CharField(
                        choices=[
                            ("tools", "Tools"),
                            ("write_tools", "Write Tools"),
                            ("vision", "Vision"),
                            ("role_separation", "Role Separation"),
                            ("tool_representation", "Tool Representation"),
                        ],
                        max_length=20,
                    ),
                ),
                ("qualified", models.BooleanField()),
                ("detail", models.CharField(help_text="The check that decided the verdict.", max_length=40)),
                ("qualified_at", models.DateTimeField()),
                ("expires_at", models.DateTimeField()),
                ("corpus_version", models.CharField(max_length=40)),
                (
                    "config_hash",
                    models.CharField(help_text="SHA-256 of the route's configuration.", max_length=64),
                ),
                (
                    "assignment",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="capability_evidence",
                        to="pools.assignment",
                    ),
                ),
            ],
            options={
                "verbose_name": "capability evidence",
                "verbose_name_plural": "capability evidence",
                "ordering": ["-qualified_at", "assignment__name", "model", "capability"],
                "indexes": [
                    models.Index(
                        fields=["assignment", "model", "capability", "qualified_at"],
                        name="catalog_cap_assignm_caf7ec_idx",
                    )
                ],
                "constraints": [
                    models.CheckConstraint(
                        condition=models.Q(
                            (
                                "capability__in",
                                ["tools", "write_tools", "vision", "role_separation", "tool_representation"],
                            )
                        ),
                        name="capabilityevidence_capability_valid",
                    ),
                    models.CheckConstraint(
                        condition=models.Q(("expires_at__gt", models.F("qualified_at"))),
                        name="capabilityevidence_expires_later",
                    ),
                ],
            },
        ),
        migrations.RunPython(create_trigger, drop_trigger),
    ]
