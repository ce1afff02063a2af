"""Every path through the one output policy: the ``paths`` cases, run as subprocesses (as a user runs them).

    python experiments/hostile_paths.py           # each case's outcome, then any that went wrong
    python experiments/hostile_inputs.py --only paths   # the same cases, within the whole table

The cases (``cases(d)``) live in the library (:mod:`analysis.hostile_paths`), so that this script,
``experiments/hostile_inputs.py`` and ``tests/test_hostile_paths.py`` share them without one script
importing another.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from analysis.hostile import run_case
from analysis.hostile_paths import cases

__all__ = ["cases"]


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="schedlab-paths-") as tmp:
        rows = [run_case(c, Path(tmp), 120.0) for c in cases(Path(tmp))]
    bad = [r for r in rows if r["outcome"] not in ("clean error", "ok")]
    print(f"{len(rows)} cases: {len(rows) - len(bad)} as expected")
    for r in bad:
        print(f"[{r['outcome']}] {r['argv']}\n    rc={r['rc']} expected {r['expect']}: {r['stderr']}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
