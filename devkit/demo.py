"""Run one fake upstream in the foreground until SIGINT/SIGTERM (the demo behind `make run`).

    python -m devkit.demo --port 9101 --name demo-a [--models gpt-5,gpt-x] [--reject gpt-x]

`--reject M` answers every request for model M with model_not_found, so the gateway fails over.
"""

import argparse
import signal
import threading

from devkit.behaviours import model_not_found
from devkit.upstream import FakeUpstream


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--name", default="demo")
    parser.add_argument("--models", default="gpt-5,gpt-x", help="comma-separated models served")
    parser.add_argument("--reject", action="append", default=[], metavar="MODEL", help="repeatable")
    args = parser.parse_args(argv)

    done = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: done.set())

    models = tuple(model for model in args.models.split(",") if model)
    with FakeUpstream(args.name, models, port=args.port) as fake:
        for model in args.reject:
            fake.script(model, model_not_found())
        rejected = f", rejecting {','.join(args.reject)}" if args.reject else ""
        print(
            f"fake upstream {fake.name} listening on {fake.base_url} serving {','.join(models)}{rejected}",
            flush=True,
        )
        done.wait()


if __name__ == "__main__":
    main()
