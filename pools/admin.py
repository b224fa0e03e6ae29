from django import forms
from django.contrib import admin

from gatewaysite.admin import PoolScopedAdmin
from pools.models import (
    MIN_KEY_LENGTH,
    Assignment,
    GatewayKey,
    GatewaySettings,
    ModelAlias,
    ModelFallback,
    Pool,
)


class AssignmentInline(admin.TabularInline):
    model = Assignment
    fields = ("name", "adapter", "base_url", "tier", "region", "router", "enabled")
    extra = 0
    show_change_link = True


@admin.register(Pool)
class PoolAdmin(PoolScopedAdmin):
    pool_path = "pk"
    list_display = ("name", "auto_models")
    search_fields = ("name",)
    inlines = [AssignmentInline]
    fields = ("name", "auto_models", "operator_groups")
    filter_horizontal = ("operator_groups",)

    def get_readonly_fields(self, request, obj=None):
        # Granting a pool is granting access: only a superuser decides who operates which pool.
        return () if request.user.is_superuser else ("operator_groups",)


@admin.register(Assignment)
class AssignmentAdmin(PoolScopedAdmin):
    list_display = ("name", "pool", "adapter", "tier", "weight", "region", "router", "enabled")
    list_filter = (("pool", admin.RelatedOnlyFieldListFilter), "adapter", "router", "enabled")
    list_select_related = ("pool",)
    search_fields = ("name", "base_url")
    fieldsets = (
        (None, {"fields": ("pool", "name", "adapter", "base_url", "api_key_env", "enabled", "discovery")}),
        ("Preference", {"fields": ("tier", "weight", "min_deadline_ms", "quality")}),
        ("Placement and privacy", {"fields": ("region", "router", "zero_retention", "data_collection")}),
        (
            "Capabilities",
            {"fields": ("tools", "write_tools", "vision", "role_separation", "tool_representation")},
        ),
    )


class GatewayKeyForm(forms.ModelForm):
    """The raw key is taken once, hashed, and never rendered back."""

    raw_key = forms.CharField(
        label="Key",
        required=False,
        widget=forms.PasswordInput(render_value=False),
        help_text=f"Set or replace the secret (at least {MIN_KEY_LENGTH} characters); empty keeps it.",
    )

    class Meta:
        model = GatewayKey
        fields = (
            "name",
            "pools",
            "allowed_models",
            "require_zero_retention",
            "regions",
            "allow_third_party_router",
            "min_quality",
            "budget_micros",
            "budget_period",
            "limit_rpm",
            "limit_tpm",
            "limit_concurrent",
            "enabled",
        )

    def clean_raw_key(self) -> str:
        raw = self.cleaned_data.get("raw_key", "")
        if not raw and not self.instance.key_hash:
            raise forms.ValidationError("A new key needs its secret.")
        if raw and len(raw) < MIN_KEY_LENGTH:
            raise forms.ValidationError(f"Use at least {MIN_KEY_LENGTH} characters.")
        return raw

    def save(self, commit: bool = True) -> GatewayKey:
        raw = self.cleaned_data.get("raw_key")
        if raw:
            self.instance.set_key(raw)
        return super().save(commit=commit)


@admin.register(GatewayKey)
class GatewayKeyAdmin(admin.ModelAdmin):
    form = GatewayKeyForm
    list_display = (
        "name",
        "prefix",
        "enabled",
        "expires_at",
        "budget_micros",
        "budget_period",
        "spent_micros",
        "reserved_micros",
    )
    readonly_fields = (
        "prefix",
        "spent_micros",
        "reserved_micros",
        "period_start",
        "previous_prefix",
        "previous_valid_until",
    )
    search_fields = ("name", "prefix")
    filter_horizontal = ("pools",)


@admin.register(GatewaySettings)
class GatewaySettingsAdmin(admin.ModelAdmin):
    list_display = (
        "__str__",
        "failure_threshold",
        "cooldown_seconds",
        "max_attempts",
        "model_fallback_family",
    )

    def has_add_permission(self, request) -> bool:
        # A singleton: addable once, and only by a user who may add it at all.
        return super().has_add_permission(request) and not GatewaySettings.objects.exists()

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


@admin.register(ModelAlias)
class ModelAliasAdmin(admin.ModelAdmin):
    list_display = ("alias", "canonical")
    search_fields = ("alias", "canonical")


@admin.register(ModelFallback)
class ModelFallbackAdmin(admin.ModelAdmin):
    list_display = ("requested", "served")
    search_fields = ("requested", "served")
