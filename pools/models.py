"""Pools of upstream assignments, gateway keys, and the gateway-wide routing settings (SPEC §3)."""

import enum
import hashlib
import secrets
from collections.abc import Iterable
from datetime import datetime

from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import Q

from pools import credentials, destinations
from routing.policy.headroom import DEFAULT_FLOOR
from routing.policy.vocabulary import BudgetPeriod, DataCollection, Router, ToolRepresentation, TriState


def choices(vocabulary: type[enum.StrEnum], **labels: str) -> list[tuple[str, str]]:
    """A model field's `choices` from a vocabulary of `routing.policy.vocabulary`, declared once there. The
    label of a member is the one `TextChoices` would give it (`HALF_OPEN` -> "Half Open") unless
    `labels` names it, so the migrations' recorded choices stay as they were."""
    return [
        (member.value, labels.get(member.name, member.name.replace("_", " ").title()))
        for member in vocabulary
    ]


def values(vocabulary: Iterable[str]) -> list[str]:
    return [str(member) for member in vocabulary]


def share_validators() -> list:
    return [MinValueValidator(0.0), MaxValueValidator(1.0)]


def tri_state_field(**kwargs) -> models.CharField:
    return models.CharField(max_length=7, choices=choices(TriState), default=TriState.UNKNOWN.value, **kwargs)


def tri_state_check(model: str, field: str) -> models.CheckConstraint:
    return models.CheckConstraint(
        condition=Q(**{f"{field}__in": values(TriState)}), name=f"{model}_{field}_tristate"
    )


def choices_check(model: str, field: str, vocabulary: Iterable[str]) -> models.CheckConstraint:
    return models.CheckConstraint(
        condition=Q(**{f"{field}__in": values(vocabulary)}), name=f"{model}_{field}_valid"
    )


class Adapter(models.TextChoices):
    OPENAI = "openai"
    ANTHROPIC = "anthropic"
    OPENROUTER = "openrouter"
    AZURE_OPENAI = "azure_openai"
    OPENAI_COMPATIBLE = "openai_compatible"
    GEMINI = "gemini"
    BEDROCK = "bedrock"
    VERTEX = "vertex"


class GatewaySettings(models.Model):
    """The singleton of circuit, retry and fallback settings (`circuit:`, `retry:` and
    `model_fallback_family` in the YAML file). Always row 1."""

    failure_threshold = models.PositiveIntegerField(default=3)
    cooldown_seconds = models.PositiveIntegerField(default=60)
    max_cooldown_seconds = models.PositiveIntegerField(default=600)
    half_open_probes = models.PositiveIntegerField(default=1)
    probe_lease_seconds = models.PositiveIntegerField(default=60)
    demotion_seconds = models.PositiveIntegerField(default=60)
    headroom_floor = models.FloatField(
        default=DEFAULT_FLOOR,
        validators=share_validators(),
        help_text="An account whose rate-limit headers report less than this share of a limit left is "
        "demoted until that limit resets (0 to 1; 0 never demotes).",
    )
    max_attempts = models.PositiveIntegerField(default=4)
    backoff_base_ms = models.PositiveIntegerField(default=50)
    min_attempt_ms = models.PositiveIntegerField(
        default=100, help_text="No attempt is dispatched with less of the deadline left."
    )
    # The official SDKs' own default timeout: long plain answers of reasoning models need it.
    default_deadline_ms = models.PositiveIntegerField(default=600000)
    model_fallback_family = models.BooleanField(default=True)
    qualification_days = models.PositiveIntegerField(
        default=30, help_text="How long a verdict of manage.py qualify stays valid."
    )

    class Meta:
        verbose_name = "gateway settings"
        verbose_name_plural = "gateway settings"
        constraints = [
            models.CheckConstraint(condition=Q(pk=1), name="gatewaysettings_singleton"),
            models.CheckConstraint(
                condition=Q(failure_threshold__gte=1), name="gatewaysettings_threshold_min"
            ),
            models.CheckConstraint(condition=Q(half_open_probes__gte=1), name="gatewaysettings_probes_min"),
            models.CheckConstraint(condition=Q(max_attempts__gte=1), name="gatewaysettings_attempts_min"),
            models.CheckConstraint(
                condition=Q(qualification_days__gte=1), name="gatewaysettings_qualification_days_min"
            ),
            models.CheckConstraint(
                condition=Q(max_cooldown_seconds__gte=models.F("cooldown_seconds")),
                name="gatewaysettings_cooldown_bounded",
            ),
            models.CheckConstraint(
                condition=Q(headroom_floor__gte=0, headroom_floor__lte=1),
                name="gatewaysettings_headroom_floor_range",
            ),
        ]

    def __str__(self) -> str:
        return "gateway settings"

    def save(self, *args, **kwargs):
        self.pk = 1
        super().save(*args, **kwargs)

    @classmethod
    def load(cls) -> "GatewaySettings":
        obj, _ = cls.objects.get_or_create(pk=1)
        return obj


class ConfigVersion(models.Model):
    """A counter that moves with every change to what routing caches per process (pools,
    assignments, catalog, aliases, fallbacks, settings). Database triggers move it (migration
    pools/0004), so no write path can forget to: admin, load_gateway_config, catalog sync, bulk
    updates and raw SQL alike. Each request reads it with its key, so every node sees a change on
    its next request."""

    value = models.BigIntegerField(default=0)

    class Meta:
        constraints = [models.CheckConstraint(condition=Q(pk=1), name="configversion_singleton")]

    def __str__(self) -> str:
        return f"config version {self.value}"


class ModelAlias(models.Model):
    """`model_aliases`: alias -> canonical model, one hop."""

    alias = models.CharField(max_length=200, unique=True)
    canonical = models.CharField(max_length=200)

    class Meta:
        verbose_name_plural = "model aliases"
        ordering = ["alias"]
        constraints = [
            models.CheckConstraint(condition=~Q(alias=models.F("canonical")), name="modelalias_not_self"),
        ]

    def __str__(self) -> str:
        return f"{self.alias} -> {self.canonical}"


class ModelFallback(models.Model):
    """`model_fallbacks`: requested -> served model, one hop."""

    requested = models.CharField(max_length=200, unique=True)
    served = models.CharField(max_length=200)

    class Meta:
        ordering = ["requested"]
        constraints = [
            models.CheckConstraint(condition=~Q(requested=models.F("served")), name="modelfallback_not_self"),
        ]

    def __str__(self) -> str:
        return f"{self.requested} -> {self.served}"


class Pool(models.Model):
    """A set of assignments that keys are granted.

    Operator access is granted per pool to auth groups (`operator_groups`), not to single users: a team's
    group carries both the model permission (`pools.view_assignment`) and its pools, so on-call rotations
    change group membership, never pool rows. Superusers see every pool (`pools.selectors.pools_visible_to`).
    """

    name = models.CharField(max_length=100, unique=True)
    auto_models = models.JSONField(default=list, blank=True, help_text="Candidates for model=auto, in order.")
    operator_groups = models.ManyToManyField(
        "auth.Group",
        blank=True,
        related_name="operated_pools",
        help_text="Groups whose staff see this pool in the admin (with the view permission on assignments).",
    )

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


def validate_env_name(name: str) -> None:
    if name and not credentials.env_name_allowed(name):
        raise ValidationError(
            f"Only a variable whose name starts with {credentials.ENV_PREFIX} may be named here.",
            code="env_name_forbidden",
        )


def validate_base_url(url: str) -> None:
    problem = destinations.base_url_problem(url)
    if problem is not None:
        raise ValidationError(f"The base URL {problem}.", code="base_url_forbidden")


class HttpsURLField(models.URLField):
    """A URL field whose forms (admin's change form, the pool's inline) take a URL typed without a
    scheme ("api.openai.com/v1") as https, where Django 5 assumes http: the upstream credential would
    go to a public provider in plaintext. The same column as Django's URLField (no migration)."""

    def formfield(self, **kwargs):
        return super().formfield(**{"assume_scheme": "https", **kwargs})

    def deconstruct(self):
        name, _path, args, kwargs = super().deconstruct()
        return name, "django.db.models.URLField", args, kwargs


class Assignment(models.Model):
    """One upstream credential on one provider endpoint. The credential is either stored encrypted
    (`credential`, a Fernet token, with `credential_hint` its last 4 characters) or read at each use
    from the `GATEWAY_UPSTREAM_*` variable `api_key_env` names (`pools.credentials`)."""

    pool = models.ForeignKey(Pool, on_delete=models.CASCADE, related_name="assignments")
    name = models.CharField(max_length=100, unique=True)
    adapter = models.CharField(max_length=20, choices=Adapter.choices)
    base_url = HttpsURLField(max_length=500, validators=[validate_base_url])
    api_key_env = models.CharField(
        max_length=200,
        blank=True,
        validators=[validate_env_name],
        help_text=f"Read at each use; only names starting with {credentials.ENV_PREFIX}.",
    )
    credential = models.TextField(blank=True, editable=False, help_text="Encrypted; never shown.")
    credential_hint = models.CharField(max_length=credentials.HINT_LENGTH, blank=True, editable=False)
    tier = models.IntegerField(default=0, help_text="Lower is preferred.")
    weight = models.PositiveIntegerField(default=1)
    region = models.CharField(max_length=50, blank=True)
    router = models.CharField(max_length=20, choices=choices(Router), default=Router.DIRECT.value)
    zero_retention = tri_state_field()
    data_collection = models.CharField(
        max_length=7, choices=choices(DataCollection), default=DataCollection.UNKNOWN.value
    )
    tools = tri_state_field()
    write_tools = tri_state_field()
    vision = tri_state_field()
    role_separation = tri_state_field()
    tool_representation = models.CharField(
        max_length=8, choices=choices(ToolRepresentation), default=ToolRepresentation.UNKNOWN.value
    )
    # Whether the server accepts Chat's `stream_options` (openai_compatible: the gateway asks a stream for
    # its usage only when true, and sends none at all when false).
    stream_options = tri_state_field(
        help_text="openai_compatible: true asks each stream for its usage; false never sends stream_options."
    )
    quality = models.FloatField(null=True, blank=True, help_text="Empty: unknown.")
    min_deadline_ms = models.PositiveIntegerField(default=0)
    headroom_floor = models.FloatField(
        null=True,
        blank=True,
        validators=share_validators(),
        help_text="Empty: the gateway-wide headroom floor.",
    )
    discovery = models.BooleanField(
        default=False,
        help_text="sync_catalog asks the provider's model listing: GET {base_url}/models, or Azure's "
        "deployments, Gemini's paged models, Bedrock's foundation models (README).",
    )
    enabled = models.BooleanField(default=True)

    class Meta:
        ordering = ["pool__name", "tier", "name"]
        constraints = [
            choices_check("assignment", "adapter", Adapter),
            choices_check("assignment", "router", Router),
            choices_check("assignment", "data_collection", DataCollection),
            choices_check("assignment", "tool_representation", ToolRepresentation),
            *[
                tri_state_check("assignment", f)
                for f in (
                    "zero_retention",
                    "tools",
                    "write_tools",
                    "vision",
                    "role_separation",
                    "stream_options",
                )
            ],
            models.CheckConstraint(
                condition=Q(quality__isnull=True) | Q(quality__gte=0, quality__lte=1),
                name="assignment_quality_range",
            ),
            models.CheckConstraint(
                condition=Q(headroom_floor__isnull=True) | Q(headroom_floor__gte=0, headroom_floor__lte=1),
                name="assignment_headroom_floor_range",
            ),
        ]

    def __str__(self) -> str:
        return self.name

    def set_credential(self, plain: str) -> None:
        """Store `plain` encrypted (raises CredentialKeyMissing without GATEWAY_CREDENTIALS_KEY)."""
        self.credential = credentials.credential_encrypt(plain)
        self.credential_hint = credentials.credential_hint(plain)

    def clear_credential(self) -> None:
        self.credential = self.credential_hint = ""


def hash_key(raw: str) -> str:
    """Gateway keys are high-entropy secrets, so one SHA-256 is enough to keep them irreversible at
    rest while keeping the per-request lookup a single indexed equality."""
    return hashlib.sha256(raw.encode()).hexdigest()


KEY_PREFIX_LENGTH = 10
# Twice the visible prefix, so the prefix shown in admin never gives away most of a key.
MIN_KEY_LENGTH = 20


class GatewayKey(models.Model):
    """A client credential. Only its SHA-256 and a short visible prefix are stored."""

    name = models.CharField(max_length=100, unique=True)
    key_hash = models.CharField(max_length=64, unique=True, editable=False)
    prefix = models.CharField(max_length=KEY_PREFIX_LENGTH, editable=False)
    pools = models.ManyToManyField(Pool, related_name="keys")
    allowed_models = models.JSONField(default=list, help_text='["*"] or an explicit list of models.')
    require_zero_retention = models.BooleanField(default=False)
    regions = models.JSONField(default=list, blank=True, help_text="Allowed regions; empty: any.")
    allow_third_party_router = models.BooleanField(default=True)
    min_quality = models.FloatField(default=0)
    budget_micros = models.BigIntegerField(null=True, blank=True, help_text="Empty: no budget.")
    budget_period = models.CharField(
        max_length=5,
        choices=choices(BudgetPeriod),
        blank=True,
        help_text="The budget resets each UTC day, week (Monday) or month; empty: a lifetime budget.",
    )
    spent_micros = models.BigIntegerField(default=0, editable=False)
    # Held by requests in flight (SPEC §7.4): admitted by one conditional UPDATE, settled by the ledger.
    reserved_micros = models.BigIntegerField(default=0, editable=False)
    period_start = models.DateTimeField(
        null=True, blank=True, editable=False, help_text="Start of the period `spent_micros` counts."
    )
    enabled = models.BooleanField(default=True)
    expires_at = models.DateTimeField(
        null=True, blank=True, help_text="Empty: never. From then on the key is refused (401)."
    )
    # YAML `limits: {rpm, tpm, concurrent}`, enforced across nodes (proxy.limits); empty: no limit.
    limit_rpm = models.PositiveIntegerField(
        "requests per minute",
        null=True,
        blank=True,
        validators=[MinValueValidator(1)],
        help_text="Requests per UTC clock minute; empty: no limit. Over it: 429 rate_limit_exceeded.",
    )
    limit_tpm = models.PositiveIntegerField(
        "tokens per minute",
        null=True,
        blank=True,
        validators=[MinValueValidator(1)],
        help_text="Tokens (input + output) per UTC clock minute; a request is refused once the "
        "minute's tokens reach it. Empty: no limit.",
    )
    limit_concurrent = models.PositiveIntegerField(
        "concurrent requests",
        null=True,
        blank=True,
        validators=[MinValueValidator(1)],
        help_text="Requests in flight at once, across all nodes; empty: no limit.",
    )
    # A rotation with an overlap (`manage.py rotate_key --overlap`): the replaced secret stays valid
    # until `previous_valid_until`, so clients can move to the new one without an outage.
    previous_key_hash = models.CharField(max_length=64, unique=True, null=True, blank=True, editable=False)
    previous_prefix = models.CharField(max_length=KEY_PREFIX_LENGTH, blank=True, editable=False)
    previous_valid_until = models.DateTimeField(null=True, blank=True, editable=False)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(
                condition=Q(budget_micros__isnull=True) | Q(budget_micros__gte=0),
                name="gatewaykey_budget_nonneg",
            ),
            models.CheckConstraint(condition=Q(spent_micros__gte=0), name="gatewaykey_spent_nonneg"),
            models.CheckConstraint(condition=Q(reserved_micros__gte=0), name="gatewaykey_reserved_nonneg"),
            models.CheckConstraint(
                condition=Q(budget_period__in=["", *values(BudgetPeriod)]),
                name="gatewaykey_budget_period_valid",
            ),
            *(
                models.CheckConstraint(
                    condition=Q(**{f"{name}__isnull": True}) | Q(**{f"{name}__gte": 1}),
                    name=f"gatewaykey_{name}_positive",
                )
                for name in ("limit_rpm", "limit_tpm", "limit_concurrent")
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    def set_key(self, raw: str) -> None:
        if len(raw) < MIN_KEY_LENGTH:
            raise ValueError(f"a gateway key needs at least {MIN_KEY_LENGTH} characters")
        self.key_hash = hash_key(raw)
        self.prefix = raw[:KEY_PREFIX_LENGTH]

    def rotate(self, raw: str, *, valid_until: datetime | None) -> None:
        """Replace the secret; the replaced one stays valid until `valid_until` (None: not at all).
        A secret replaced earlier, still in its own overlap, is cut off: one overlap at a time."""
        if valid_until is None:
            self.previous_key_hash, self.previous_prefix, self.previous_valid_until = None, "", None
        else:
            self.previous_key_hash, self.previous_prefix = self.key_hash, self.prefix
            self.previous_valid_until = valid_until
        self.set_key(raw)


def new_key_secret() -> str:
    """A generated gateway key: `sk-gw-` and 256 bits from the OS's CSPRNG."""
    return "sk-gw-" + secrets.token_urlsafe(32)


class KeyLimitWindow(models.Model):
    """One UTC clock minute of a key's `limits.rpm`/`limits.tpm` (proxy.limits, without REDIS_URL):
    requests admitted in it and tokens reported by the requests that ended in it. Written only with
    single conditional upserts, so every node counts against the same row."""

    key = models.ForeignKey(GatewayKey, on_delete=models.CASCADE, related_name="+")
    minute = models.BigIntegerField(help_text="Minutes since the Unix epoch (UTC).")
    requests = models.PositiveIntegerField(default=0)
    tokens = models.BigIntegerField(default=0)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["key", "minute"], name="keylimitwindow_unique")]

    def __str__(self) -> str:
        return f"key {self.key_id} minute {self.minute}"


class KeyLimitSlot(models.Model):
    """One of a key's `limits.concurrent` slots, held by one request in flight until `expires_at`
    (a lease its node renews while the request runs; a crashed node's lease simply runs out)."""

    key = models.ForeignKey(GatewayKey, on_delete=models.CASCADE, related_name="+")
    slot = models.PositiveIntegerField()
    lease = models.CharField(max_length=32)
    expires_at = models.DateTimeField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["key", "slot"], name="keylimitslot_unique")]

    def __str__(self) -> str:
        return f"key {self.key_id} slot {self.slot}"


class BudgetHold(models.Model):
    """What one request in flight holds of its key's budget (SPEC §7.4): written in the same statement
    as the reservation that adds it to `GatewayKey.reserved_micros`, deleted by the statement that
    settles it (the request's ledger record, `proxy.ledger.services.exchanges_settle`). So what is settled is
    what the database holds for the request, whatever its process believed: a reservation that
    committed while its process died or lost its connection is settled once, one that never
    committed is never released (issue 21)."""

    request_id = models.CharField(max_length=64, primary_key=True)
    key = models.ForeignKey(GatewayKey, on_delete=models.CASCADE, related_name="+")
    micros = models.BigIntegerField()
    created_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"request {self.request_id}: {self.micros} micros of key {self.key_id}"
