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
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from common import parse
from common.errors import quote
from schedules import ConfigError

__all__ = ["EOT_CANDIDATES", "MAX_BPE_VOCAB", "MAX_VOCAB", "Tokenizer", "byte_tokenizer", "encode_documents",
           "load_tokenizer", "located_documents", "parse_train_spec", "read_documents", "text_documents", "train_bpe"]

log = logging.getLogger(__name__)

#: The largest vocabulary a token file holds: its ids are uint32 at most, and a model's embedding has a row per id.
MAX_VOCAB = 2**32
#: A trained BPE's vocabulary: 256 bytes and <|endoftext|> at least; at most 2^20 tokens. The trainer allocates per
#: token (bpe:4294967296 asked for 283 GB and aborted), and the largest vocabularies in use are about 2^18 (Gemma's
#: 256,000), so 2^20 is far beyond any real one.
MIN_BPE_VOCAB, MAX_BPE_VOCAB = 257, 2**20
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


def _text(doc: bytes, where: str = "an input") -> str:
    try:
        return doc.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{where} is not UTF-8 text (byte {exc.start}: {exc.reason}); a tokenizer reads text, "
                          "byte level reads any bytes", field="input") from None


def _cut(text: str, most: int = 200) -> str:
    """``text`` on one line, at most ``most`` characters (a file's list of keys can be long)."""
    text = " ".join(text.split())
    return text if len(text) <= most else text[: most - 3] + "..."


def _one_line(exc: BaseException) -> str:
    """A library's message on one line (pyarrow's run over several)."""
    return " ".join(str(exc).split()) or type(exc).__name__


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


def _vocab(backend: Any) -> int:
    """The ids a tokenizer can give: its largest id + 1, not its count of tokens (a vocabulary with gaps, such as
    {"a": 0, "b": 5000}, counts 2 tokens and gives id 5000)."""
    ids = backend.get_vocab(with_added_tokens=True).values()
    return max(ids, default=-1) + 1


def load_tokenizer(path: str | Path, eot: str | None = None) -> Tokenizer:
    """A Hugging Face ``tokenizer.json`` (``tokenizers.Tokenizer.from_file``); its vocabulary is its largest id + 1."""
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
    vocab = _vocab(backend)
    if vocab > MAX_VOCAB:
        raise ConfigError(f"tokenizer {str(p)!r} has token ids up to {vocab - 1:,}; a token file holds ids below "
                          f"{MAX_VOCAB:,} (2^32, uint32): give another tokenizer", field="tokenizer")
    return Tokenizer("tokenizer.json", vocab, tid, backend, record)


def parse_train_spec(text: str) -> int:
    """``bpe:VOCAB`` -> VOCAB, from 257 (the 256 bytes and the end-of-text token) to :data:`MAX_BPE_VOCAB`."""
    kind, _, number = text.strip().partition(":")
    vocab = parse.int_text(number) if kind.casefold() == "bpe" else None
    if vocab is None or not MIN_BPE_VOCAB <= vocab <= MAX_BPE_VOCAB:
        raise ConfigError(f"train_tokenizer {quote(text)}: write bpe:VOCAB with VOCAB from {MIN_BPE_VOCAB} (256 "
                          f"bytes and <|endoftext|>) to {MAX_BPE_VOCAB:,} (2^20), e.g. bpe:4096",
                          field="train_tokenizer")
    return vocab


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
    got = _vocab(backend)
    if got < vocab:
        log.warning("the inputs hold too little text for %d BPE tokens: %d learned", vocab, got)
    record = {"path": str(Path(save).resolve()), "eot": BPE_EOT, "trained_vocab": vocab}
    return Tokenizer("bpe", got, backend.token_to_id(BPE_EOT), backend, record)


def read_documents(path: str | Path, field: str = "text") -> Iterator[bytes]:
    """The documents of one input as UTF-8 bytes (see the module doc for the formats)."""
    for _, doc in located_documents([path], field):
        yield doc


def text_documents(inputs: Sequence[str | Path], field: str = "text") -> Iterator[bytes]:
    """The documents of ``inputs``, each checked to be UTF-8 text (what a tokenizer reads); ConfigError naming
    the file (and line or row) of the first that is not."""
    for where, doc in located_documents(inputs, field):
        _text(doc, where)
        yield doc


def located_documents(inputs: Sequence[str | Path], field: str = "text") -> Iterator[tuple[str, bytes]]:
    """(where, document) of every document of ``inputs``: where is the file, ``FILE:LINE`` or ``FILE row N``."""
    for path in inputs:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"input {str(p)!r} is not a file", field="input")
        if p.suffix.casefold() == ".jsonl":
            yield from _jsonl(p, field)
        elif p.suffix.casefold() == ".parquet":
            yield from _parquet(p, field)
        else:
            yield str(p), p.read_bytes()


def _jsonl(p: Path, field: str) -> Iterator[tuple[str, bytes]]:
    with p.open("rb") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{p}:{n}"
            try:
                record = json.loads(line.decode("utf-8"))
            except UnicodeDecodeError as exc:
                raise ConfigError(f"{where}: not UTF-8 (byte {exc.start}: {exc.reason}); JSON Lines are UTF-8 text",
                                  field="input") from None
            except (json.JSONDecodeError, RecursionError) as exc:
                why = "nested too deeply" if isinstance(exc, RecursionError) else _one_line(exc)
                raise ConfigError(f"{where}: not a JSON object ({why})", field="input") from None
            value = record.get(field) if isinstance(record, dict) else None
            if not isinstance(value, str):
                keys = ", ".join(record) if isinstance(record, dict) else type(record).__name__
                raise ConfigError(f"{where}: no string field {field!r} (it has: {_cut(keys)}); choose one as field",
                                  field="field")
            try:
                yield where, value.encode("utf-8")
            except UnicodeEncodeError as exc:  # a lone surrogate, "\ud800": valid JSON, not text
                raise ConfigError(f"{where}: field {field!r} holds a lone surrogate {exc.object[exc.start]!r} at "
                                  f"character {exc.start}, which is not text; remove it or pair it",
                                  field="input") from None


def _string_column(kind: Any) -> bool:
    """A string column: utf8, large utf8, string view, or dictionary-encoded strings (pandas' categories)."""
    import pyarrow as pa

    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    return pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_string_view(kind)


def _parquet(p: Path, field: str) -> Iterator[tuple[str, bytes]]:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise ConfigError(f"{p}: reading Parquet needs pyarrow: pip install -e '.[data]'", field="input") from None
    try:
        pf = pq.ParquetFile(p)
        names = pf.schema_arrow.names
        kind = pf.schema_arrow.field(field).type if field in names else None
        if kind is None or not _string_column(kind):
            raise ConfigError(f"{p}: no string column {field!r} (it has: {_cut(', '.join(names))}); choose one "
                              "as field", field="field")
        row = 0
        for batch in pf.iter_batches(columns=[field]):
            for value in batch.column(0).to_pylist():
                row += 1
                if value is not None:
                    yield f"{p} row {row}", value.encode("utf-8")
    except (pa.ArrowException, OSError, UnicodeError) as exc:
        raise ConfigError(f"{p}: not a Parquet file pyarrow can read ({_one_line(exc)[:200]})", field="input") from None


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
            wide = np.asarray(ids, np.int64)
            if len(wide) and not 0 <= int(wide.min()) <= int(wide.max()) < tokenizer.vocab:
                bad = int(wide.max()) if int(wide.max()) >= tokenizer.vocab else int(wide.min())
                raise ConfigError(f"the {tokenizer.kind} tokenizer gave token {bad}, outside its vocabulary of "
                                  f"{tokenizer.vocab} (ids 0 to {tokenizer.vocab - 1}); its vocabulary is not the one "
                                  "it encodes with: give another tokenizer", field="tokenizer")
            parts.append(wide.astype(dtype))
        batch.clear()

    documents = located_documents(inputs, field) if tokenizer.backend is None else (
        ("", doc) for doc in text_documents(inputs, field))
    for _, doc in documents:
        batch.append(doc)
        docs += 1
        if len(batch) == _ENCODE_BATCH:
            flush()
    flush()
    tokens = np.concatenate(parts) if parts else np.zeros(0, dtype)
    if not len(tokens):
        raise ConfigError("the inputs hold no text to tokenize", field="input")
    return tokens, docs
