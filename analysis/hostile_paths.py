"""Hostile paths: every input and output of a command through the one output policy (``common/outputs.py``).

:func:`cases` builds, under a folder, the files each case points at and returns the cases
(:class:`analysis.hostile.Case`, group ``paths``): a tokenizer, events, metrics or a curve file
that is also an input, two outputs that are one file (through a symbolic link too), an appended
file that is a directory, a checkpoint directory another run holds. Each case gives its exact
one-line message and the files that must be byte-identical afterwards. Every refusal happens
before torchrun would start, so no case launches one. ``experiments/hostile_inputs.py`` runs them as
subprocesses; ``tests/test_hostile_paths.py`` runs them in-process.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from analysis.hostile import Case
from common.errors import quote

__all__ = ["GROUP", "SMALL", "cases", "live_lock"]

GROUP = "paths"
PY = sys.executable
SMALL = ["--layers", "2", "--dim", "16", "--heads", "2", "--vocab", "256", "--seq", "8"]
LIGHTHOUSE = "http://127.0.0.1:9"  # never reached: every case is refused before a replica contacts it


def _tokenizer_json() -> str:
    """A tiny valid tokenizer.json (a word-level vocabulary with an end-of-text token)."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace

    tok = Tokenizer(WordLevel({"<|endoftext|>": 0, "[UNK]": 1, "hello": 2, "world": 3}, unk_token="[UNK]"))
    tok.pre_tokenizer = Whitespace()
    return tok.to_str()


def live_lock(directory: Path, pid: int, run: str | None = None) -> None:
    """A checkpoint directory's LOCK held by process ``pid`` of this host (it must be alive: the lock is live)."""
    import socket

    stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "LOCK").write_text(json.dumps({"host": socket.gethostname(), "pid": pid, "start": stat[19],
                                                "since": "2026-01-01 00:00:00 UTC", "run": run}))


def _files(h: Path) -> None:
    h.mkdir(parents=True, exist_ok=True)
    (h / "corpus.txt").write_text("hello world\n" * 40)
    (h / "empty.txt").write_text("")
    (h / "t.json").write_text(_tokenizer_json())
    (h / "mine.tokenizer.json").write_text("hello world, my notes\n")
    (h / "link.tokenizer.json").symlink_to(h / "corpus.txt")
    (h / "dir.json").mkdir()
    (h / "dir.tokenizer.json").write_text("an old tokenizer")
    (h / "e.tokenizer.json").write_text("an old tokenizer")
    (h / "tokens.u16").write_bytes(bytes(range(64)) * 4)
    (h / "tb").mkdir()
    (h / "tb" / "metrics.jsonl").write_bytes(bytes(range(64)) * 4)  # a token file that happens to be named so
    (h / "tb2" / "metrics.jsonl").mkdir(parents=True)
    (h / "ev").mkdir()
    (h / "o").mkdir()
    (h / "o" / "time-to-loss.csv").write_text("step,loss\n0,3.0\n1,2.0\n")
    (h / "c").mkdir()
    (h / "c" / "comparison.csv").write_text("0F0,0F1,0B0,0B1\n1F0,1F1,1B0,1B1\n")
    (h / "params.pt").write_text("not yet written")
    os.link(h / "params.pt", h / "hard.jsonl")
    live_lock(h / "ck", os.getppid() if os.getppid() > 1 else os.getpid())


def cases(d: Path) -> list[Case]:
    """The cases of group ``paths``, their files made under ``d / "paths"``."""
    h = d / "paths"
    _files(h)
    out: list[Case] = []

    def add(argv: list, message: str | None, keep: tuple = (), expect: str = "error") -> None:
        out.append(Case(GROUP, tuple(map(str, argv)), expect, None, message, tuple(map(str, keep))))

    def q(path: Path | str) -> str:
        return quote(str(path))

    def destroys(what: str, path: Path, source: str, harm: str = "writing it would destroy") -> str:
        return f"{what} {q(path)} is also an input ({source}); {harm} the input: give the output another name"

    def appends(what: str, path: Path, source: str) -> str:
        return destroys(what, path, source, "appending to it would change")

    prep = [PY, "-m", "real.data", "prepare", "--input"]
    run = [PY, "-m", "analysis", "run", "--schedule", "gpipe", "--pp", "1", "--microbatches", "2", "--steps", "1",
           *SMALL]
    live = [PY, "-m", "analysis", "run", "--elastic", "live", "--lighthouse", LIGHTHOUSE, "--steps", "1", *SMALL]
    corpus, tok = h / "corpus.txt", h / "t.json"

    # -- tokenizers: read and trained, inside the check that outputs differ from inputs ---------------------------
    add([*prep, corpus, "--out", tok, "--tokenizer", tok], destroys("token file", tok, "tokenizer"), (tok, corpus))
    add([*prep, corpus, "--out", h / "x", "--tokenizer", tok], None, (tok, corpus), expect="ok")
    add([*prep, h / "mine.tokenizer.json", "--out", h / "mine", "--train-tokenizer", "bpe:300"],
        destroys("trained tokenizer", h / "mine.tokenizer.json", "input #1"), (h / "mine.tokenizer.json",))
    add([*prep, corpus, "--out", h / "link", "--train-tokenizer", "bpe:300"],
        destroys("trained tokenizer", h / "link.tokenizer.json", "input #1"), (corpus,))
    add([*prep, h / "empty.txt", "--out", h / "e", "--train-tokenizer", "bpe:300"],
        "the inputs hold no text to tokenize (flag --input)", (h / "e.tokenizer.json",))
    add([*prep, corpus, "--out", h / "dir", "--train-tokenizer", "bpe:300"],
        f"token file sidecar {q(h / 'dir.json')} is a directory; give a file name", (h / "dir.tokenizer.json", corpus))
    add([*prep, corpus, "--out", h / "bpe", "--train-tokenizer", "bpe:300"], None, (corpus,), expect="ok")

    # -- files appended to: --events and the metrics file of --log-dir -------------------------------------------
    data, metrics = h / "tokens.u16", h / "tb" / "metrics.jsonl"
    add([*live, "--events", data, "--data", data], appends("--events", data, "--data"), (data,))
    add([*live, "--events", h / "ev"], f"events file {q(h / 'ev')} is a directory; give a file name")
    add([*live, "--events", h / "hard.jsonl", "--data", h / "params.pt"],  # one inode under two names
        appends("--events", h / "hard.jsonl", "--data"), (h / "params.pt",))
    add([*run, "--data", metrics, "--log-dir", h / "tb"], appends("the metrics file of --log-dir", metrics, "--data"),
        (metrics,))
    add([*run, "--save-params", metrics, "--log-dir", h / "tb"],
        f"--save-params and the metrics file of --log-dir name the same file {q(metrics)}; one would overwrite the "
        "other: give each output its own name", (metrics,))
    add([*run, "--log-dir", h / "tb2"], f"metrics file {q(h / 'tb2' / 'metrics.jsonl')} is a directory; give a file "
        "name")
    add([*run, "--trace", h / "tb" / "t.csv", "--data", h / "tb" / "t.csv"],
        destroys("--trace", h / "tb" / "t.csv", "--data"))

    # -- compare: its own input curve, schedule and cost files ---------------------------------------------------
    curve = h / "o" / "time-to-loss.csv"
    add([PY, "-m", "analysis", "compare", "--time-to-loss", "2.5", "--model", "gpt-6.2b", "--cluster", "dgx-h100",
         "--pp", "8", "--schedules", "1f1b", "--curve", f"ddp={curve}", "--out", h / "o"],
        destroys("--out time-to-loss.csv", curve, "--curve ddp"), (curve,))
    costs = h / "c" / "comparison.csv"
    add([PY, "-m", "analysis", "compare", "--pp", "2", "--microbatches", "2", "--costs", costs, "--out", h / "c"],
        destroys("--out comparison.csv", costs, "--costs"), (costs,))

    # -- checkpoints: a live replica honours the LOCK another run holds ------------------------------------------
    holder = json.loads((h / "ck" / "LOCK").read_text())
    add([*live, "--checkpoint-dir", h / "ck", "--checkpoint-every", "1"],
        f"checkpoint directory {q(h / 'ck')} is in use by another run (PID {holder['pid']} on this host, since "
        f"{holder['since']}); wait for it to end or give another checkpoint directory (flag --checkpoint-dir)",
        (h / "ck" / "LOCK",))
    return out

