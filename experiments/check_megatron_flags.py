"""Check the Megatron-LM flag and default tables (analysis.plan.megatron) against a Megatron-LM checkout.

    python experiments/check_megatron_flags.py --repo PATH/TO/Megatron-LM.git [--commit REV]

Every row names a file and a line; the line must add the flag (``'--flag'``) or hold the dataclass
field the flag is generated from (``flag_name:`` ; ``--disable-bias-linear`` is ``add_bias_linear``);
every DEFAULT_SOURCES row's line must hold its text.
Prints one line per flag and exits 1 if any row no longer matches: then update the table (and
MEGATRON_COMMIT) to the new lines.
"""

from __future__ import annotations

import argparse
import subprocess
import sys

from analysis.plan.megatron import DEFAULT_SOURCES, FLAG_SOURCES, MEGATRON_COMMIT

_FIELD_OF = {"--disable-bias-linear": "add_bias_linear"}


def matches(flag: str, line: str) -> bool:
    field = _FIELD_OF.get(flag, flag[2:].replace("-", "_"))
    return f"'{flag}'" in line or f'"{flag}"' in line or line.strip().startswith(f"{field}:")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repo", required=True, help="a Megatron-LM git directory (bare or not)")
    ap.add_argument("--commit", default=MEGATRON_COMMIT, help=f"the revision to read (default {MEGATRON_COMMIT[:12]})")
    args = ap.parse_args(argv)
    files: dict[str, list[str]] = {}
    bad = 0
    rows = [(flag, path, line, None) for flag, (path, line, _) in FLAG_SOURCES.items()]
    rows += [(key, path, line, text) for key, (path, line, text) in DEFAULT_SOURCES.items()]
    for flag, path, line, want in rows:
        if path not in files:
            got = subprocess.run(["git", "-C", args.repo, "show", f"{args.commit}:{path}"], capture_output=True,
                                 text=True)
            if got.returncode != 0:
                print(f"error: {path} at {args.commit}: {got.stderr.strip()}", file=sys.stderr)
                return 2
            files[path] = got.stdout.splitlines()
        text = files[path][line - 1] if line <= len(files[path]) else ""
        ok = matches(flag, text) if want is None else want in text
        bad += not ok
        print(f"{'ok ' if ok else 'BAD'} {flag:<40} {path}:{line}  {text.strip()[:70]}")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
