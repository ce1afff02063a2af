"""``python -m real.data prepare --input FILES --out PATH``: text, JSON Lines or Parquet to a token file.

    python -m real.data prepare --input README.md --out out/corpus.u16
    python -m real.data prepare --input docs.jsonl --field text --tokenizer tokenizer.json --out out/docs.tok
    python -m real.data prepare --input docs.parquet --train-tokenizer bpe:4096 --out out/docs.tok
    schedlab run --schedule 1f1b --pp 2 --microbatches 4 --data out/corpus.u16 --vocab 256 --seq 32
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from analysis.cli.common import OneLineParser, errors_to_exit, guarded
from real.data.documents import Tokenizer, load_tokenizer, parse_train_spec
from real.data.tokens import prepare
from schedules import ConfigError

__all__ = ["main"]


def parser(prog: str) -> OneLineParser:
    p = OneLineParser(prog=prog, description="Prepare token files for real training (--data).")
    sub = p.add_subparsers(dest="command", required=True, parser_class=OneLineParser)
    prep = sub.add_parser("prepare", help="tokenize documents (byte level by default, vocabulary 256)")
    prep.add_argument("--input", nargs="+", required=True, metavar="FILE",
                      help="text files (one document each), .jsonl (one per line) or .parquet (one per row)")
    prep.add_argument("--out", required=True, metavar="PATH",
                      help="the token file (uint16, uint32 past 65536 tokens); PATH.json: its sidecar")
    prep.add_argument("--field", default="text", metavar="NAME", help="the text field of .jsonl/.parquet (text)")
    tok = prep.add_mutually_exclusive_group()
    tok.add_argument("--tokenizer", metavar="tokenizer.json", help="a Hugging Face tokenizer.json")
    tok.add_argument("--train-tokenizer", metavar="bpe:VOCAB",
                     help="train a byte-level BPE of VOCAB tokens on the inputs (saved as PATH.tokenizer.json)")
    prep.add_argument("--eot", metavar="TOKEN", help="the tokenizer's end-of-text token (default: the first of "
                      "<|endoftext|>, <|end_of_text|>, </s>, <eos> it has)")
    return p


@guarded
def main(argv: Sequence[str] | None = None, prog: str = "python -m real.data") -> int:
    p = parser(prog)
    args = p.parse_args(argv)
    with errors_to_exit(_subcommand(p, args.command)):  # a field's flag is the subcommand's
        tokenizer = _tokenizer(args)
        train = parse_train_spec(args.train_tokenizer) if args.train_tokenizer is not None else None
        meta = prepare(args.input, args.out, tokenizer, args.field, train_vocab=train)
    kind = "byte level" if meta["tokenizer"] == "bytes" else meta["tokenizer"]["kind"]
    print(f"wrote {args.out}: {meta['tokens']} tokens ({kind}, vocabulary {meta['vocab']}) from "
          f"{meta['documents']} document(s) in {len(args.input)} file(s)")
    return 0


def _subcommand(p: OneLineParser, name: str) -> OneLineParser:
    return next(a.choices[name] for a in p._actions if isinstance(a, argparse._SubParsersAction))


def _tokenizer(args) -> Tokenizer | None:
    if args.eot is not None and args.tokenizer is None:
        raise ConfigError("--eot names a token of --tokenizer; give --tokenizer too", field="eot")
    if args.tokenizer is not None:
        return load_tokenizer(args.tokenizer, args.eot)  # only read: prepare checks it is no output
    return None
