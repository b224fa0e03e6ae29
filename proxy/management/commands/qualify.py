import asyncio
import json as jsonlib
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from catalog.models import CatalogEntry
from catalog.qualification import Corpus, Verdict, changes, corpus_load, run_version, verdicts
from catalog.selectors import assignment_route_hash, latest_verdicts, qualification_routes
from catalog.services import capability_evidence_record
from pools.models import Assignment, GatewaySettings, Pool
from proxy import upstream
from proxy.qualify import Inconclusive, RouteRun, replay
from routing.policy.capabilities import Capability, verdict_value
from routing.policy.route import Target

# Exit codes (0: every route judged, none lost a capability; 2 is argparse's, a usage error).
NOT_JUDGED = 1  # a route could not be judged (it keeps its earlier evidence); before LOST
LOST = 3  # a route's verdict is false for a capability its previous verdict had true

# One probe may wait this long for its answer (at most the configured upstream read timeout).
PROBE_TIMEOUT_S = 120.0


def _target(a: Assignment) -> Target:
    return Target(a.pk, a.name, a.pool_id, a.adapter, a.base_url, a.api_key_env, a.credential, a.region)


async def _replay(entry: CatalogEntry, corpus, timeout_s: float, image_url: str | None) -> RouteRun:
    try:
        return await replay(
            _target(entry.assignment), entry.model, corpus, timeout_s=timeout_s, image_url=image_url
        )
    finally:
        await upstream.close_client()


def dumps(line: dict) -> str:
    return jsonlib.dumps(line, separators=(",", ":"))


def _verdict_text(v: Verdict) -> str:
    text = f"{v.capability}={verdict_value(v.capability, v.qualified)}"
    return text if v.qualified else f"{text} ({v.detail})"


@dataclass(frozen=True, slots=True)
class _Run:
    """What every route of one run is qualified with."""

    corpus: Corpus
    version: str
    days: int
    timeout_s: float
    image_url: str | None


@dataclass(slots=True)
class _Tally:
    """The run's counts, for its closing line and its exit code."""

    recorded: int = 0
    qualified: int = 0
    failed_routes: int = 0
    lost_routes: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    missing: int = 0


class Command(BaseCommand):
    help = (
        "Replay the fixed qualification corpus through each route (assignment, model) of the enabled "
        "assignments, over the same adapter and translation as client traffic, and record per capability "
        "a verdict with its date, corpus version, the route's configuration hash and an expiry "
        "(qualification_days). Records no prompt and no answer."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("--pool", help="only this pool's routes")
        parser.add_argument(
            "--assignment",
            help="only this assignment's routes (even while it is disabled, to qualify it first)",
        )
        parser.add_argument("--model", help="only routes of this model id")
        parser.add_argument(
            "--image-url",
            help="an https URL where the upstreams can fetch the corpus's JPEG (its values.jpeg), for the "
            "image-by-URL probe; without it that probe is not sent",
        )
        parser.add_argument(
            "--json",
            action="store_true",
            help="one JSON object a line per route on stdout (verdicts, what changed since the last run), "
            "the rest on stderr: for a scheduler",
        )

    def handle(
        self, *args, pool=None, assignment=None, model=None, json=False, image_url=None, **options
    ) -> None:
        routes = _selected_routes(pool=pool, assignment=assignment, model=model, image_url=image_url)
        corpus = corpus_load()
        version = run_version(corpus, image_url)
        stored = GatewaySettings.objects.filter(pk=1).first() or GatewaySettings()
        days = stored.qualification_days
        timeout_s = min(PROBE_TIMEOUT_S, settings.GATEWAY_UPSTREAM_READ_TIMEOUT_S)
        say = self.stderr.write if json else self.stdout.write
        say(
            f"qualifying {len(routes)} route{'s' if len(routes) != 1 else ''} with corpus {version} "
            f"({len(corpus.probes)} probes each, at most {corpus.token_budget} tokens a route); "
            f"verdicts valid {days} days"
            + ("" if image_url else "; no --image-url: images by URL not probed")
        )
        tally = _Tally()
        run = _Run(corpus=corpus, version=version, days=days, timeout_s=timeout_s, image_url=image_url)
        for entry in routes:
            self._qualify_route(entry, run, tally, json=json)
        judged = len(routes) - tally.failed_routes
        usage = (
            f"{tally.input_tokens + tally.output_tokens} tokens spent "
            f"({tally.input_tokens} input, {tally.output_tokens} output)"
        )
        if tally.missing:
            usage += f"; {tally.missing} answer{'s' if tally.missing != 1 else ''} reported no usage"
        say(
            f"qualified {judged} of {len(routes)} routes: {tally.recorded} verdicts recorded "
            f"({tally.qualified} true, {tally.recorded - tally.qualified} false), "
            f"{tally.failed_routes} not judged; {usage}"
        )
        if tally.failed_routes:
            plural = "s" if tally.failed_routes != 1 else ""
            raise CommandError(
                f"{tally.failed_routes} route{plural} could not be judged", returncode=NOT_JUDGED
            )
        if tally.lost_routes:
            plural = "s" if tally.lost_routes != 1 else ""
            raise CommandError(f"{tally.lost_routes} route{plural} lost a capability", returncode=LOST)

    def _qualify_route(self, entry: CatalogEntry, run: _Run, tally: _Tally, *, json: bool) -> None:
        """Replay the corpus through one route and record its verdicts, or say why it was not judged
        (recording nothing); one line on stdout either way."""
        a = entry.assignment
        name = f"{a.pool.name}/{a.name} {entry.model}"
        route = {"pool": a.pool.name, "assignment": a.name, "model": entry.model}
        # The hash of the configuration the corpus is about to go through, read with it.
        config_hash = assignment_route_hash(a, entry.model)
        started = timezone.now()
        try:
            replayed = asyncio.run(_replay(entry, run.corpus, run.timeout_s, run.image_url))
        except Inconclusive as exc:
            tally.failed_routes += 1
            if json:
                self.stdout.write(dumps({**route, "judged": False, "reason": exc.reason, "probe": exc.probe}))
            else:
                self.stdout.write(f"{name}: not judged, {exc.reason} at probe {exc.probe}; nothing recorded")
            return
        tally.input_tokens += replayed.input_tokens
        tally.output_tokens += replayed.output_tokens
        tally.missing += replayed.usage_missing
        found = verdicts(run.corpus, replayed.outcomes)
        previous = latest_verdicts(assignment_id=a.pk, model=entry.model)
        gained, lost = changes(previous, found)
        tally.lost_routes += bool(lost)
        capability_evidence_record(
            assignment=a,
            model=entry.model,
            verdicts=found,
            qualified_at=started,
            days=run.days,
            corpus_version=run.version,
            config_hash=config_hash,
        )
        tally.recorded += len(found)
        tally.qualified += sum(1 for v in found if v.qualified)
        if json:
            line = _judged_line(route, run, replayed, started, found, previous, gained=gained, lost=lost)
            self.stdout.write(dumps(line))
        else:
            text = " ".join(_verdict_text(v) for v in found)
            change = f"; lost {', '.join(lost)}" if lost else ""
            self.stdout.write(f"{name}: {text}; {replayed.tokens} tokens{change}")


def _selected_routes(
    *, pool: str | None, assignment: str | None, model: str | None, image_url: str | None
) -> list[CatalogEntry]:
    """The routes the options select; a usage error when an option names nothing or nothing is left."""
    if pool is not None and not Pool.objects.filter(name=pool).exists():
        raise CommandError(f"unknown pool {pool!r}")
    if assignment is not None and not Assignment.objects.filter(name=assignment).exists():
        raise CommandError(f"unknown assignment {assignment!r}")
    routes = qualification_routes(pool=pool, assignment=assignment, model=model)
    if not routes:
        raise CommandError("no route to qualify: no assignment selected has a catalog entry matching that")
    if image_url is not None and not image_url.startswith("https://"):
        raise CommandError("--image-url must be an https URL the upstreams can fetch")
    return routes


def _judged_line(
    route: dict[str, str],
    run: _Run,
    replayed: RouteRun,
    started: datetime,
    found: tuple[Verdict, ...],
    previous: Mapping[Capability, bool],
    *,
    gained: list[str],
    lost: list[str],
) -> dict[str, Any]:
    """A judged route's `--json` line: its verdicts, what changed since `previous`, and each probe."""
    return {
        **route,
        "judged": True,
        "corpus": run.version,
        "qualified_at": started.isoformat(),
        "expires_at": (started + timedelta(days=run.days)).isoformat(),
        "verdicts": {str(v.capability): v.qualified for v in found},
        "details": {str(v.capability): v.detail for v in found if not v.qualified},
        "previous": {str(c): previous.get(c) for c in Capability},
        "gained": gained,
        "lost": lost,
        "tokens": {"input": replayed.input_tokens, "output": replayed.output_tokens},
        "probes": {
            probe: {
                "passed": o.passed,
                "detail": o.detail,
                "tokens": replayed.costs.get(probe, 0),
            }
            for probe, o in replayed.outcomes.items()
        },
    }
