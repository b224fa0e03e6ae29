"""`python manage.py dump_gateway_config` (SPEC §3): the current state in the YAML schema, no secrets."""

from django.core.management.base import BaseCommand

from gatewayconfig.document import dump_config


class Command(BaseCommand):
    help = (
        "Print the current configuration as YAML in the load_gateway_config schema. Keys are printed "
        "without secrets (reloading keeps their stored hash); unknown values are omitted."
    )

    def handle(self, *args, **options):
        self.stdout.write(dump_config(), ending="")
