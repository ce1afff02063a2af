"""Token files from real tokenizers and datasets: tokenizer.json, a trained BPE, JSON Lines and Parquet.

No downloads: the tests train their own tiny tokenizer.json with the tokenizers library.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys

import numpy as np
import pytest

tokenizers = pytest.importorskip("tokenizers", reason="the data extra: pip install -e '.[data]'")

from analysis.cli.data import main as data_main  # noqa: E402
from real.data.documents import load_tokenizer, parse_train_spec  # noqa: E402
from real.data.tokens import TokenFile  # noqa: E402
from schedules import ConfigError  # noqa: E402

DOCS = ["the pipeline sends activations forward", "the gradients flow backward through the stages",
        "zero bubble schedules split the backward pass", "a microbatch is a slice of the batch"]


def _tokenizer_json(path, eot: str | None = "<|endoftext|>", vocab: int = 300) -> str:
    """A byte-level BPE tokenizer.json trained here on DOCS (what a Hugging Face model ships, in small)."""
    tk = tokenizers
    tok = tk.Tokenizer(tk.models.BPE())
    tok.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tk.decoders.ByteLevel()
    trainer = tk.trainers.BpeTrainer(vocab_size=vocab, special_tokens=[eot] if eot else [], show_progress=False,
                                     initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(DOCS * 20, trainer=trainer)
    tok.save(str(path))
    return str(path)


def _jsonl(path, docs=DOCS, key="text") -> str:
    path.write_text("".join(json.dumps({"id": i, key: d}) + "\n" for i, d in enumerate(docs)))
    return str(path)


def _prepare(*argv: str, capsys) -> tuple[int, str, str]:
    try:
        code = data_main(["prepare", *argv])
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def test_byte_level_jsonl_documents_are_separated_by_a_newline(tmp_path, capsys):
    out = tmp_path / "b.u16"
    code, text, _ = _prepare("--input", _jsonl(tmp_path / "d.jsonl", ["ab", "c"]), "--out", str(out), capsys=capsys)
    assert code == 0 and text == f"wrote {out}: 4 tokens (byte level, vocabulary 256) from 2 document(s) in 1 file(s)\n"
    assert np.fromfile(out, np.uint16).tolist() == [97, 98, 10, 99]
    meta = json.loads((tmp_path / "b.u16.json").read_text())
    assert (meta["tokenizer"], meta["vocab"], meta["documents"], meta["field"]) == ("bytes", 256, 2, "text")


def test_a_tokenizer_json_encodes_each_document_and_ends_it(tmp_path, capsys):
    tj = _tokenizer_json(tmp_path / "tokenizer.json")
    out = tmp_path / "t.u16"
    code, _, err = _prepare("--input", _jsonl(tmp_path / "d.jsonl"), "--tokenizer", tj, "--out", str(out),
                            capsys=capsys)
    assert code == 0, err
    tok = tokenizers.Tokenizer.from_file(tj)
    eot = tok.token_to_id("<|endoftext|>")
    expected = []
    for i, d in enumerate(DOCS):
        expected += ([eot] if i else []) + tok.encode(d, add_special_tokens=False).ids
    assert np.fromfile(out, np.uint16).tolist() == expected
    meta = json.loads((tmp_path / "t.u16.json").read_text())
    assert meta["tokenizer"] == {"kind": "tokenizer.json", "vocab": tok.get_vocab_size(), "eot_id": eot,
                                 "path": str((tmp_path / "tokenizer.json").resolve()),
                                 "sha256": hashlib.sha256(open(tj, "rb").read()).hexdigest(), "eot": "<|endoftext|>"}
    assert meta["vocab"] == tok.get_vocab_size() and TokenFile(out, 4).vocab == meta["vocab"]


def test_parquet_with_a_named_field_and_a_trained_bpe(tmp_path, capsys):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"n": list(range(len(DOCS))), "body": DOCS}), tmp_path / "d.parquet")
    out = tmp_path / "p.u16"
    code, text, err = _prepare("--input", str(tmp_path / "d.parquet"), "--field", "body", "--train-tokenizer",
                               "bpe:300", "--out", str(out), capsys=capsys)
    assert code == 0, err
    saved = tokenizers.Tokenizer.from_file(f"{out}.tokenizer.json")
    eot = saved.token_to_id("<|endoftext|>")
    ids = np.fromfile(out, np.uint16).tolist()
    docs, cur = [], []
    for t in [*ids, eot]:
        if t == eot:
            docs.append(saved.decode(cur))
            cur = []
        else:
            cur.append(t)
    assert docs == DOCS  # the saved tokenizer decodes the file back into the documents
    meta = json.loads((tmp_path / "p.u16.json").read_text())
    assert meta["tokenizer"]["kind"] == "bpe" and meta["tokenizer"]["trained_vocab"] == 300
    assert meta["tokenizer"]["path"] == str((tmp_path / "p.u16.tokenizer.json").resolve())
    assert meta["field"] == "body" and meta["documents"] == 4 and f"({'bpe'}, vocabulary {meta['vocab']})" in text


@pytest.mark.parametrize("args, message", [
    (["--field", "body"], "d.jsonl:1: no string field 'body' (it has: id, text); choose one as field (flag --field)"),
    (["--train-tokenizer", "bpe:100"], "train_tokenizer 'bpe:100': write bpe:VOCAB with VOCAB from 257 (256 "
                                       "bytes and <|endoftext|>) to 1,048,576 (2^20), e.g. bpe:4096 (flag "
                                       "--train-tokenizer)"),
    (["--eot", "</s>"], "--eot names a token of --tokenizer; give --tokenizer too"),
    (["--tokenizer", "missing.json"], "tokenizer 'missing.json' is not a file; give a Hugging Face tokenizer.json"),
])
def test_bad_input_is_one_line(tmp_path, capsys, args, message):
    code, _, err = _prepare("--input", _jsonl(tmp_path / "d.jsonl"), "--out", str(tmp_path / "x"), *args,
                            capsys=capsys)
    assert code == 2 and err.count("\n") == 1 and message in err, err
    assert not (tmp_path / "x").exists()


def test_a_tokenizer_without_an_end_of_text_token_is_refused_unless_named(tmp_path):
    tj = _tokenizer_json(tmp_path / "tokenizer.json", eot="[END]")
    with pytest.raises(ConfigError, match=r"has none of the end-of-text tokens <\|endoftext\|>, <\|end_of_text\|>, "
                                          r"</s>, <eos>; name its end-of-text token as eot"):
        load_tokenizer(tj)
    tok = load_tokenizer(tj, eot="[END]")
    assert tok.separator == tokenizers.Tokenizer.from_file(tj).token_to_id("[END]")
    assert parse_train_spec("bpe:257") == 257


def test_a_bad_jsonl_line_is_named(tmp_path, capsys):
    (tmp_path / "d.jsonl").write_text('{"text": "a"}\n{"text": \n')
    code, _, err = _prepare("--input", str(tmp_path / "d.jsonl"), "--out", str(tmp_path / "x"), capsys=capsys)
    assert code == 2 and f"{tmp_path / 'd.jsonl'}:2: not a JSON object" in err


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_real_tokenizer_file_trains_the_gpt_on_json_lines(tmp_path, capsys):
    """tokenizer.json + JSON Lines -> token file -> the GPT trains on it (one process): the loss falls."""
    tj = _tokenizer_json(tmp_path / "tokenizer.json")
    vocab = tokenizers.Tokenizer.from_file(tj).get_vocab_size()
    data = tmp_path / "d.tok"
    assert _prepare("--input", _jsonl(tmp_path / "d.jsonl", DOCS * 25), "--tokenizer", tj, "--out", str(data),
                    capsys=capsys)[0] == 0
    run = subprocess.run([sys.executable, "-m", "real", "--schedule", "gpipe", "--pp", "1", "--microbatches", "2",
                          "--layers", "2", "--dim", "32", "--heads", "2", "--vocab", str(vocab), "--seq", "16",
                          "--batch-size", "8", "--lr", "0.01", "--data", str(data), "--steps", "40", "--json"],
                         capture_output=True, text=True, timeout=100)
    assert run.returncode == 0, run.stderr[-3000:]
    losses = json.loads(run.stdout)["losses"]
    assert len(losses) == 40 and losses[0] > np.log(vocab) - 0.5 and np.mean(losses[-5:]) < 0.6 * losses[0]
