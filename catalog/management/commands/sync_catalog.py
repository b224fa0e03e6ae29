from django.core.management.base import BaseCommand, CommandError

from catalog.services import AssignmentSync, catalog_sync
from pools.models import Assignment, Pool


class Command(BaseCommand):
    help = "Ask each discovering assignment for its models (GET {base_url}/models) and record provenance."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--pool", help="only this pool's assignments")
        parser.add_argument("--assignment", help="only this assignment")

    def handle(self, *args, pool=None, assignment=None, **options) -> None:
        if pool is not None and not Pool.objects.filter(name=pool).exists():
            raise CommandError(f"unknown pool {pool!r}")
        if assignment is not None and not Assignment.objects.filter(name=assignment).exists():
            raise CommandError(f"unknown assignment {assignment!r}")

        def progress(result: AssignmentSync) -> None:
            if result.ok:
                self.stdout.write(
                    f"{result.assignment}: ok, {result.observed} observed, "
                    f"{result.removed} no longer advertised"
                )
            else:
                self.stdout.write(
                    f"{result.assignment}: discovery failed ({result.reason}); "
                    f"{result.preserved} entries preserved"
                )

        summary = catalog_sync(pool=pool, assignment=assignment, progress=progress)
        ok = len(summary.results) - len(summary.failed)
        self.stdout.write(
            f"synced {len(summary.results)} assignments: {ok} ok, "
            f"{len(summary.failed)} failed (entries preserved)"
        )
