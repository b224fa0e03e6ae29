"""Catalog entries: which models each assignment advertises, and how we know (SPEC §8)."""

from django.db import models
from django.db.models import Q

from pools.models import Assignment, choices_check, tri_state_check, tri_state_field


class Provenance(models.TextChoices):
    CONFIGURED = "configured"  # declared in the gateway configuration
    OBSERVED = "observed"  # seen in the latest successful discovery
    PRESERVED = "preserved"  # kept from an earlier discovery because this one failed


class CatalogEntry(models.Model):
    assignment = models.ForeignKey(Assignment, on_delete=models.CASCADE, related_name="catalog_entries")
    model = models.CharField(max_length=200)
    provenance = models.CharField(max_length=10, choices=Provenance.choices)
    context_window = models.PositiveIntegerField(null=True, blank=True, help_text="Empty: unknown.")
    tools = tri_state_field()
    vision = tri_state_field()
    input_per_mtok_micros = models.BigIntegerField(null=True, blank=True, help_text="Empty: unknown price.")
    output_per_mtok_micros = models.BigIntegerField(null=True, blank=True, help_text="Empty: unknown price.")
    observed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name_plural = "catalog entries"
        ordering = ["assignment__name", "model"]
        constraints = [
            models.UniqueConstraint(fields=["assignment", "model"], name="catalogentry_unique"),
            choices_check("catalogentry", "provenance", Provenance),
            tri_state_check("catalogentry", "tools"),
            tri_state_check("catalogentry", "vision"),
            models.CheckConstraint(
                condition=Q(input_per_mtok_micros__isnull=True) | Q(input_per_mtok_micros__gte=0),
                name="catalogentry_input_price_nonneg",
            ),
            models.CheckConstraint(
                condition=Q(output_per_mtok_micros__isnull=True) | Q(output_per_mtok_micros__gte=0),
                name="catalogentry_output_price_nonneg",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.assignment.name}:{self.model} ({self.provenance})"
