from datetime import datetime

from django.core.management.base import BaseCommand, CommandError

from pools.services import KeyRefused, gateway_key_create


class Command(BaseCommand):
    help = (
        "Create a gateway key with a generated secret and print the secret once (only its hash is "
        "stored: it cannot be shown again)."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("name")
        parser.add_argument("--pools", required=True, help="comma-separated pool names")
        parser.add_argument("--allowed-models", default="*", help="comma-separated models, or * (default)")
        parser.add_argument("--expires-at", help="ISO 8601 with a time zone, e.g. 2027-01-31T00:00:00Z")

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
        try:
            key, secret = gateway_key_create(
                name=o["name"],
                pool_names=[p for p in o["pools"].split(",") if p],
                allowed_models=[m for m in o["allowed_models"].split(",") if m],
                expires_at=expires_at,
            )
        except KeyRefused as exc:
            raise CommandError(str(exc)) from None
        self.stderr.write(f"created key {key.name!r}; its secret, shown only this once:")
        self.stdout.write(secret)
