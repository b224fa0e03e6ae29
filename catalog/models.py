"""Catalog entries: which models each assignment advertises, and how we know (SPEC §8)."""

from django.db import models
from django.db.models import Q

from pools.models import Assignment, choices, choices_check, tri_state_check, tri_state_field
from routing.policy.capabilities import Capability


class Provenance(models.TextChoices):
    CONFIGURED = "configured"  # declared in the gateway configuration
    OBSERVED = "observed"  # seen in the latest successful discovery
    PRESERVED = "preserved"  # kept from an earlier discovery because this one failed


class CatalogEntry(models.Model):
    assignment = models.ForeignKey(Assignment, on_delete=models.CASCADE, related_name="catalog_entries")
    model = models.CharField(max_length=200)
    provenance = models.CharField(max_length=10, choices=Provenance.choices)
    context_window = models.PositiveIntegerField(null=True, blank=True, help_text="Empty: unknown.")
    max_output_tokens = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="The most tokens the model answers with. Empty: unknown (a budget reserves 32,768).",
    )
    tools = tri_state_field()
    vision = tri_state_field()
    input_per_mtok_micros = models.BigIntegerField(null=True, blank=True, help_text="Empty: unknown price.")
    output_per_mtok_micros = models.BigIntegerField(null=True, blank=True, help_text="Empty: unknown price.")
    cached_input_per_mtok_micros = models.BigIntegerField(
        null=True, blank=True, help_text="Input read from the prompt cache. Empty: priced at the input rate."
    )
    cache_write_per_mtok_micros = models.BigIntegerField(
        null=True, blank=True, help_text="Input written to the prompt cache. Empty: priced at the input rate."
    )
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
            models.CheckConstraint(
                condition=Q(cached_input_per_mtok_micros__isnull=True)
                | Q(cached_input_per_mtok_micros__gte=0),
                name="catalogentry_cached_input_price_nonneg",
            ),
            models.CheckConstraint(
                condition=Q(cache_write_per_mtok_micros__isnull=True) | Q(cache_write_per_mtok_micros__gte=0),
                name="catalogentry_cache_write_price_nonneg",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.assignment.name}:{self.model} ({self.provenance})"


class CapabilityEvidence(models.Model):
    """One verdict of a qualification replay (SPEC §8.1): what an auditor needs to see why a route was
    allowed, and nothing of what was said. Append-only: the latest verdict of a route and capability is
    the one eligibility considers, and only while it has not expired and its configuration hash still
    equals the route's (`routing.policy.capabilities.effective`). Never a prompt, an answer, a credential or a
    provider message: `detail` is one of the gateway's own check codes (`catalog.qualification`)."""

    assignment = models.ForeignKey(Assignment, on_delete=models.CASCADE, related_name="capability_evidence")
    model = models.CharField(max_length=200)
    capability = models.CharField(max_length=20, choices=choices(Capability))
    qualified = models.BooleanField()
    detail = models.CharField(max_length=80, help_text="The check that decided the verdict.")
    qualified_at = models.DateTimeField()
    expires_at = models.DateTimeField()
    corpus_version = models.CharField(max_length=40)
    config_hash = models.CharField(max_length=64, help_text="SHA-256 of the route's configuration.")

    class Meta:
        verbose_name = "capability evidence"
        verbose_name_plural = "capability evidence"
        ordering = ["-qualified_at", "assignment__name", "model", "capability"]
        indexes = [models.Index(fields=["assignment", "model", "capability", "qualified_at"])]
        constraints = [
            choices_check("capabilityevidence", "capability", Capability),
            models.CheckConstraint(
                condition=Q(expires_at__gt=models.F("qualified_at")), name="capabilityevidence_expires_later"
            ),
        ]

    def __str__(self) -> str:
        verdict = "qualified" if self.qualified else "not qualified"
        return f"{self.assignment.name}:{self.model} {self.capability} {verdict}"
