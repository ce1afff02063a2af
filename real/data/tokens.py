"""Token files: a flat uint16 or uint32 array read through a memmap, cut into windows of seq+1 tokens.

A file of N tokens holds ``(N - 1) // seq`` windows: window ``i`` is tokens
``i*seq .. i*seq + seq`` (inputs the first seq, targets the last seq), so
consecutive windows share one token and every token is predicted once. A
sidecar ``PATH.json`` (written by :func:`prepare`) gives the dtype and the
vocabulary; without one the file is read as uint16. :func:`prepare` tokenizes
text at byte level (vocabulary 256: nothing to download).

:class:`TokenBatches` is the data source of a run on a token file: the global
batch of a step is the next ``batch_size`` windows of an
:class:`real.sampler.EpochSampler` stream, replica ``d`` of ``dp`` reads its
contiguous share of them, and the stream position goes into checkpoints.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from real.config import RunConfig
from real.sampler import EpochSampler
from schedules import CheckpointError, ConfigError
from schedules.outputs import atomic_write_all, check_distinct, check_output_file

__all__ = ["BYTE_VOCAB", "DTYPES", "TokenBatches", "TokenFile", "prepare"]

log = logging.getLogger(__name__)

DTYPES = ("uint16", "uint32")
BYTE_VOCAB = 256


class TokenFile:
    """The tokens of ``path`` (memory-mapped) and their windows of ``seq + 1``."""

    def __init__(self, path: str | Path, seq: int) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise ConfigError(f"token file {str(self.path)!r} does not exist; make one with "
                              "python -m real.data prepare", field="token_file")
        meta = self._meta()
        self.dtype = meta.get("dtype", "uint16")
        if self.dtype not in DTYPES:
            raise ConfigError(f"token file {str(self.path)!r}: dtype {self.dtype!r} in its sidecar; valid: "
                              f"{', '.join(DTYPES)}", field="token_file")
        self.vocab: int | None = meta.get("vocab")
        size, item = self.path.stat().st_size, np.dtype(self.dtype).itemsize
        if size % item:
            raise ConfigError(f"token file {str(self.path)!r} has {size} bytes, not a whole number of {self.dtype} "
                              "tokens", field="token_file")
        self.tokens = np.memmap(self.path, dtype=self.dtype, mode="r") if size else np.zeros(0, self.dtype)
        self.seq = seq
        self.num_windows = (len(self.tokens) - 1) // seq if len(self.tokens) else 0
        if self.num_windows < 1:
            raise ConfigError(f"token file {str(self.path)!r} has {len(self.tokens)} tokens, fewer than one window "
                              f"of seq + 1 = {seq + 1}", field="token_file")

    def _meta(self) -> dict[str, Any]:
        side = self.path.with_name(self.path.name + ".json")
        if not side.is_file():
            return {}
        try:
            meta = json.loads(side.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ConfigError(f"token file sidecar {str(side)!r} is not valid JSON ({exc})", field="token_file") from None
        if not isinstance(meta, dict):
            raise ConfigError(f"token file sidecar {str(side)!r} must hold a JSON object", field="token_file")
        return meta

    def windows(self, ids: Sequence[int] | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, targets) of windows ``ids``: int64 tensors of shape (len(ids), seq)."""
        rows = np.stack([np.asarray(self.tokens[i * self.seq : i * self.seq + self.seq + 1], dtype=np.int64)
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


def prepare(inputs: Sequence[str | Path], out: str | Path) -> dict[str, Any]:
    """Tokenize ``inputs`` at byte level (one token per byte, a newline between files) into ``out`` (uint16).

    Writes ``out`` and its sidecar ``out.json`` atomically; returns the sidecar's record.
    """
    outputs = {"token file": out, "token file sidecar": f"{out}.json"}
    for what, path in outputs.items():
        check_output_file(path, what)
    check_distinct(outputs, {f"input #{i + 1}": p for i, p in enumerate(inputs)})
    chunks = []
    for path in inputs:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"input {str(p)!r} is not a file", field="input")
        chunks.append(p.read_bytes())
    data = b"\n".join(chunks)
    if not data:
        raise ConfigError("the inputs hold no text to tokenize", field="input")
    tokens = np.frombuffer(data, dtype=np.uint8).astype(np.uint16)
    meta = {"dtype": "uint16", "vocab": BYTE_VOCAB, "tokens": len(tokens), "tokenizer": "bytes",
            "sources": [str(p) for p in inputs]}
    atomic_write_all([(out, lambda tmp: tokens.tofile(tmp), "token file"),  # both files, or neither
                      (f"{out}.json", lambda tmp: Path(tmp).write_text(json.dumps(meta, indent=1)), "token file sidecar")])
    return meta
