"""`make soak`'s entry point: one gateway node (soak/run.py) or several on one PostgreSQL
(soak/multinode.py), by `--nodes` and `--database`. The multi-node run builds on run.py's load and
checks, so the choice lives here, above both, rather than in run.py (which made the two import each
other)."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from soak import multinode, run  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    args = run.parse_args(argv)
    several = args.nodes > 1 or args.database == "postgres"
    if args.time_limit is None:
        args.time_limit = 1200 if several else 480
    if not several:
        return run.main(args)
    if args.database != "postgres":
        print("soak: --nodes N > 1 needs a shared server database: add --database postgres", file=sys.stderr)
        return 2
    return multinode.main(args)


if __name__ == "__main__":
    sys.exit(main())
