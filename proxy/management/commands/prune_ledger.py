from datetime import timedelta

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from proxy.console.spend import DAYS
from proxy.ledger.services import PRUNE_BATCH, daily_spend_prune, request_records_prune
from routing.services import affinity_prune


class Command(BaseCommand):
    help = (
        "Delete request records (with their attempts) older than GATEWAY_LEDGER_RETENTION_DAYS, and every "
        "expired affinity, in bounded batches; the daily spend totals are kept for as long as the spend "
        "page shows their day. Run it as a periodic job (e.g. daily from cron)."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument(
            "--days",
            type=int,
            default=None,
            help="keep this many days of records (default: GATEWAY_LEDGER_RETENTION_DAYS)",
        )
        parser.add_argument("--batch", type=int, default=PRUNE_BATCH, help="rows deleted per statement")

    def handle(self, *args, **o) -> None:
        days = settings.GATEWAY_LEDGER_RETENTION_DAYS if o["days"] is None else o["days"]
        if days < 1:
            raise CommandError("--days must be at least 1")
        if o["batch"] < 1:
            raise CommandError("--batch must be at least 1")
        now = timezone.now()
        before = now - timedelta(days=days)
        records = 0
        while deleted := request_records_prune(before=before, limit=o["batch"]):
            records += deleted
        # The spend page's first day (proxy.console.spend.spend_report): older totals are never read again.
        totals = daily_spend_prune(before=now.date() - timedelta(days=DAYS - 1))
        affinities = 0
        while deleted := affinity_prune(now=now, limit=o["batch"]):
            affinities += deleted
        self.stdout.write(
            f"deleted {records} request records started before {before:%Y-%m-%d %H:%M} UTC "
            f"and {affinities} expired affinities; deleted {totals} daily spend totals of days the spend "
            "page no longer shows"
        )
