"""`python manage.py config_reference`: the configuration reference (docs/configuration.md)."""

from django.core.management.base import BaseCommand

from gatewayconfig.reference import render_reference


class Command(BaseCommand):
    help = (
        "Print the configuration reference (every YAML key and environment variable) as Markdown, "
        "generated from the schema: `manage.py config_reference > docs/configuration.md`."
    )

    def handle(self, *args, **options):
        self.stdout.write(render_reference(), ending="")
