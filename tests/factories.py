"""factory-boy factories for the ORM. Defaults are minimal and valid; every capability, privacy value
and price stays at its model default (unknown) unless a test declares it."""

from datetime import timedelta

import factory
from django.utils import timezone
from factory.django import DjangoModelFactory

from catalog.models import CatalogEntry, Provenance
from pools.models import KEY_PREFIX_LENGTH, Adapter, Assignment, GatewayKey, Pool, hash_key
from routing.models import Circuit


class PoolFactory(DjangoModelFactory):
    class Meta:
        model = Pool
        django_get_or_create = ("name",)

    name = factory.Sequence(lambda n: f"pool-{n}")
    auto_models = factory.LazyFunction(list)


class AssignmentFactory(DjangoModelFactory):
    class Meta:
        model = Assignment

    pool = factory.SubFactory(PoolFactory)
    name = factory.Sequence(lambda n: f"assignment-{n}")
    adapter = Adapter.OPENAI
    base_url = factory.Sequence(lambda n: f"http://127.0.0.1:{19000 + n}/v1")
    api_key_env = ""


class GatewayKeyFactory(DjangoModelFactory):
    """`GatewayKeyFactory(raw_key="sk-...", pools=[pool])`; the raw key is only hashed, as in production."""

    class Meta:
        model = GatewayKey
        skip_postgeneration_save = True

    class Params:
        raw_key = factory.Sequence(lambda n: f"sk-gw-test-{n:06d}-0123456789abcdef")

    name = factory.Sequence(lambda n: f"key-{n}")
    key_hash = factory.LazyAttribute(lambda o: hash_key(o.raw_key))
    prefix = factory.LazyAttribute(lambda o: o.raw_key[:KEY_PREFIX_LENGTH])
    allowed_models = factory.LazyFunction(lambda: ["*"])

    @factory.post_generation
    def pools(self, create, extracted, **kwargs):
        if create and extracted:
            self.pools.set(extracted)


class CatalogEntryFactory(DjangoModelFactory):
    class Meta:
        model = CatalogEntry

    assignment = factory.SubFactory(AssignmentFactory)
    model = factory.Sequence(lambda n: f"model-{n}")
    provenance = Provenance.CONFIGURED


class OpenCircuitFactory(DjangoModelFactory):
    """A circuit open for the next five minutes on an assignment's model (HTTP route class)."""

    class Meta:
        model = Circuit

    assignment = factory.SubFactory(AssignmentFactory)
    pool = factory.SelfAttribute("assignment.pool")
    model = "gpt-5"
    route_class = "http"
    state = "open"
    reason = "upstream_model_unavailable"
    open_until = factory.LazyFunction(lambda: timezone.now() + timedelta(minutes=5))


def reserve(exchange, key_id: int, amount: int):
    """`exchange` holds `amount` of the key's budget, reserved as the relay reserves it (the key's
    `reserved_micros` and the request's hold, pools.BudgetHold). Returns the exchange."""
    from datetime import UTC, datetime

    from pools.services import key_budget_reserve

    now = datetime.now(UTC)
    assert key_budget_reserve(
        key_id=key_id, request_id=exchange.request_id, amount=amount, period=exchange.budget_period, now=now
    )
    exchange.key_id, exchange.reserving = key_id, True
    exchange.reserved_micros += amount
    return exchange


def finished_exchange(key_id: int | None = None, **fields):
    """A finished Chat Completions request as the ledger is handed it (proxy.ledger.exchange.Exchange):
    answered
    200 `ok`, a fresh request id, `fields` on top."""
    import uuid
    from datetime import UTC, datetime

    from proxy.ledger.exchange import Exchange

    now = datetime.now(UTC)
    base = {
        "request_id": uuid.uuid4().hex,
        "key_id": key_id,
        "route": "/v1/chat/completions",
        "transport": "http",
        "requested_model": "gpt-5",
        "started_at": now,
        "outcome": "ok",
        "status_code": 200,
        "finished_at": now,
    }
    return Exchange(**{**base, **fields})
