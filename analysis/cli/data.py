"""``python -m real.data prepare --input FILES --out PATH``: text to a byte-level token file.

    python -m real.data prepare --input README.md --out out/corpus.u16
    schedlab run --schedule 1f1b --pp 2 --microbatches 4 --data out/corpus.u16 --vocab 256 --seq 32
"""

from __future__ import annotations

from collections.abc import Sequence

from analysis.cli.common import OneLineParser, errors_to_exit, guarded
from real.data.tokens import prepare

__all__ = ["main"]


def parser(prog: str) -> OneLineParser:
    p = OneLineParser(prog=prog, description="Prepare token files for real training (--data).")
    sub = p.add_subparsers(dest="command", required=True, parser_class=OneLineParser)
    prep = sub.add_parser("prepare", help="tokenize text files at byte level (vocabulary 256)")
    prep.add_argument("--input", nargs="+", required=True, metavar="FILE", help="text files, concatenated")
    prep.add_argument("--out", required=True, metavar="PATH", help="the token file (uint16); PATH.json: its sidecar")
    return p


@guarded
def main(argv: Sequence[str] | None = None, prog: str = "python -m real.data") -> int:
    p = parser(prog)
    args = p.parse_args(argv)
    with errors_to_exit(p):
        meta = prepare(args.input, args.out)
    print(f"wrote {args.out}: {meta['tokens']} tokens (byte level, vocabulary {meta['vocab']}) from "
          f"{len(args.input)} file(s)")
    return 0
