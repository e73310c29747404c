"""``python -m mscclpp``: command-line tools of the package.

    python -m mscclpp install-plans [--dir DIR] [--only PATTERN ...] [--list]

writes the bundled execution plans (core/plans of the repository, produced here by their DSL
programs in ``mscclpp.language.examples.plans``) into ``DIR/default/``, where the collectives
and ``libmscclpp_nccl.so`` look for plans (upstream's layout). DIR defaults to
``$MSCCLPP_CACHE_DIR``, else ``~/.cache/mscclpp``. A plan there runs instead of the native
algorithms for every call it matches (collective, world size, ranks per node, in/out of place,
its size range); the bundled plans cover every size, so pick with ``--only`` (shell patterns
on the file name, e.g. ``--only 'allreduce_ll_n*'``). Plans with switch channels (NVLS) are
not bundled: the plan lookup never takes them.

The plans come from ``mscclpp.language`` (pure Python): nothing here uses the native module.
"""

from __future__ import annotations

import argparse
import fnmatch
import os
import sys


def _default_dir() -> str:
    d = os.environ.get("MSCCLPP_CACHE_DIR")
    return d if d else os.path.join(os.path.expanduser("~"), ".cache", "mscclpp")


def _install_plans(args: argparse.Namespace) -> int:
    from mscclpp.language.examples import plans

    names = plans.bundled()
    if args.only:
        names = [n for n in names if any(fnmatch.fnmatch(n, p) or fnmatch.fnmatch(n, p + ".json") for p in args.only)]
        if not names:
            print(f"install-plans: no bundled plan matches {args.only} (see --list)", file=sys.stderr)
            return 1
    if args.list:
        for n in names:
            print(n)
        return 0
    texts = plans.all_plans()
    target = os.path.join(args.dir or _default_dir(), "default")
    try:
        os.makedirs(target, exist_ok=True)
        for n in names:
            with open(os.path.join(target, n), "w") as f:
                f.write(texts[n])
    except OSError as e:
        print(f"install-plans: writing {target}: {e}", file=sys.stderr)
        return 1
    print(f"installed {len(names)} plan(s) into {target}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mscclpp", description="Tools of the mscclpp package.")
    sub = ap.add_subparsers(dest="command", metavar="COMMAND")
    ip = sub.add_parser(
        "install-plans",
        help="write the bundled execution plans into the plan directory (DIR/default)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ip.add_argument("--dir", help="the plan directory (default $MSCCLPP_CACHE_DIR, else ~/.cache/mscclpp)")
    ip.add_argument("--only", action="append", metavar="PATTERN", help="only the plans whose file name matches")
    ip.add_argument("--list", action="store_true", help="print the plans that would be installed")
    args = ap.parse_args(argv)
    if args.command == "install-plans":
        return _install_plans(args)
    ap.print_help()
    return 2


if __name__ == "__main__":
    sys.exit(main())
