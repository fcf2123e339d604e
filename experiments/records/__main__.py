"""``python -m experiments.records collect|render``: see the package's docstring."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from experiments.records import DOC, RESULTS, RecordError
from experiments.records import __doc__ as DESCRIPTION
from experiments.records.collect import collect
from experiments.records.render import RENDER, differences, marker_pages, rendered
from seq2seq.errors import Seq2SeqError


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m experiments.records", description=DESCRIPTION.split("\n\n")[0]
    )
    p.add_argument(
        "--results", type=Path, default=RESULTS, help="records folder (default: %(default)s)"
    )
    commands = p.add_subparsers(dest="command", required=True)
    c = commands.add_parser("collect", help="copy a finished run's record into RESULTS/NAME")
    c.add_argument("run", type=Path, metavar="RUN_DIR")
    c.add_argument("name", metavar="NAME")
    c.add_argument("--recipe", help="recipe label (default: NAME without a -seedN/-sN suffix)")
    c.add_argument("--seed", type=int, help="check that the run has this train.seed")
    c.add_argument("--overwrite", action="store_true", help="replace a record of that name")
    r = commands.add_parser("render", help=f"write {DOC.name} and the README's results table")
    r.add_argument("--check", action="store_true", help="write nothing; exit 1 when a file differs")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.command == "render" and not args.check and args.results.resolve() != RESULTS:
        print(f"records: error: render writes {DOC.name} from {RESULTS} only", file=sys.stderr)
        return 2
    try:
        if args.command == "collect":
            out = collect(args.run, args.name, args.results, args.recipe, args.seed, args.overwrite)
            print(f"collected {args.run} into {out}; now: {RENDER}")
            return 0
        files = rendered(args.results, DOC, marker_pages())
    except (RecordError, Seq2SeqError, OSError) as e:
        print(f"records: error: {e}", file=sys.stderr)
        return 2
    differ = differences(files)
    if args.check:
        if differ:
            print(f"differs from the records' render: {', '.join(differ)}; run {RENDER}")
            return 1
        return 0
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    print(f"rendered {len(files)} file(s); changed: {', '.join(differ) or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
