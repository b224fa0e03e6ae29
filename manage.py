#!/usr/bin/env python
import os
import sys
from pathlib import Path


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gatewaysite.settings")
    # A terminal's commands read the development settings `make run` leaves (gatewaysite/settings.py);
    # the server never does. GATEWAY_ENV_FILE= (empty) reads none, as a production shell should.
    os.environ.setdefault("GATEWAY_ENV_FILE", str(Path(__file__).resolve().parent / ".env"))
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
