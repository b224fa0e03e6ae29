import getpass
import json
import logging
import os

from django.core.management.base import BaseCommand, CommandError

from catalog.models import CatalogEntry
from pools.models import Assignment
from routing.models import Circuit, Demotion
from routing.policy.types import ASSIGNMENT_WIDE
from routing.services import circuit_reset

logger = logging.getLogger("gateway")


def operator() -> str:
    """Who ran the command: the OS user (a container without a passwd entry: its uid)."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return f"uid {os.getuid()}"


class Command(BaseCommand):
    help = (
        "For an operator who fixed an account: close the assignment's circuits (every model and route "
        "class, or only --model's, and the assignment-wide one either way) and clear its demotions, in "
        "one transaction, so its next request tries it. Recorded as a configuration change (the config "
        "version moves, and one log line names the assignment, the model and who ran it)."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("--assignment", required=True, help="the assignment's name")
        parser.add_argument("--model", help="only this model's circuits and demotion")

    def handle(self, *args, assignment: str, model: str | None = None, **options) -> None:
        account = Assignment.objects.filter(name=assignment).first()
        if account is None:
            raise CommandError(f"unknown assignment {assignment!r}: nothing reset")
        if model is not None and not _known(account, model):
            raise CommandError(
                f"assignment {assignment!r} has no model {model!r} in its catalog and no state for it: "
                "nothing reset"
            )
        reset = circuit_reset(assignment_id=account.pk, model=model)
        for c in reset.circuits:
            where = (
                "every model and route class"
                if c.route_class == ASSIGNMENT_WIDE
                else f"{c.model} {c.route_class}"
            )
            self.stdout.write(f"closed circuit {where} (was {c.state}, {c.reason or 'no reason'})")
        for d in reset.demotions:
            self.stdout.write(
                f"cleared demotion {d.model} ({d.reason} until {d.until:%Y-%m-%d %H:%M:%S} UTC)"
            )
        self.stdout.write(
            f"reset {len(reset.circuits)} circuit(s) and {len(reset.demotions)} demotion(s) of {assignment!r}"
            f"{f' for {model!r}' if model else ''}; config version {reset.config_version}"
        )
        logger.info(
            json.dumps(
                {
                    "event": "circuit_reset",
                    "assignment": assignment,
                    "model": model,
                    "by": operator(),
                    "circuits": len(reset.circuits),
                    "demotions": len(reset.demotions),
                    "config_version": reset.config_version,
                }
            )
        )


def _known(account: Assignment, model: str) -> bool:
    """The model is in the assignment's catalog, or only its routing state is left (the panel shows it
    as `not advertised`): either can be reset."""
    return (
        CatalogEntry.objects.filter(assignment=account, model=model).exists()
        or Circuit.objects.filter(assignment=account, model=model).exists()
        or Demotion.objects.filter(assignment=account, model=model).exists()
    )
