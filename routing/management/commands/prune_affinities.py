from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from routing.services import PRUNE_BATCH, affinity_prune


class Command(BaseCommand):
    help = (
        "Delete every expired affinity (response, file, session), in bounded batches. The ledger writer "
        "also prunes a batch now and then; this command empties the backlog at once (e.g. from cron)."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("--batch", type=int, default=PRUNE_BATCH, help="rows deleted per statement")

    def handle(self, *args, **o) -> None:
        if o["batch"] < 1:
            raise CommandError("--batch must be at least 1")
        now = timezone.now()
        total = 0
        while deleted := affinity_prune(now=now, limit=o["batch"]):
            total += deleted
        self.stdout.write(f"deleted {total} expired affinities")
