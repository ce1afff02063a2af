"""Hostile numbers, names, sizes and data files: run the cases of analysis.hostile_parse and count the outcomes.

    python experiments/hostile_parse.py            # one line per case, then the count
    python experiments/hostile_parse.py --json     # exactly one JSON object

The same cases are the group ``parse`` of ``experiments/hostile_inputs.py``; ``tests/test_hostile_parse.py`` runs
them in-process. :func:`cases` is the table (re-exported from the library).
"""

from __future__ import annotations

import json
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from analysis.cli.common import OneLineParser, guarded, positive_float, positive_int
from analysis.hostile import run_case
from analysis.hostile_parse import cases

__all__ = ["cases", "main"]


@guarded
def main(argv: list[str] | None = None) -> int:
    p = OneLineParser(prog="python experiments/hostile_parse.py", description=__doc__.splitlines()[0])
    p.add_argument("--timeout", type=positive_float, default=60.0, help="seconds per case (default 60)")
    p.add_argument("--workers", type=positive_int, default=2, help="cases run at once (default 2)")
    p.add_argument("--json", action="store_true", help="print exactly one JSON object")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="schedlab-parse-") as tmp:
        table = cases(Path(tmp))
        with ThreadPoolExecutor(args.workers) as pool:
            rows = list(pool.map(lambda c: run_case(c, Path(tmp), args.timeout), table))
    bad = [r for r in rows if r["outcome"] not in ("clean error", "ok")]
    if args.json:
        print(json.dumps({"cases": len(rows), "as expected": len(rows) - len(bad), "problems": bad}))
        return 0
    for r in rows:
        print(f"[{r['outcome']}] {r['argv']}")
    print(f"{len(rows)} cases, {len(rows) - len(bad)} as expected")
    return 0 if not bad else 1


if __name__ == "__main__":
    raise SystemExit(main())
