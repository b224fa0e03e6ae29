import math
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from functools import partial

from django.conf import settings as site_settings
from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from catalog.selectors import capabilities_explained, provenance_text
from pools.selectors import key_by_name
from proxy.wire.apis.registry import RELAYED
from proxy.wire.providers.registry import carriers
from routing.affinities import affinities_load, session_named
from routing.models import Demotion
from routing.policy import preference
from routing.policy.breaker import CircuitSnapshot, governing
from routing.policy.eligibility import tighten
from routing.policy.latency import PLACEMENT_LOAD
from routing.policy.panel import reason_text
from routing.policy.pricing import price_text
from routing.policy.route import (
    Decision,
    RequirementsHeaderError,
    decide,
    lease_candidate,
    parse_requirements_header,
)
from routing.policy.types import Candidate, CircuitState, Health, Requirements, RouteClass
from routing.policy.vocabulary import ClientRoute
from routing.selectors import pool_names, routing_inputs_load


def when(moment: datetime, now: datetime) -> str:
    """A time as an on-call reads it: UTC to the second, and how far it is from now."""
    seconds = (moment - now).total_seconds()
    relative = f"in {math.ceil(seconds)} s" if seconds > 0 else f"{math.floor(-seconds)} s ago"
    return f"{moment.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC ({relative})"


def circuit_text(snapshot: CircuitSnapshot, *, wide: bool, now: datetime) -> str:
    """Why a circuit is not clean and until when ("" for a clean one): its reason, when it stops
    cooling, who holds its probe and until when."""
    what = "credential circuit (every model and route class)" if wide else "circuit"
    reason = reason_text(snapshot.reason) if snapshot.reason else "no reason recorded"
    if snapshot.state is CircuitState.OPEN:
        if snapshot.open_until is not None and now < snapshot.open_until:
            return f"{what} open ({reason}) until {when(snapshot.open_until, now)}"
        cooled = f" since {when(snapshot.open_until, now)}" if snapshot.open_until is not None else ""
        return f"{what} open ({reason}), its cooldown over{cooled}: admits one probe"
    if snapshot.state is CircuitState.HALF_OPEN:
        lease = snapshot.probe_lease_expires_at
        if snapshot.probes_in_flight and lease is not None and now < lease:
            return (
                f"{what} half-open ({reason}): its probe is held by another request until {when(lease, now)}"
            )
        return f"{what} half-open ({reason}): admits one probe"
    if snapshot.consecutive_failures:
        failures = snapshot.consecutive_failures
        return f"{what} closed, {failures} consecutive failure{'' if failures == 1 else 's'} ({reason})"
    return ""


@dataclass(frozen=True, slots=True)
class States:
    """What explains each candidate's health and demotion: the circuits the router read, the live
    demotions (reason, until) and the time of the reading."""

    circuits: dict[tuple[int, str], CircuitSnapshot]
    wide: dict[int, CircuitSnapshot]
    demotions: dict[tuple[int, str], tuple[str, datetime]]
    now: datetime

    def text(self, c: Candidate) -> str:
        snapshot, wide = governing(self.circuits.get(c.key), self.wide.get(c.assignment_id))
        parts = [circuit_text(snapshot, wide=wide, now=self.now)] if snapshot is not None else []
        if c.key in self.demotions:
            reason, until = self.demotions[c.key]
            parts.append(f"demoted ({reason_text(reason)}) until {when(until, self.now)}")
        return "; ".join(part for part in parts if part)


class Command(BaseCommand):
    help = (
        "Print the plan the router would build now for a key and a model: every candidate, eligible "
        "or not and why, in dispatch order. Reads only; calls the same functions as the router."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("--key", required=True, help="gateway key name")
        parser.add_argument("--model", required=True, help="requested model (or auto)")
        parser.add_argument(
            "--requirements",
            default="",
            help="as the x-gateway-requirements header: write_tools,vision,zero_retention,region=eu,...",
        )
        parser.add_argument("--route-class", default="http", choices=[str(c) for c in RouteClass])
        parser.add_argument(
            "--route",
            default=ClientRoute.CHAT_COMPLETIONS.tail,
            choices=[route.tail for route in RELAYED],
            help="the client route (without /v1): decides which adapters can carry it",
        )
        parser.add_argument("--tools", action="store_true", help="the turn offers tools")
        parser.add_argument("--tool-results", action="store_true", help="the turn carries tool results")
        parser.add_argument("--tokens", type=int, default=0, help="estimated prompt + max output tokens")
        parser.add_argument("--deadline-ms", type=int, help="remaining deadline")
        parser.add_argument("--session", help="x-gateway-session value")
        parser.add_argument("--previous-response-id", help="a previous_response_id (hard pin)")

    def handle(self, *args, **o) -> None:
        key = key_by_name(o["key"])
        if key is None:
            raise CommandError(f"unknown key {o['key']!r}")
        try:
            header = parse_requirements_header(o["requirements"])
        except RequirementsHeaderError as exc:
            raise CommandError(f"--requirements: cannot read {exc.item!r}") from None
        turn = Requirements(
            tools_offered=o["tools"],
            untrusted_content=o["tool_results"],
            prompt_tokens=max(o["tokens"], 0),
            deadline_remaining_ms=o["deadline_ms"],
            adapters=carriers(o["route"]),
        )
        requirements = tighten(tighten(key.requirements, header), turn)
        now = timezone.now()
        # The same gathering of inputs as the proxy's (pins, session, health, settings).
        affinities = affinities_load(
            key_id=key.key_id,
            now=now,
            response_id=o["previous_response_id"],
            session=session_named(o["session"]),
        )
        if o["previous_response_id"] and affinities.response is None:
            # As the proxy answers it (`proxy.ingress.unheld`, SPEC §7.2): nothing is sent.
            self.stdout.write("no dispatch: previous_response_not_found (not a response this key created)")
            return
        inputs = routing_inputs_load(
            pool_ids=key.pool_ids, route_class=RouteClass(o["route_class"]), now=now, affinities=affinities
        )
        settings = inputs.settings
        requirements = replace(requirements, min_attempt_ms=settings.min_attempt_ms)
        session = inputs.session
        decide_now = partial(
            decide,
            inputs.view,
            key,
            o["model"],
            requirements,
            pins=inputs.pins,
            session_assignment_id=session.assignment_id if session else None,
            session_model=session.model or None if session else None,
        )
        decision = decide_now()
        lease = lease_candidate(decision)
        if lease is not None:
            # Read-only: show the plan of the request that wins the probe lease; every other
            # request keeps the plan above it, with the candidate last.
            self.stdout.write(
                f"probe: {lease.assignment} / {lease.model} admits one probe; the request that takes "
                "its lease tries it in this order (the others order it last):"
            )
            decision = decide_now(held={lease.key})
        self.states = States(
            circuits=dict(inputs.view.circuits),
            wide=dict(inputs.view.wide),
            demotions={
                (d.assignment_id, d.model): (d.reason, d.until)
                for d in Demotion.objects.filter(assignment__pool_id__in=key.pool_ids, until__gt=now)
            },
            now=now,
        )
        self.stdout.write(f"key {key.name}: pools {', '.join(pool_names(key.pool_ids)) or '(none)'}")
        self.stdout.write(
            f"route {o['route']}, route class {o['route_class']}, shortlist {settings.max_attempts}"
        )
        self._write_decision(decision)
        self._write_preference(decision)
        self._write_capabilities(decision, now)
        self._write_prices(decision)

    def _write_decision(self, decision: Decision) -> None:
        w = self.stdout.write
        if decision.auto is not None:
            auto = decision.auto
            w(f"auto: chose {auto.model} ({auto.reason}); ready: {', '.join(auto.ready) or '(none)'}")
        if decision.resolution is not None:
            r = decision.resolution
            note = f" (fallback: {r.fallback})" if r.is_fallback else ""
            w(f"model {r.requested} -> served {r.served}{note}")
        if decision.fallback is not None:
            w(f"cross-model fallback: {decision.fallback.model} ({decision.fallback.reason})")
        if decision.error is not None:
            w(f"no dispatch: {decision.error.code}")
            return
        plan = decision.plan
        assert plan is not None
        if plan.order:
            w("plan:")
            for n, c in enumerate(plan.order, 1):
                w(f"  {n}. {self._describe(c)}")
        else:
            w(f"plan: empty -> no_eligible_backend ({plan.exclusion_reason or 'no candidate'})")
        for verdict in plan.ineligible:
            reasons = ", ".join(verdict.reasons)
            w(f"  ineligible: {self._describe(verdict.candidate)}: {reasons}")
        for c in plan.beyond_shortlist:
            w(f"  beyond shortlist: {self._describe(c)}")
        for c in plan.not_crossed:
            w(f"  not crossed (the primary model was not reported missing): {self._describe(c)}")
        for c in plan.disallowed:
            w(f"  not allowed for this key: {self._describe(c)}")

    def _write_preference(self, decision: Decision) -> None:
        """What orders the plan within a health group and tier (SPEC §5.4): each candidate's weight, its
        latency (the moving average of upstream time to first byte the router read), and with the pool
        features on, its chance of being drawn first (`routing.policy.preference.shares`)."""
        plan = decision.plan
        if plan is None or not plan.order:
            return
        # The draw is among every eligible candidate, before the shortlist is cut.
        eligible = (*plan.order, *plan.beyond_shortlist)
        drawn = preference.shares(eligible) if site_settings.GATEWAY_POOL_FEATURES else None
        self.stdout.write(
            "preference (weight, headroom: the share of its tightest rate limit left, latency: average time "
            "to first byte, load: what it served lately, a conversation placed on it counting "
            f"{PLACEMENT_LOAD:.0f}, chance of going first):"
        )
        for c in eligible:
            latency = "unknown (no answer yet)" if c.latency_ms is None else f"{c.latency_ms:.0f} ms"
            headroom = "" if c.headroom_left is None else f", headroom {c.headroom_left:.0%} left"
            served = "" if c.load is None else f", load {c.load:.1f}"
            chance = f", first {drawn[c.key]:.0%}" if drawn is not None else ""
            line = f"weight {c.weight}{headroom}, latency {latency}{served}{chance}"
            self.stdout.write(f"  {c.assignment} / {c.model}: {line}")
        if plan.session_moved:
            first = plan.order[1] if plan.order[0].health is Health.HELD else plan.order[0]
            affinity = "cache affinity: the session's last account goes first while it is healthy"
            self.stdout.write(f"{affinity}: {first.assignment}")

    def _write_capabilities(self, decision: Decision, now) -> None:
        """Why each candidate may or may not take a capability-bearing turn: each capability's value and
        where it comes from (qualified evidence with its expiry, declared, unknown)."""
        plan = decision.plan
        if plan is None:
            return
        shown = [*plan.order, *(v.candidate for v in plan.ineligible)]
        explained = capabilities_explained([c.key for c in shown], now=now)
        if explained:
            self.stdout.write("capabilities:")
        for c in shown:
            if c.key in explained:
                text = " ".join(provenance_text(v) for v in explained[c.key])
                self.stdout.write(f"  {c.assignment} / {c.model}: {text}")

    def _write_prices(self, decision: Decision) -> None:
        """The price the router uses for each candidate (reservation under a budget, recorded cost) and
        where it comes from: configured, bundled (catalog/prices.yaml) or unknown."""
        plan = decision.plan
        if plan is None:
            return
        shown = [*plan.order, *(v.candidate for v in plan.ineligible)]
        if shown:
            self.stdout.write("prices (per million tokens, input / output):")
        for c in shown:
            self.stdout.write(f"  {c.assignment} / {c.model}: {price_text(c.price)}")

    def _describe(self, c: Candidate) -> str:
        """The candidate, its tier and states, and for each state its reason and time."""
        flags = [f"tier {c.tier}", str(c.health)]
        if c.demoted:
            flags.append("demoted")
        if c.cross_model:
            flags.append("cross-model")
        why = self.states.text(c)
        return f"{c.assignment} / {c.model} [{', '.join(flags)}]{': ' + why if why else ''}"
