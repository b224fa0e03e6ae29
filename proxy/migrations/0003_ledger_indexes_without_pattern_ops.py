# The ledger's tables keep the indexes a query uses and lose three that only every insert paid for: the
# `varchar_pattern_ops` copies PostgreSQL got for the unique request id and the indexed operation id (no
# query makes a prefix LIKE on them), and the attempt's own index on its request (attempt_unique_ordinal
# leads with that column). The new unique constraint and index are built before the old ones go, so the
# request id is never without its uniqueness.

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("pools", "0016_budget_hold"),
        ("proxy", "0002_ledger_operation_and_config_version"),
    ]

    operations = [
        migrations.AddConstraint(
            model_name="requestrecord",
            constraint=models.UniqueConstraint(
                fields=("request_id",), name="requestrecord_unique_request_id"
            ),
        ),
        migrations.AddIndex(
            model_name="requestrecord",
            index=models.Index(fields=["operation_id"], name="requestrecord_operation_id"),
        ),
        migrations.AlterField(
            model_name="requestrecord",
            name="request_id",
            field=models.CharField(max_length=64),
        ),
        migrations.AlterField(
            model_name="requestrecord",
            name="operation_id",
            field=models.CharField(
                blank=True,
                help_text="x-gateway-operation-id from the client, else the request id.",
                max_length=64,
            ),
        ),
        migrations.AlterField(
            model_name="attempt",
            name="request",
            field=models.ForeignKey(
                db_index=False,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="attempts",
                to="proxy.requestrecord",
            ),
        ),
    ]
