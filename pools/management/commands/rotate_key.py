from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from pools.services import KeyRefused, gateway_key_rotate, parse_overlap


class Command(BaseCommand):
    help = (
        "Give a gateway key a new generated secret and print it once. With --overlap the old secret "
        "stays valid that long (e.g. 24h) so clients can move without an outage; without it, at once."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("name")
        parser.add_argument(
            "--overlap", default="0", help="how long the old secret stays valid: 0, 90s, 30m, 24h, 7d"
        )

    def handle(self, *args, **o) -> None:
        try:
            overlap = parse_overlap(o["overlap"])
            now = timezone.now()
            key, secret = gateway_key_rotate(name=o["name"], overlap=overlap, now=now)
        except KeyRefused as exc:
            raise CommandError(str(exc)) from None
        until = (
            f"until {key.previous_valid_until:%Y-%m-%d %H:%M:%S} UTC"
            if key.previous_valid_until
            else "no longer"
        )
        self.stderr.write(
            f"rotated key {key.name!r}; the old secret is valid {until}; the new one, shown only this once:"
        )
        self.stdout.write(secret)
