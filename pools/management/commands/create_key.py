from datetime import datetime

from django.core.management.base import BaseCommand, CommandError

from pools.services import KeyRefused, KeyTerms, gateway_key_create
from routing.policy.budget import micros_from_usd
from routing.policy.vocabulary import BudgetPeriod


def _dollars(text: str) -> int:
    try:
        return micros_from_usd(text)
    except ValueError as refused:
        raise CommandError(f"--budget-usd: {refused}") from None


class Command(BaseCommand):
    help = (
        "Create a gateway key with a generated secret and print the secret once (only its hash is "
        "stored: it cannot be shown again)."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("name")
        parser.add_argument("--pools", required=True, help="comma-separated pool names")
        parser.add_argument(
            "--allowed-models", default="*", help="comma-separated models, or * (default: every model)"
        )
        parser.add_argument("--expires-at", help="ISO 8601 with a time zone, e.g. 2027-01-31T00:00:00Z")
        parser.add_argument("--budget-usd", help="a budget in dollars, e.g. 50.00 (default: none)")
        parser.add_argument(
            "--budget-period",
            choices=list(BudgetPeriod),
            help="when the budget starts again (UTC; default: never, a lifetime budget)",
        )
        for limit in ("rpm", "tpm", "concurrent"):
            parser.add_argument(f"--{limit}", type=int, help=f"the key's {limit} limit (default: none)")

    def handle(self, *args, **o) -> None:
        expires_at = None
        if o["expires_at"]:
            try:
                expires_at = datetime.fromisoformat(o["expires_at"])
            except ValueError:
                raise CommandError(
                    f"--expires-at {o['expires_at']!r}: not an ISO 8601 date and time"
                ) from None
            if expires_at.tzinfo is None:
                raise CommandError("--expires-at must name its time zone, e.g. 2027-01-31T00:00:00Z")
        if o["budget_period"] and o["budget_usd"] is None:
            raise CommandError("--budget-period needs --budget-usd")
        for limit in ("rpm", "tpm", "concurrent"):
            if o[limit] is not None and o[limit] < 1:
                raise CommandError(f"--{limit} must be at least 1")
        terms = KeyTerms(
            budget_micros=None if o["budget_usd"] is None else _dollars(o["budget_usd"]),
            budget_period=o["budget_period"] or "",
            rpm=o["rpm"],
            tpm=o["tpm"],
            concurrent=o["concurrent"],
        )
        try:
            key, secret = gateway_key_create(
                name=o["name"],
                pool_names=[p for p in o["pools"].split(",") if p],
                allowed_models=[m for m in o["allowed_models"].split(",") if m],
                expires_at=expires_at,
                terms=terms,
            )
        except KeyRefused as exc:
            raise CommandError(str(exc)) from None
        self.stderr.write(f"created key {key.name!r}; its secret, shown only this once:")
        self.stdout.write(secret)
