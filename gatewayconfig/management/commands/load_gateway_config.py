"""`python manage.py load_gateway_config PATH [--prune]` (SPEC §3)."""

import os
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from gatewayconfig.services import gateway_config_load


class Command(BaseCommand):
    help = (
        "Apply a gateway YAML configuration in one transaction: upsert by name, and with --prune delete "
        "what the file no longer names. Any error changes nothing; every error is printed with its path."
    )

    def add_arguments(self, parser):
        parser.add_argument("path", help="the YAML file")
        parser.add_argument(
            "--prune",
            action="store_true",
            help="delete pools, assignments, keys, ... that the file does not name",
        )
        parser.add_argument(
            "--dry-run",
            action="store_true",
            help="print what would be created, changed and removed, with its warnings, and change nothing",
        )
        parser.add_argument(
            "--replace-secrets",
            action="store_true",
            help="a key's secret in the file replaces an existing key's (else it only creates keys, so a "
            "reload never undoes rotate_key)",
        )

    def handle(self, *args, path: str, prune: bool, dry_run: bool, replace_secrets: bool, **options):
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise CommandError(f"{path}: cannot read: {exc.strerror or exc}") from exc
        except UnicodeDecodeError as exc:
            raise CommandError(f"{path}: not UTF-8 text") from exc

        result = gateway_config_load(
            text=text, prune=prune, env=os.environ, replace_secrets=replace_secrets, dry_run=dry_run
        )
        for warning in result.warnings:
            self.stderr.write(self.style.WARNING(f"warning: {warning}"))
        if result.summary is None:
            for error in result.errors:
                self.stderr.write(str(error))
            raise CommandError(f"{path}: {len(result.errors)} error(s); nothing was changed")
        summary = result.summary
        for removed in summary.access_removed:
            self.stderr.write(self.style.WARNING(f"warning: access removed: {removed}"))
        for name in summary.secrets_kept:
            self.stderr.write(
                self.style.WARNING(
                    f"warning: key {name!r}: the file's secret differs from the stored one, which is kept "
                    "(rotated with rotate_key?); --replace-secrets replaces it"
                )
            )
        if dry_run:
            self.stdout.write("dry run: nothing was changed; applying it would do this:")
        for line in summary.lines():
            self.stdout.write(line)
        if not summary.changed:
            self.stdout.write("no changes")
