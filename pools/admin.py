import json

from django import forms
from django.contrib import admin

from pools import credentials
from pools.models import (
    MIN_KEY_LENGTH,
    Assignment,
    GatewayKey,
    GatewaySettings,
    ModelAlias,
    ModelFallback,
    Pool,
)
from pools.scoping import PoolScopedAdmin
from routing.policy.budget import micros_from_usd, usd

# Only a superuser sets where an assignment sends requests and with which credential (SPEC §9): a pool
# operator who could would send another pool's credential, or any variable, to a host of their choosing.
SUPERUSER_ONLY_ASSIGNMENT_FIELDS = ("base_url", "api_key_env")


class StringListField(forms.Field):
    """A list of names (models, regions) typed one per line, as a person writes a list, where Django's
    default for the JSON column was a box of raw JSON (issue 47 point 7). Commas separate too, blank lines
    are dropped and a name given twice is kept once; a JSON list (what the box used to hold) still reads.
    A name holds no whitespace."""

    widget = forms.Textarea(attrs={"rows": 4, "cols": 40})

    def prepare_value(self, value):
        if isinstance(value, list | tuple):
            return "\n".join(str(item) for item in value)
        return value

    def to_python(self, value) -> list[str]:
        if isinstance(value, list | tuple):
            items = [str(item) for item in value]
        else:
            text = (value or "").strip()
            try:
                parsed = json.loads(text) if text.startswith("[") else None
            except json.JSONDecodeError:
                parsed = None
            if isinstance(parsed, list) and all(isinstance(item, str) for item in parsed):
                items = parsed
            else:
                items = text.replace(",", "\n").splitlines()
        names = list(dict.fromkeys(item.strip() for item in items if item.strip()))
        spaced = [name for name in names if any(ch.isspace() for ch in name)]
        if spaced:
            raise forms.ValidationError(
                "One name per line, without spaces: %(names)s", params={"names": ", ".join(spaced)}
            )
        return names


class PoolForm(forms.ModelForm):
    auto_models = StringListField(
        required=False, help_text="Candidates for model=auto, one per line, in order of preference."
    )

    class Meta:
        model = Pool
        fields = ("name", "auto_models", "operator_groups")


class AssignmentInline(admin.StackedInline):
    """A pool's assignments on its page, each a short form whose rows wrap (a table of seven inputs was
    1,870 px wide at 1280, issue 47 point 7); the rest of an assignment is on its own page."""

    model = Assignment
    fields = (("name", "adapter"), "base_url", ("tier", "region", "router", "enabled"))
    extra = 0
    show_change_link = True

    def get_readonly_fields(self, request, obj=None):
        return () if request.user.is_superuser else SUPERUSER_ONLY_ASSIGNMENT_FIELDS[:1]

    def has_add_permission(self, request, obj=None) -> bool:
        return request.user.is_superuser and super().has_add_permission(request, obj)


@admin.register(Pool)
class PoolAdmin(PoolScopedAdmin):
    pool_path = "pk"
    form = PoolForm
    list_display = ("name", "auto_models")
    search_fields = ("name",)
    inlines = [AssignmentInline]
    fields = ("name", "auto_models", "operator_groups")
    filter_horizontal = ("operator_groups",)

    def get_readonly_fields(self, request, obj=None):
        # Granting a pool is granting access: only a superuser decides who operates which pool.
        return () if request.user.is_superuser else ("operator_groups",)


ASSIGNMENT_FIELDSETS = (
    (None, {"fields": ("pool", "name", "adapter", "base_url", "enabled", "discovery")}),
    (
        "Credential",
        {"fields": ("credential_status", "new_credential", "remove_credential", "api_key_env")},
    ),
    ("Preference", {"fields": ("tier", "weight", "min_deadline_ms", "quality", "headroom_floor")}),
    ("Placement and privacy", {"fields": ("region", "router", "zero_retention", "data_collection")}),
    (
        "Capabilities",
        {
            "fields": (
                "tools",
                "write_tools",
                "vision",
                "role_separation",
                "tool_representation",
                "stream_options",
            )
        },
    ),
)
NOT_MODEL_FIELDS = {"credential_status", "new_credential", "remove_credential"}
ASSIGNMENT_MODEL_FIELDS = tuple(
    f for _, options in ASSIGNMENT_FIELDSETS for f in options["fields"] if f not in NOT_MODEL_FIELDS
)


class AssignmentForm(forms.ModelForm):
    """A superuser's form: the credential is write-only (typed once, stored encrypted, never rendered
    back), or named by `api_key_env`, never both."""

    new_credential = forms.CharField(
        label="Credential",
        required=False,
        strip=True,
        widget=forms.PasswordInput(render_value=False),
        help_text="Set or replace the stored credential (encrypted; never shown again). Empty keeps it.",
    )
    remove_credential = forms.BooleanField(label="Remove the stored credential", required=False)

    class Meta:
        model = Assignment
        fields = ASSIGNMENT_MODEL_FIELDS

    def clean(self):
        data = super().clean()
        new, remove = data.get("new_credential", ""), data.get("remove_credential", False)
        if new and remove:
            self.add_error("remove_credential", "Set a credential or remove it, not both.")
        if new and not credentials.can_encrypt():
            self.add_error(
                "new_credential", "GATEWAY_CREDENTIALS_KEY is not set: a credential cannot be stored."
            )
        stored = bool(new) or (bool(self.instance.credential) and not remove)
        if stored and data.get("api_key_env"):
            self.add_error("api_key_env", "Use a stored credential or an environment variable, not both.")
        return data

    def save(self, commit: bool = True) -> Assignment:
        new = self.cleaned_data.get("new_credential")
        if new:
            self.instance.set_credential(new)
        elif self.cleaned_data.get("remove_credential"):
            self.instance.clear_credential()
        return super().save(commit=commit)


class AssignmentOperatorForm(forms.ModelForm):
    """A pool operator's form: no credential field at all."""

    class Meta:
        model = Assignment
        fields = ASSIGNMENT_MODEL_FIELDS


@admin.register(Assignment)
class AssignmentAdmin(PoolScopedAdmin):
    list_display = ("name", "pool", "adapter", "tier", "weight", "region", "router", "enabled")
    list_filter = (("pool", admin.RelatedOnlyFieldListFilter), "adapter", "router", "enabled")
    list_select_related = ("pool",)
    search_fields = ("name",)
    fieldsets = ASSIGNMENT_FIELDSETS

    @admin.display(description="Stored credential")
    def credential_status(self, obj: Assignment | None) -> str:
        if obj is None or not obj.credential:
            return "not set"
        return f"set, ending in …{obj.credential_hint}" if obj.credential_hint else "set"

    def get_form(self, request, obj=None, change=False, **kwargs):
        kwargs["form"] = AssignmentForm if request.user.is_superuser else AssignmentOperatorForm
        return super().get_form(request, obj, change, **kwargs)

    def get_fieldsets(self, request, obj=None):
        if request.user.is_superuser:
            return self.fieldsets
        hidden = {"new_credential", "remove_credential"}
        return tuple(
            (name, {**options, "fields": tuple(f for f in options["fields"] if f not in hidden)})
            for name, options in self.fieldsets
        )

    def get_readonly_fields(self, request, obj=None):
        if request.user.is_superuser:
            return ("credential_status",)
        return ("credential_status", *SUPERUSER_ONLY_ASSIGNMENT_FIELDS)

    def has_add_permission(self, request) -> bool:
        # A new assignment needs its base_url, which only a superuser sets.
        return request.user.is_superuser and super().has_add_permission(request)


class KeyFormBase(forms.ModelForm):
    """A key's budget in dollars (stored as micros, SPEC §7.4), as the YAML's `budget_usd`; a new key's
    allow-list starts at every model of its pools, as in the YAML and create_key."""

    allowed_models = StringListField(
        help_text="The models this key may use, one per line; * for every model of its pools."
    )
    regions = StringListField(
        required=False, help_text="The regions its requests may be served in, one per line; empty: any."
    )
    budget_usd = forms.DecimalField(
        label="Budget (USD)",
        required=False,
        min_value=0,
        decimal_places=6,
        max_digits=18,
        help_text="e.g. 50.00, per budget period; empty: no budget.",
    )

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if self.instance.pk is None:
            self.fields["allowed_models"].initial = ["*"]
        micros = self.instance.budget_micros
        self.fields["budget_usd"].initial = None if micros is None else usd(micros).removeprefix("$")

    def save(self, commit: bool = True) -> GatewayKey:
        amount = self.cleaned_data.get("budget_usd")
        self.instance.budget_micros = None if amount is None else micros_from_usd(str(amount))
        return super().save(commit=commit)


class GatewayKeyForm(KeyFormBase):
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
            "budget_usd",
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


class GatewayKeyOperatorForm(KeyFormBase):
    """A pool operator's form: no secret. Setting a key's secret is taking over its client (its files,
    its responses), so only a superuser sets one (issue 45)."""

    class Meta:
        model = GatewayKey
        fields = GatewayKeyForm.Meta.fields


@admin.register(GatewayKey)
class GatewayKeyAdmin(PoolScopedAdmin):
    """A key is visible to a pool operator when all its pools are granted to them; only a superuser
    sets a key's pools (adding a pool to a key is granting that pool)."""

    pool_path = None
    key_path = "pk"
    form = GatewayKeyForm
    list_display = (
        "name",
        "prefix",
        "enabled",
        "expires_at",
        "budget",
        "budget_period",
        "spent",
        "held",
    )
    readonly_fields = (
        "prefix",
        "spent",
        "held",
        "period_start",
        "previous_prefix",
        "previous_valid_until",
    )
    search_fields = ("name", "prefix")
    filter_horizontal = ("pools",)

    # Amounts in dollars, as the spend page and the YAML show them (stored as micros).
    @admin.display(description="budget (USD)", ordering="budget_micros")
    def budget(self, key: GatewayKey) -> str:
        return "none" if key.budget_micros is None else usd(key.budget_micros)

    @admin.display(description="spent (USD)", ordering="spent_micros")
    def spent(self, key: GatewayKey) -> str:
        return usd(key.spent_micros)

    @admin.display(description="held by requests in flight (USD)", ordering="reserved_micros")
    def held(self, key: GatewayKey) -> str:
        return usd(key.reserved_micros)

    def get_form(self, request, obj=None, change=False, **kwargs):
        kwargs["form"] = GatewayKeyForm if request.user.is_superuser else GatewayKeyOperatorForm
        return super().get_form(request, obj, change, **kwargs)

    def get_fields(self, request, obj=None):
        # A view-only page shows the form's fields read from the key; the budget in dollars is a field of
        # the form only, which read from the key was "Budget usd: None" whatever the budget.
        fields = super().get_fields(request, obj)
        if self.has_change_permission(request, obj):
            return fields
        return ["budget" if name == "budget_usd" else name for name in fields]

    def get_readonly_fields(self, request, obj=None):
        return self.readonly_fields if request.user.is_superuser else (*self.readonly_fields, "pools")

    def has_add_permission(self, request) -> bool:
        # A key without pools reaches nothing, and only a superuser gives it pools.
        return request.user.is_superuser and super().has_add_permission(request)


class GatewayWideAdmin(admin.ModelAdmin):
    """Settings that route every pool's traffic (circuit and retry settings, model aliases and
    fallbacks): a pool operator may look, only a superuser changes them, since a change reaches pools
    that are not the operator's (SPEC §9, §11)."""

    def has_add_permission(self, request) -> bool:
        return request.user.is_superuser and super().has_add_permission(request)

    def has_change_permission(self, request, obj=None) -> bool:
        return request.user.is_superuser and super().has_change_permission(request, obj)

    def has_delete_permission(self, request, obj=None) -> bool:
        return request.user.is_superuser and super().has_delete_permission(request, obj)


@admin.register(GatewaySettings)
class GatewaySettingsAdmin(GatewayWideAdmin):
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
class ModelAliasAdmin(GatewayWideAdmin):
    list_display = ("alias", "canonical")
    search_fields = ("alias", "canonical")


@admin.register(ModelFallback)
class ModelFallbackAdmin(GatewayWideAdmin):
    list_display = ("requested", "served")
    search_fields = ("requested", "served")
