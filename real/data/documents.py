"""Documents and tokenizers for token files: text, JSON Lines and Parquet in; byte level, tokenizer.json or a trained BPE.

:func:`read_documents` yields the documents of one input as UTF-8 bytes: a text
file is one document (its bytes as they are), a JSON Lines file (``.jsonl``)
one per line and a Parquet file (``.parquet``) one per row, both from the
string field ``field``. :func:`encode_documents` turns them into one token
array: documents are separated by the tokenizer's end-of-text token.

Tokenizers (:class:`Tokenizer`):

* byte level (:func:`byte_tokenizer`, the default, needs nothing): one token per
  byte, vocabulary 256. All 256 ids are bytes, so there is no room for an
  end-of-text token: documents are separated by a newline byte (10).
* a Hugging Face ``tokenizer.json`` (:func:`load_tokenizer`, through the
  ``tokenizers`` library): its end-of-text token is the first of
  :data:`EOT_CANDIDATES` it has, or the one named.
* a byte-level BPE trained on the inputs (:func:`train_bpe`), with
  ``<|endoftext|>`` as its end-of-text token; it is saved as a ``tokenizer.json``
  next to the token file, so the run can be decoded and repeated.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from schedules import ConfigError

__all__ = ["EOT_CANDIDATES", "Tokenizer", "byte_tokenizer", "encode_documents", "load_tokenizer",
           "parse_train_spec", "read_documents", "train_bpe"]

log = logging.getLogger(__name__)

#: End-of-text tokens looked for in a tokenizer.json, in this order (GPT-2, Llama 3, Llama 2/T5, Gemma).
EOT_CANDIDATES = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>")
BPE_EOT = "<|endoftext|>"
_ENCODE_BATCH = 1024  # documents per tokenizers.encode_batch call


@dataclass
class Tokenizer:
    """A tokenizer as a token file needs it: ``encode`` bytes -> ids, the vocabulary, the separator id."""

    kind: str  # "bytes", "tokenizer.json" or "bpe"
    vocab: int
    separator: int
    backend: Any = None  # a tokenizers.Tokenizer, None at byte level
    record: dict[str, Any] = field(default_factory=dict)  # what the sidecar says about it

    def encode(self, docs: Sequence[bytes]) -> list[Sequence[int]]:
        if self.backend is None:
            return [np.frombuffer(d, np.uint8) for d in docs]
        texts = [_text(d) for d in docs]
        return [e.ids for e in self.backend.encode_batch(texts, add_special_tokens=False)]

    def describe(self) -> dict[str, Any] | str:
        return "bytes" if self.backend is None else {"kind": self.kind, "vocab": self.vocab,
                                                     "eot_id": self.separator, **self.record}


def _text(doc: bytes) -> str:
    try:
        return doc.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"an input is not UTF-8 text ({exc}); a tokenizer reads text, byte level reads any "
                          "bytes", field="input") from None


def byte_tokenizer() -> Tokenizer:
    return Tokenizer("bytes", 256, separator=ord("\n"))


def _tokenizers():
    try:
        import tokenizers
    except ImportError:
        raise ConfigError("a tokenizer needs the tokenizers library: pip install -e '.[data]'",
                          field="tokenizer") from None
    return tokenizers


def _eot(backend: Any, name: str | None, where: str) -> tuple[str, int]:
    for token in (name,) if name is not None else EOT_CANDIDATES:
        tid = backend.token_to_id(token)
        if tid is not None:
            return token, tid
    if name is not None:
        raise ConfigError(f"{where} has no token {name!r}; name one of its special tokens as eot", field="eot")
    raise ConfigError(f"{where} has none of the end-of-text tokens {', '.join(EOT_CANDIDATES)}; "
                      "name its end-of-text token as eot", field="eot")


def load_tokenizer(path: str | Path, eot: str | None = None) -> Tokenizer:
    """A Hugging Face ``tokenizer.json`` (``tokenizers.Tokenizer.from_file``)."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"tokenizer {str(p)!r} is not a file; give a Hugging Face tokenizer.json", field="tokenizer")
    try:
        backend = _tokenizers().Tokenizer.from_file(str(p))
    except Exception as exc:  # tokenizers raises a bare Exception on a malformed file
        raise ConfigError(f"tokenizer {str(p)!r} is not a tokenizer.json the tokenizers library reads ({exc})",
                          field="tokenizer") from None
    token, tid = _eot(backend, eot, f"tokenizer {str(p)!r}")
    record = {"path": str(p.resolve()), "sha256": hashlib.sha256(p.read_bytes()).hexdigest(), "eot": token}
    return Tokenizer("tokenizer.json", backend.get_vocab_size(with_added_tokens=True), tid, backend, record)


def parse_train_spec(text: str) -> int:
    """``bpe:VOCAB`` -> VOCAB (at least 257: the 256 bytes and the end-of-text token)."""
    m = re.fullmatch(r"bpe:(\d+)", text.strip())
    if m is None or int(m[1]) < 257:
        raise ConfigError(f"train_tokenizer {text!r}: write bpe:VOCAB with VOCAB >= 257 (256 bytes and "
                          "<|endoftext|>), e.g. bpe:4096", field="train_tokenizer")
    return int(m[1])


def train_bpe(docs: Iterable[bytes], vocab: int, save: str | Path) -> Tokenizer:
    """A byte-level BPE of ``vocab`` tokens trained on ``docs``; ``save``: where its tokenizer.json will be (the
    record says so). Nothing is written here: :func:`real.data.tokens.prepare` writes it with the token file,
    all or none, once every path was checked (``backend.to_str()``)."""
    tk = _tokenizers()
    backend = tk.Tokenizer(tk.models.BPE())
    backend.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = tk.decoders.ByteLevel()
    trainer = tk.trainers.BpeTrainer(vocab_size=vocab, special_tokens=[BPE_EOT], show_progress=False,
                                     initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet())
    backend.train_from_iterator((_text(d) for d in docs), trainer=trainer)
    got = backend.get_vocab_size(with_added_tokens=True)
    if got < vocab:
        log.warning("the inputs hold too little text for %d BPE tokens: %d learned", vocab, got)
    record = {"path": str(Path(save).resolve()), "eot": BPE_EOT, "trained_vocab": vocab}
    return Tokenizer("bpe", got, backend.token_to_id(BPE_EOT), backend, record)


def read_documents(path: str | Path, field: str = "text") -> Iterator[bytes]:
    """The documents of one input as UTF-8 bytes (see the module doc for the formats)."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"input {str(p)!r} is not a file", field="input")
    if p.suffix == ".jsonl":
        yield from _jsonl(p, field)
    elif p.suffix == ".parquet":
        yield from _parquet(p, field)
    else:
        yield p.read_bytes()


def _jsonl(p: Path, field: str) -> Iterator[bytes]:
    with p.open("rb") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                raise ConfigError(f"{p}:{n}: not a JSON object ({exc})", field="input") from None
            value = record.get(field) if isinstance(record, dict) else None
            if not isinstance(value, str):
                keys = ", ".join(record) if isinstance(record, dict) else type(record).__name__
                raise ConfigError(f"{p}:{n}: no string field {field!r} (it has: {keys}); choose one as field",
                                  field="field")
            yield value.encode("utf-8")


def _parquet(p: Path, field: str) -> Iterator[bytes]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pf = pq.ParquetFile(p)
    names = pf.schema_arrow.names
    kind = pf.schema_arrow.field(field).type if field in names else None
    if kind is None or not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        raise ConfigError(f"{p}: no string column {field!r} (it has: {', '.join(names)}); choose one as field",
                          field="field")
    for batch in pf.iter_batches(columns=[field]):
        for value in batch.column(0).to_pylist():
            if value is not None:
                yield value.encode("utf-8")


def encode_documents(inputs: Sequence[str | Path], tokenizer: Tokenizer, field: str = "text"
                     ) -> tuple[np.ndarray, int]:
    """All documents of ``inputs`` as one token array (uint16, or uint32 past 65536), separated: (tokens, docs)."""
    dtype = np.uint16 if tokenizer.vocab <= 2**16 else np.uint32
    parts: list[np.ndarray] = []
    docs = 0
    batch: list[bytes] = []

    def flush() -> None:
        for ids in tokenizer.encode(batch):
            if parts:
                parts.append(np.array([tokenizer.separator], dtype))
            parts.append(np.asarray(ids, dtype))
        batch.clear()

    for path in inputs:
        for doc in read_documents(path, field):
            batch.append(doc)
            docs += 1
            if len(batch) == _ENCODE_BATCH:
                flush()
    flush()
    tokens = np.concatenate(parts) if parts else np.zeros(0, dtype)
    if not len(tokens):
        raise ConfigError("the inputs hold no text to tokenize", field="input")
    return tokens, docs
