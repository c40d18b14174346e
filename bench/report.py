"""A result file rendered again from its JSON: the tables and verdicts recomputed.

    python -m bench.report bench/results/<stem>.json [...]          # print the .md
    python -m bench.report --check bench/results/<stem>.json [...]  # compare with the .md

Every recorded run is a ``<stem>.json`` (the machine, the parameters and
every round's data) and the ``<stem>.md`` its bench's report rendered from it
(:mod:`bench.common` describes the format). This renders the ``.md`` from the
JSON alone with the report function the JSON names, so what a result file
says, verdicts included, follows from the data committed beside it. With
``--check`` it compares the rendering with the ``.md`` beside each JSON and
exits 1 when one differs (the difference shown) or is missing; a report
changed since a run was recorded shows here too.
"""

from __future__ import annotations

import argparse
import difflib
import json
import sys
from pathlib import Path

from bench.common import render_doc


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("json", type=Path, nargs="+", help="a result's .json")
    ap.add_argument(
        "--check", action="store_true", help="compare with the .md beside it; exit 1 if not equal"
    )
    args = ap.parse_args(argv)
    failed = 0
    for path in args.json:
        try:
            md = render_doc(json.loads(path.read_text()))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            print(f"{path}: cannot render: {exc}", file=sys.stderr)
            failed += 1
            continue
        if not args.check:
            sys.stdout.write(md)
            continue
        beside = path.with_suffix(".md")
        if not beside.is_file():
            print(f"{beside}: missing", file=sys.stderr)
            failed += 1
            continue
        recorded = beside.read_text()
        if recorded == md:
            print(f"{beside}: same as rendered from {path.name}")
            continue
        failed += 1
        sys.stdout.writelines(
            difflib.unified_diff(
                recorded.splitlines(keepends=True),
                md.splitlines(keepends=True),
                f"{beside} (recorded)",
                f"{beside} (rendered from {path.name})",
            )
        )
        print(f"{beside}: differs from what {path.name} renders", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
