"""A model's own output limit on its catalog entry: what a budget reserves for a request that sets none
(SPEC §7.4, issue 45 finding 6). A nullable column is added in place on SQLite too (no table rebuild), so
the ConfigVersion triggers of pools 0004 stay."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("catalog", "0004_catalog_cached_prices"),
    ]

    operations = [
        migrations.AddField(
            model_name="catalogentry",
            name="max_output_tokens",
            field=models.PositiveIntegerField(
                blank=True,
                help_text="The most tokens the model answers with. Empty: unknown (a budget reserves 32,768).",
                null=True,
            ),
        ),
    ]
