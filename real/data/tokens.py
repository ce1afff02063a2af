"""Token files: a flat uint16 or uint32 array read with pread (checked when opened), cut into windows of seq+1 tokens.

A file of N tokens holds ``(N - 1) // seq`` windows: window ``i`` is tokens
``i*seq .. i*seq + seq`` (inputs the first seq, targets the last seq), so
consecutive windows share one token and every token is predicted once. A
sidecar ``PATH.json`` (written by :func:`prepare`) gives the dtype and the
vocabulary; a file without one is refused (its dtype is never guessed: a
uint32 file read as uint16 would train on the halves of its tokens). :func:`prepare` tokenizes
text, JSON Lines or Parquet documents (:mod:`real.data.documents`): at byte
level (vocabulary 256: nothing to download), with a tokenizer.json or a BPE
trained on the inputs.

:class:`TokenBatches` is the data source of a run on a token file: the global
batch of a step is the next ``batch_size`` windows of an
:class:`real.data.sampler.EpochSampler` stream, replica ``d`` of ``dp`` reads its
contiguous share of them, and the stream position goes into checkpoints.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from common.errors import find_name, quote
from common.outputs import Output, atomic_write_all, check_paths
from real.config import RunConfig
from real.data.documents import MAX_VOCAB, Tokenizer, byte_tokenizer, encode_documents, read_documents, train_bpe
from real.data.sampler import EpochSampler
from schedules import CheckpointError, ConfigError

__all__ = ["BYTE_VOCAB", "DTYPES", "TokenBatches", "TokenFile", "prepare", "sidecar_vocab"]

log = logging.getLogger(__name__)

DTYPES = ("uint16", "uint32")
BYTE_VOCAB = 256


_CHUNK_TOKENS = 1 << 22  # tokens read at a time for the range check (8-16 MiB)


def _sidecar(path: Path) -> dict[str, Any]:
    """The checked sidecar ``PATH.json`` of a token file ({} if there is none): dtype and vocab, if given, valid."""
    side = path.with_name(path.name + ".json")
    if not side.is_file():
        raise ConfigError(f"token file {str(path)!r} has no sidecar {str(side)!r} to say its dtype; the tokens of "
                          f"a file are never guessed: write {{\"dtype\": \"uint16\", \"vocab\": N}} there (or "
                          "uint32), or make the file with python -m real.data prepare", field="token_file")
    try:
        meta = json.loads(side.read_bytes().decode("utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        why = "nested too deeply" if isinstance(exc, RecursionError) else " ".join(str(exc).split())
        raise ConfigError(f"token file sidecar {str(side)!r} is not valid JSON ({why})", field="token_file") from None
    if not isinstance(meta, dict):
        raise ConfigError(f"token file sidecar {str(side)!r} must hold a JSON object", field="token_file")
    dtype = find_name(meta.get("dtype"), DTYPES)
    if dtype is None:
        raise ConfigError(f"token file {str(path)!r}: dtype {quote(meta.get('dtype'))} in its sidecar; valid: "
                          f"{', '.join(DTYPES)}", field="token_file")
    vocab = meta.get("vocab")
    if vocab is not None and (not isinstance(vocab, int) or isinstance(vocab, bool) or not 1 <= vocab <= MAX_VOCAB):
        raise ConfigError(f"token file sidecar {str(side)!r}: vocab must be a positive integer, at most "
                          f"{MAX_VOCAB:,} (2^32), got {quote(vocab)}", field="token_file")
    return {**meta, "dtype": dtype}


def sidecar_vocab(path: str | Path) -> int | None:
    """The vocabulary a token file's sidecar gives (None: no sidecar, or none given there); ConfigError if invalid."""
    p = Path(path)
    side = p.with_name(p.name + ".json")
    return _sidecar(p).get("vocab") if p.is_file() and side.is_file() else None


class TokenFile:
    """The tokens of ``path`` and their windows of ``seq + 1``.

    Read with ``pread``, not a memory map: a file truncated while a run reads it is a ConfigError naming it,
    where a map would end the process with SIGBUS. Opening reads the file once in chunks for its largest
    token (:attr:`max_token`): a token the model's vocabulary does not hold is refused before training.
    """

    def __init__(self, path: str | Path, seq: int) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise ConfigError(f"token file {str(self.path)!r} does not exist; make one with "
                              "python -m real.data prepare", field="token_file")
        meta = _sidecar(self.path)
        self.dtype = meta["dtype"]
        self.vocab: int | None = meta.get("vocab")
        self.bytes, self.item = self.path.stat().st_size, np.dtype(self.dtype).itemsize
        if self.bytes % self.item:
            raise ConfigError(f"token file {str(self.path)!r} has {self.bytes} bytes, not a whole number of "
                              f"{self.dtype} tokens (is its sidecar's dtype right?)", field="token_file")
        self.num_tokens = self.bytes // self.item
        self.seq = seq
        self.num_windows = (self.num_tokens - 1) // seq if self.num_tokens else 0
        if self.num_windows < 1:
            raise ConfigError(f"token file {str(self.path)!r} has {self.num_tokens} tokens, fewer than one window "
                              f"of seq + 1 = {seq + 1}", field="token_file")
        self._fd = os.open(self.path, os.O_RDONLY)
        self.max_token, self.max_at = self._max()
        if self.vocab is not None:
            self.check_vocab(self.vocab, "its sidecar's vocab")

    def __del__(self) -> None:
        fd = getattr(self, "_fd", None)
        if fd is not None:
            os.close(fd)

    def _read(self, first: int, count: int) -> np.ndarray:
        """Tokens ``first .. first + count - 1``; ConfigError if the file has fewer now than when it was opened."""
        data = os.pread(self._fd, count * self.item, first * self.item)
        if len(data) != count * self.item:
            now = self.path.stat().st_size if self.path.exists() else 0
            raise ConfigError(f"token file {str(self.path)!r} was {self.bytes} bytes when opened and is {now} now: "
                              "it changed during the run; do not write a token file a run reads", field="token_file")
        return np.frombuffer(data, dtype=self.dtype)

    def _max(self) -> tuple[int, int]:
        """(the largest token, its first position), read in chunks."""
        best, at = -1, 0
        for first in range(0, self.num_tokens, _CHUNK_TOKENS):
            chunk = self._read(first, min(_CHUNK_TOKENS, self.num_tokens - first))
            i = int(chunk.argmax())
            if int(chunk[i]) > best:
                best, at = int(chunk[i]), first + i
        return best, at

    def check_vocab(self, vocab: int, whose: str) -> None:
        """ConfigError naming the first largest token if it is not below ``vocab`` (``whose`` vocabulary it is)."""
        if self.max_token < vocab:
            return
        if whose.startswith("its sidecar"):
            fix = f"the sidecar's dtype ({self.dtype}) or vocab is wrong"
            field = "token_file"
        else:
            fix = f"use a vocab of {self.max_token + 1} or more"
            field = "vocab"
        raise ConfigError(f"token file {str(self.path)!r} holds token {self.max_token} (at token {self.max_at}), "
                          f"not below {whose} {vocab}: {fix}", field=field)

    def windows(self, ids: Sequence[int] | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, targets) of windows ``ids``: int64 tensors of shape (len(ids), seq)."""
        rows = np.stack([self._read(i * self.seq, self.seq + 1).astype(np.int64)
                         for i in map(int, ids)]) if len(ids) else np.zeros((0, self.seq + 1), np.int64)
        t = torch.from_numpy(rows)
        return t[:, :-1].contiguous(), t[:, 1:].contiguous()


class TokenBatches:
    """Batches of a token file for a run: see the module doc. Position: windows consumed (saved in checkpoints)."""

    def __init__(self, file: TokenFile, batch_size: int, seed: int) -> None:
        self.file, self.batch_size = file, batch_size
        self.sampler = EpochSampler(file.num_windows, seed)
        self._anchor = (0, 0)  # (step, windows consumed before it)

    @classmethod
    def open(cls, config: RunConfig) -> TokenBatches:
        """The token file of ``config``, checked against its model (the built-in gpt: tokens < vocab)."""
        data = config.data
        file = TokenFile(data.token_file, data.model.seq)
        if data.factory is None:
            if data.model.kind != "gpt":
                raise ConfigError(f"a token file trains the gpt model, not {data.model.kind}", field="kind")
            if file.vocab is not None and file.vocab > data.model.vocab:
                raise ConfigError(f"token file {data.token_file!r} has a vocabulary of {file.vocab}, the model "
                                  f"{data.model.vocab}; use vocab {file.vocab} or more", field="vocab")
            file.check_vocab(data.model.vocab, "the model's vocab")
        return cls(file, data.batch_size, data.seed)

    def consumed(self, step: int) -> int:
        """Windows consumed before ``step`` runs."""
        step0, consumed0 = self._anchor
        return consumed0 + (step - step0) * self.batch_size

    def ids(self, step: int) -> torch.Tensor:
        """The window ids of the global batch of ``step``."""
        return self.sampler.take(self.consumed(step), self.batch_size)

    def replica_batch(self, step: int, dp: int, dp_rank: int) -> tuple[torch.Tensor, torch.Tensor]:
        share = self.batch_size // dp
        mine = self.ids(step)[dp_rank * share : (dp_rank + 1) * share]
        log.debug("step %d replica %d windows %s", step, dp_rank, ",".join(map(str, mine.tolist())))
        return self.file.windows(mine)

    def sample(self, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.file.windows(range(min(rows, self.file.num_windows)))

    def state(self, step: int) -> dict[str, Any]:
        epoch, offset = self.sampler.epoch_of(self.consumed(step))
        return {"consumed": self.consumed(step), "epoch": epoch, "offset": offset,
                "windows": self.file.num_windows, "seed": self.sampler.seed}

    def restore(self, step: int, state: dict[str, Any] | None) -> None:
        """Continue at ``step`` from the saved position; CheckpointError if it is of other data."""
        if state is None or "consumed" not in state:
            raise CheckpointError("the checkpoint holds no data position (it was written without a token file); "
                                  "resume it without one, or use another checkpoint directory", field="directory")
        if state.get("windows") != self.file.num_windows or state.get("seed") != self.sampler.seed:
            raise CheckpointError(f"the checkpoint's data position is of {state.get('windows')} windows with seed "
                                  f"{state.get('seed')}; this token file has {self.file.num_windows} windows of "
                                  f"seq {self.file.seq}, seed {self.sampler.seed}", field="directory")
        self._anchor = (step, int(state["consumed"]))
        log.info("data position: epoch %d, window %d of %d", state.get("epoch", 0), state.get("offset", 0),
                 self.file.num_windows)


def prepare(inputs: Sequence[str | Path], out: str | Path, tokenizer: Tokenizer | None = None,
            field: str = "text", *, train_vocab: int | None = None) -> dict[str, Any]:
    """Tokenize ``inputs`` (text, JSON Lines or Parquet: :mod:`real.data.documents`) into ``out``.

    ``tokenizer`` None is byte level (one uint16 token per byte, a newline between documents);
    ``train_vocab``: train a byte-level BPE of that many tokens on the inputs instead, saved as
    ``out.tokenizer.json``. Every path is checked first (:func:`common.outputs.check_paths`: no output is an
    input, the tokenizer read included); then ``out``, its sidecar ``out.json`` and the trained tokenizer are
    written all or none. Returns the sidecar's record.
    """
    if tokenizer is not None and train_vocab is not None:
        raise ConfigError("give a tokenizer or train_vocab, not both", field="train_tokenizer")
    trained = f"{out}.tokenizer.json" if train_vocab is not None else None
    sources = {f"input #{i + 1}": p for i, p in enumerate(inputs)}
    if tokenizer is not None and tokenizer.record.get("path"):
        sources["tokenizer"] = tokenizer.record["path"]
    check_paths({"token file": Output(out, "token file"), "token file sidecar": Output(f"{out}.json", "token file sidecar"),
                 "trained tokenizer": Output(trained, "trained tokenizer") if trained else None}, sources)
    for path in inputs:
        if not Path(path).is_file():
            raise ConfigError(f"input {str(path)!r} is not a file", field="input")
    if trained is not None:
        def docs() -> Iterator[bytes]:
            return itertools.chain.from_iterable(read_documents(path, field) for path in inputs)

        if not any(docs()):  # refused before training (which would warn about it first)
            raise ConfigError("the inputs hold no text to tokenize", field="input")
        tokenizer = train_bpe(docs(), train_vocab, trained)
    tokenizer = tokenizer or byte_tokenizer()
    tokens, docs = encode_documents(inputs, tokenizer, field)
    meta = {"dtype": str(tokens.dtype), "vocab": tokenizer.vocab, "tokens": len(tokens),
            "tokenizer": tokenizer.describe(), "documents": docs, "field": field, "sources": [str(p) for p in inputs]}
    files = [(out, lambda tmp: tokens.tofile(tmp), "token file"),  # all of them, or none
             (f"{out}.json", lambda tmp: Path(tmp).write_text(json.dumps(meta, indent=1)), "token file sidecar")]
    if trained is not None:
        files.append((trained, lambda tmp: Path(tmp).write_text(tokenizer.backend.to_str()), "trained tokenizer"))
    atomic_write_all(files)
    return meta
