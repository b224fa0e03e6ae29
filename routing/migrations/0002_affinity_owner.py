"""Affinities belong to the gateway key that created them (SPEC §7.2).

Rows written before this migration have no known owner: they are deleted (a response or session
affinity then reads as unknown, which pins nothing; no file affinity existed before)."""

import django.db.models.deletion
from django.db import migrations, models


def forget_ownerless(apps, schema_editor) -> None:
    apps.get_model("routing", "Affinity").objects.all().delete()


class Migration(migrations.Migration):
    dependencies = [
        ("pools", "0004_config_version_triggers"),
        ("routing", "0001_initial"),
    ]

    operations = [
        migrations.RunPython(forget_ownerless, migrations.RunPython.noop),
        migrations.RemoveConstraint(model_name="affinity", name="affinity_unique"),
        migrations.AddField(
            model_name="affinity",
            name="gateway_key",
            field=models.ForeignKey(
                default=0,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="+",
                to="pools.gatewaykey",
            ),
            preserve_default=False,
        ),
        migrations.AlterField(
            model_name="affinity",
            name="expires_at",
            field=models.DateTimeField(db_index=True),
        ),
        migrations.AddConstraint(
            model_name="affinity",
            constraint=models.UniqueConstraint(
                fields=("gateway_key", "kind", "key"), name="affinity_owner_unique"
            ),
        ),
    ]
