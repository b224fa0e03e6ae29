import asyncio
import json as jsonlib
from datetime import timedelta

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from catalog.models import CatalogEntry
from catalog.qualification import Verdict, changes, corpus_load, run_version, verdicts
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
        if pool is not None and not Pool.objects.filter(name=pool).exists():
            raise CommandError(f"unknown pool {pool!r}")
        if assignment is not None and not Assignment.objects.filter(name=assignment).exists():
            raise CommandError(f"unknown assignment {assignment!r}")
        routes = qualification_routes(pool=pool, assignment=assignment, model=model)
        if not routes:
            raise CommandError(
                "no route to qualify: no assignment selected has a catalog entry matching that"
            )
        if image_url is not None and not image_url.startswith("https://"):
            raise CommandError("--image-url must be an https URL the upstreams can fetch")
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
        recorded = qualified = failed_routes = lost_routes = 0
        input_tokens = output_tokens = missing = 0
        for entry in routes:
            a = entry.assignment
            name = f"{a.pool.name}/{a.name} {entry.model}"
            route = {"pool": a.pool.name, "assignment": a.name, "model": entry.model}
            # The hash of the configuration the corpus is about to go through, read with it.
            config_hash = assignment_route_hash(a, entry.model)
            started = timezone.now()
            try:
                run = asyncio.run(_replay(entry, corpus, timeout_s, image_url))
            except Inconclusive as exc:
                failed_routes += 1
                if json:
                    self.stdout.write(
                        dumps({**route, "judged": False, "reason": exc.reason, "probe": exc.probe})
                    )
                else:
                    self.stdout.write(
                        f"{name}: not judged, {exc.reason} at probe {exc.probe}; nothing recorded"
                    )
                continue
            input_tokens += run.input_tokens
            output_tokens += run.output_tokens
            missing += run.usage_missing
            found = verdicts(corpus, run.outcomes)
            previous = latest_verdicts(assignment_id=a.pk, model=entry.model)
            gained, lost = changes(previous, found)
            lost_routes += bool(lost)
            capability_evidence_record(
                assignment=a,
                model=entry.model,
                verdicts=found,
                qualified_at=started,
                days=days,
                corpus_version=version,
                config_hash=config_hash,
            )
            recorded += len(found)
            qualified += sum(1 for v in found if v.qualified)
            if json:
                self.stdout.write(
                    dumps(
                        {
                            **route,
                            "judged": True,
                            "corpus": version,
                            "qualified_at": started.isoformat(),
                            "expires_at": (started + timedelta(days=days)).isoformat(),
                            "verdicts": {str(v.capability): v.qualified for v in found},
                            "details": {str(v.capability): v.detail for v in found if not v.qualified},
                            "previous": {str(c): previous.get(c) for c in Capability},
                            "gained": gained,
                            "lost": lost,
                            "tokens": {"input": run.input_tokens, "output": run.output_tokens},
                            "probes": {
                                probe: {
                                    "passed": o.passed,
                                    "detail": o.detail,
                                    "tokens": run.costs.get(probe, 0),
                                }
                                for probe, o in run.outcomes.items()
                            },
                        }
                    )
                )
            else:
                text = " ".join(_verdict_text(v) for v in found)
                change = f"; lost {', '.join(lost)}" if lost else ""
                self.stdout.write(f"{name}: {text}; {run.tokens} tokens{change}")
        judged = len(routes) - failed_routes
        usage = f"{input_tokens + output_tokens} tokens spent ({input_tokens} input, {output_tokens} output)"
        if missing:
            usage += f"; {missing} answer{'s' if missing != 1 else ''} reported no usage"
        say(
            f"qualified {judged} of {len(routes)} routes: {recorded} verdicts recorded "
            f"({qualified} true, {recorded - qualified} false), {failed_routes} not judged; {usage}"
        )
        if failed_routes:
            plural = "s" if failed_routes != 1 else ""
            raise CommandError(f"{failed_routes} route{plural} could not be judged", returncode=NOT_JUDGED)
        if lost_routes:
            plural = "s" if lost_routes != 1 else ""
            raise CommandError(f"{lost_routes} route{plural} lost a capability", returncode=LOST)
