"""The YAML configuration's schema (SPEC §3), declared once.

Contract: each field of the file is one `Field` of a section below (the machinery is
`gatewayconfig.fields`): its YAML key, the model column it fills, how it is read and how it is dumped. A
column's limits (length, integer range, null), its choices and its default come from the model field's
`_meta`, so a migration that changes a column changes what the file accepts; only the policy the models do
not state (a minimum stricter than the column's, a number that is a fraction) is declared here. The loader
and the dumper both walk these sections (`read_fields`, `render_fields`), so they cannot drift apart. The
rules between fields (duplicates, references between sections, secrets) are `gatewayconfig.document`'s.
"""

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from django.contrib.auth.models import Group, User

from catalog.models import CatalogEntry
from gatewayconfig.checker import Checker
from gatewayconfig.fields import FRACTION, Block, Entry, Field, Kind, column, money, nullable, string
from pools.models import Adapter, Assignment, GatewayKey, GatewaySettings, Pool
from pools.scoping import OperatorAccess
from routing.policy.vocabulary import Router

NAME_MAX = Pool._meta.get_field("name").max_length
GROUP_NAME_MAX = Group._meta.get_field("name").max_length
USERNAME_MAX = User._meta.get_field("username").max_length
MODEL_MAX = CatalogEntry._meta.get_field("model").max_length
REGION_MAX = Assignment._meta.get_field("region").max_length
ENV_NAME_MAX = Assignment._meta.get_field("api_key_env").max_length
AUTO_MODEL = "auto"  # model="auto" is resolved by the router (SPEC §5.5), never a model name
# A verdict older than ten years is no evidence of today's route.
QUALIFICATION_DAYS_MAX = 3650


def _without_userinfo(url: str) -> str:
    """A base_url as the dump may print it: a row written before userinfo was refused (or around
    validation) keeps its credentials out of the output."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


UPSTREAM_ENV_NAME = Kind(
    lambda c, value, path: c.upstream_env_name(value, path, max_length=ENV_NAME_MAX),
    accepts="name of a variable starting with `GATEWAY_UPSTREAM_`",
)


def _router_default(values: Mapping[str, Any]) -> str:
    """`third_party` for an `openrouter` assignment, else `direct`"""
    # An OpenRouter endpoint is a third-party router whatever the file forgets to say: defaulting it to
    # `direct` would let it past a key that forbids third-party routers.
    return (Router.THIRD_PARTY if values.get("adapter") == Adapter.OPENROUTER else Router.DIRECT).value


def _settings(name: str, minimum: int | None = None, **policy: Any) -> Field:
    return column(GatewaySettings, name, always=True, minimum=minimum, **policy)


TOP_LEVEL: tuple[Entry, ...] = (
    Block(
        "circuit",
        (
            _settings(
                "failure_threshold",
                1,
                doc="Consecutive qualifying failures of an (assignment, model, route class) that open its "
                "circuit.",
            ),
            _settings(
                "cooldown_seconds",
                1,
                doc="How long a circuit first stays open; doubles after each failed probe.",
            ),
            _settings(
                "max_cooldown_seconds",
                1,
                doc="The longest a cooldown grows to (at least `cooldown_seconds`).",
            ),
            _settings(
                "half_open_probes",
                1,
                doc="Requests admitted at once, across all nodes, to a half-open circuit.",
            ),
            _settings(
                "probe_lease_seconds",
                1,
                doc="A probe older than this is presumed lost, and the next request may probe instead.",
            ),
            _settings(
                "demotion_seconds",
                doc="How long a demotion lasts when the upstream says nothing (a 429 without a readable "
                "`retry-after`, a model the account rejects); a demoted account goes after the healthy ones.",
            ),
            _settings(
                "headroom_floor",
                kind=FRACTION,
                doc="An account whose rate-limit headers report less than this share of a limit left is "
                "demoted until that limit resets (0 never demotes).",
            ),
        ),
        doc="When an account's circuit opens and how it recovers (circuits and demotions are shared by "
        "every node through the database).",
    ),
    Block(
        "retry",
        (
            _settings(
                "max_attempts", 1, doc="The shortlist: attempts per client request, all hops together."
            ),
            _settings(
                "backoff_base_ms",
                doc="Base of the full-jitter backoff between hops, spent inside the deadline.",
            ),
            _settings(
                "min_attempt_ms", doc="No attempt is dispatched with less of the request's deadline left."
            ),
            _settings(
                "default_deadline_ms",
                1,
                doc="The deadline of a request that sends no `x-gateway-deadline-ms` header (the official "
                "SDKs' own default timeout: long plain answers need it).",
            ),
        ),
        doc="How one client request is handed from account to account.",
    ),
    Field(
        "model_aliases",
        always=True,
        accepts="mapping of alias to model name",
        doc="Other names clients may use for a model (`gpt5: gpt-5`), resolved first; one hop, so a target "
        "may not itself be an alias.",
    ),
    Field(
        "model_fallbacks",
        always=True,
        accepts="mapping of model name to model name",
        doc="The model served instead when the requested one has no route in the key's pools, or when every "
        "account says it does not have it (`claude-opus-5: claude-opus-4-8`); one hop, checked against the "
        "key's `allowed_models`.",
    ),
    _settings(
        "model_fallback_family",
        doc="Without an explicit fallback, serve the highest configured version below the requested one in "
        "its name family (`gpt-5.2` to `gpt-5.1`).",
    ),
    _settings(
        "qualification_days",
        kind=Kind(
            lambda c, value, path: c.integer(value, path, minimum=1, maximum=QUALIFICATION_DAYS_MAX),
            accepts=f"integer from 1 to {QUALIFICATION_DAYS_MAX}",
        ),
        doc="How long a verdict of `manage.py qualify` stays valid.",
    ),
    Field("pools", always=True, accepts="list of pools", doc="The pools of upstream accounts (`pools[]`)."),
    Field("keys", always=True, accepts="list of keys", doc="The gateway keys clients call with (`keys[]`)."),
    Field(
        "operators",
        accepts="list of operator groups",
        doc="Who operates which pools in the admin (`operators[]`): Django groups, their pools, what they "
        "may do there and who is in them. A group not named here is left as it is (with `--prune`, a group "
        "not named here operates no pool).",
    ),
)

# The `GatewaySettings` columns: the top level's blocks and scalars that are not sections of their own.
SETTINGS: tuple[Entry, ...] = tuple(e for e in TOP_LEVEL if isinstance(e, Block) or e.kind is not None)

POOL: tuple[Entry, ...] = (
    column(Pool, "name", always=True, required=True, doc="Unique; keys name it in their `pools`."),
    Field(
        "auto_models",
        string(MODEL_MAX, what="model"),
        default=(),
        always=True,
        doc='Candidates for `model: "auto"`, in order of preference.',
    ),
    Field(
        "assignments",
        always=True,
        accepts="list of assignments",
        doc="The pool's upstream accounts (`pools[].assignments[]`).",
    ),
)


def _a(name: str, **policy: Any) -> Field:
    return column(Assignment, name, **policy)


ASSIGNMENT: tuple[Entry, ...] = (
    _a(
        "name",
        always=True,
        required=True,
        doc="Unique across every pool: the name admin, logs and metrics show.",
    ),
    _a(
        "adapter",
        always=True,
        required=True,
        doc="The provider API the account speaks (README, *Configuration*).",
    ),
    _a(
        "base_url",
        always=True,
        required=True,
        kind=Kind(
            lambda c, value, path: c.base_url(
                value, path, max_length=Assignment._meta.get_field("base_url").max_length
            ),
            _without_userinfo,
            "http(s) URL without credentials, query or fragment, never a link-local or metadata address",
        ),
        doc="The API root including its version path (`https://api.openai.com/v1`); the adapter appends "
        "each operation's path.",
    ),
    _a(
        "api_key_env",
        kind=UPSTREAM_ENV_NAME,
        doc="The credential is read from this variable at each use (never stored).",
    ),
    # Read once at load and stored encrypted (GatewayConfig.credentials); never a column, never dumped.
    Field(
        "api_key_from_env",
        accepts=UPSTREAM_ENV_NAME.accepts,
        doc="The credential is read from this variable once, at load time, and stored encrypted with "
        "`GATEWAY_CREDENTIALS_KEY` (not with `api_key_env`).",
    ),
    _a("tier", always=True, doc="Lower is preferred, after health."),
    _a(
        "weight",
        always=True,
        minimum=1,
        doc="The account's share of first attempts among healthy accounts of the same tier.",
    ),
    _a("region", doc="Where the account serves; a key with `requirements.regions` needs one of them."),
    _a(
        "router",
        always=True,
        default=_router_default,
        doc="`third_party`: a router in front of other providers, which a key may refuse.",
    ),
    Block(
        "privacy",
        (
            _a("zero_retention", doc="The provider keeps no prompt or answer."),
            _a(
                "data_collection",
                doc="Whether the provider may collect what it is sent; a key requiring zero retention needs "
                "`zero_retention: true` and `deny`.",
            ),
        ),
        doc="What the provider promises; undeclared is unknown, never read as true or false.",
    ),
    Block(
        "capabilities",
        (
            _a("tools", doc="Function calling; a request offering tools needs `true`."),
            _a(
                "write_tools", doc="Tools that change things; a request needing them also needs native tools."
            ),
            _a("vision", doc="Image inputs."),
            _a(
                "role_separation",
                doc="The system prompt and tool results stay in their own roles (needed with tools or "
                "untrusted content).",
            ),
            _a("tool_representation", doc="`native` tool calls, or `emulated` in text."),
            _a(
                "stream_options",
                doc="`openai_compatible` only: `true` asks each stream for its usage, `false` never sends "
                "`stream_options`.",
            ),
        ),
        doc="Declared capabilities (a newer `manage.py qualify` verdict wins); undeclared is unknown, which "
        "meets no requirement.",
    ),
    _a(
        "quality",
        kind=Kind(nullable(Checker.fraction), accepts="number from 0 to 1, or `null`"),
        doc="Compared with a key's `requirements.min_quality`; `null`: unknown.",
    ),
    _a(
        "headroom_floor",
        kind=Kind(nullable(Checker.fraction), accepts="number from 0 to 1, or `null`"),
        doc="This account's `circuit.headroom_floor`; `null`: the gateway-wide one.",
    ),
    _a(
        "min_deadline_ms",
        always=True,
        doc="The account is not tried with less of the request's deadline left.",
    ),
    _a("discovery", always=True, doc="`manage.py sync_catalog` asks the provider's model listing."),
    _a("enabled", doc="`false`: never routed to (`manage.py qualify --assignment` still qualifies it)."),
    Field(
        "models",
        accepts="list of models",
        doc="Configured catalog entries (`pools[].assignments[].models[]`); discovery may add more.",
    ),
)

MODEL: tuple[Entry, ...] = (
    column(
        CatalogEntry, "model", key="id", always=True, required=True, doc="The model id the upstream knows."
    ),
    column(
        CatalogEntry,
        "context_window",
        minimum=1,
        doc="Tokens the model takes (prompt and output); `null`: unknown, every request fits.",
    ),
    column(
        CatalogEntry,
        "max_output_tokens",
        minimum=1,
        doc="The most tokens the model answers with: what a key's budget reserves for a request that sets "
        "no `max_tokens` (`null`: unknown, 32,768 are reserved).",
    ),
    Block(
        "capabilities",
        (
            column(CatalogEntry, "tools", doc="Function calling on this model."),
            column(CatalogEntry, "vision", doc="Image inputs on this model."),
        ),
        doc="This model's own capabilities on this account.",
    ),
    Block(
        "price",
        (
            # Dollars per million tokens; the `*_per_mtok_micros` names are still read.
            money(
                CatalogEntry,
                "input_per_mtok_micros",
                key="input_usd",
                doc="Per million input tokens.",
            ),
            money(CatalogEntry, "output_per_mtok_micros", key="output_usd", doc="Per million output tokens."),
            money(
                CatalogEntry,
                "cached_input_per_mtok_micros",
                key="cached_input_usd",
                doc="Per million input tokens read from the prompt cache; `null`: the input price.",
            ),
            money(
                CatalogEntry,
                "cache_write_per_mtok_micros",
                key="cache_write_usd",
                doc="Per million input tokens written to the prompt cache; `null`: the input price.",
            ),
        ),
        doc="Dollars per million tokens; `null`: unknown, never zero. A model without `price` takes its "
        "list price from the bundled `catalog/prices.yaml`, else unknown; a configured price never borrows "
        "from it.",
    ),
)


def _k(name: str, **policy: Any) -> Field:
    return column(GatewayKey, name, **policy)


KEY: tuple[Entry, ...] = (
    _k("name", always=True, required=True, doc="Unique; the name admin, logs and metrics show."),
    Field(
        "key",
        accepts="string of at least 20 characters, no whitespace",
        doc="The secret clients send (stored only as a hash); creates the key, and replaces an existing "
        "key's secret only with `load_gateway_config --replace-secrets`. Required for a new key, unless "
        "`key_env`.",
    ),
    Field(
        "key_env",
        accepts="name of an environment variable",
        doc="The secret is read from this variable at load time instead (as `key`).",
    ),
    Field(
        "pools",
        always=True,
        accepts="list of pool names",
        doc="The pools whose accounts serve this key. Required.",
    ),
    # A key without an allow-list may use every model of its pools, as create_key and admin give it.
    _k(
        "allowed_models",
        always=True,
        kind=string(MODEL_MAX, what="model"),
        default=("*",),
        doc='The models the key may use; `["*"]`: every model of its pools.',
    ),
    Block(
        "requirements",
        (
            _k(
                "require_zero_retention",
                key="zero_retention",
                always=True,
                doc="Only accounts with `privacy.zero_retention: true` and `data_collection: deny`.",
            ),
            _k(
                "regions",
                always=True,
                kind=string(REGION_MAX, what="region"),
                default=(),
                doc="Only accounts in these regions; empty: any.",
            ),
            _k(
                "allow_third_party_router", always=True, doc="`false`: never a `router: third_party` account."
            ),
            _k(
                "min_quality",
                always=True,
                kind=FRACTION,
                doc="Only accounts whose `quality` is known and at least this; 0: no requirement.",
            ),
        ),
        doc="Conditions every account must meet to serve the key (eligibility, never a preference).",
    ),
    money(
        GatewayKey,
        "budget_micros",
        key="budget_usd",
        always=True,
        doc="Spend allowed per `budget_period`, reserved before each request; `null`: no budget. Over "
        "it: 429 `budget_exceeded`.",
    ),  # `budget_micros` still read
    _k(
        "budget_period",
        always=True,
        doc="The budget restarts each UTC day, week (Monday) or month; `null`: lifetime.",
    ),
    _k("enabled", doc="`false`: the key is refused (401)."),
    _k("expires_at", doc="From then on the key is refused (401); `null`: never."),
    Block(
        "limits",
        (
            # Zero is refused: `enabled: false` stops a key.
            _k("limit_rpm", key="rpm", minimum=1, doc="Requests admitted per UTC clock minute."),
            _k(
                "limit_tpm",
                key="tpm",
                minimum=1,
                doc="Tokens (input and output) per UTC clock minute; once reached, new requests are "
                "refused until the next minute.",
            ),
            _k(
                "limit_concurrent",
                key="concurrent",
                minimum=1,
                doc="Requests in flight at once, across all nodes.",
            ),
        ),
        whole=True,
        nullable=True,
        doc="Per-key limits across every node (in Redis with `REDIS_URL`, else the database); `null`: none. "
        "Over one: 429 `rate_limit_exceeded`.",
    ),
)


ACCESS = Kind(
    nullable(lambda c, value, path: c.choice(value, path, [level.value for level in OperatorAccess])),
    accepts=f"{' or '.join(level.value for level in OperatorAccess)}, or null",
)
USERNAMES = Kind(
    nullable(lambda c, value, path: c.strings(value, path, max_length=USERNAME_MAX, what="user")),
    lambda names: None if names is None else list(names),
    "list of distinct user names (existing admin users), or null",
)

OPERATOR: tuple[Entry, ...] = (
    Field(
        "group",
        string(GROUP_NAME_MAX),
        always=True,
        doc="A Django group's name (created when it does not exist); its staff see the pools below in "
        "the admin, and only them.",
    ),
    Field(
        "pools",
        string(NAME_MAX, what="pool"),
        default=(),
        always=True,
        doc="The pools the group operates: exactly these (a pool it operated before and not listed here is "
        "taken away, with a warning).",
    ),
    Field(
        "access",
        ACCESS,
        default=None,
        doc="`view`: its staff may look at everything of these pools (assignments, keys, catalog, circuits, "
        "requests, spend); `change`: also change their pools, assignments, keys and catalog entries (never "
        "a base URL, a credential, a key's secret or its pools: a superuser's). Sets the group's admin "
        "permissions to exactly that; `null`: its permissions are left as they are.",
    ),
    Field(
        "users",
        USERNAMES,
        default=None,
        doc="The group's members: exactly these existing users (one removed is a warning); `null`: its "
        "members are left as they are. Users and their passwords are made in the admin or with "
        "`manage.py createsuperuser`, never in this file.",
    ),
)
