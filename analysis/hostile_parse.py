"""Hostile numbers, names, sizes and data files: one case per class, each with its exact outcome.

    python experiments/hostile_inputs.py --only parse

Each class is fixed where it starts (common.parse for numbers and names,
real.data for the readers), and a case here stands for the class:

* digits that are not ASCII (``'²'`` passes ``str.isdigit``, ``'٣'`` passes ``int``), ``1_000``, bounds
  (bpe vocabularies past 2^20, a PowerSGD rank past 2^20);
* data readers: a lone surrogate or invalid UTF-8 in JSON Lines, invalid UTF-8 text under a tokenizer, an empty or
  corrupt Parquet file, a dictionary-encoded Parquet string column (read, not refused), a tokenizer whose ids have
  gaps (its vocabulary is its largest id + 1), a token file without its sidecar (its dtype is never guessed);
* files a command reads: ``schedlab compare --measured`` runs, ``--curve`` files with a negative step, a
  ``real.rounds`` SPEC (attempts 0, ``--help``), ``experiments/validate_sim.py --costs`` that is no profile
  (refused before anything is measured);
* names: case-insensitive where a user would expect it (``--reduce-dtype FP32``, ``--optimizer SGD``,
  ``--dp-mode DDP``), the same mode twice (``--curve ddp=... --curve DDP=...``);
* placements: a device named twice, an explicit ``--dp 1`` that the placement contradicts.

:func:`cases` writes the input files into a folder and returns the cases (:class:`analysis.hostile.Case`, group
``parse``); ``experiments/hostile_inputs.py --only parse`` runs them as subprocesses,
``tests/test_hostile_parse.py`` in-process. The table lives here, in the library, because the experiment and a test
share it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from analysis.hostile import Case

__all__ = ["cases"]

PY = sys.executable
EXPERIMENTS = Path(__file__).resolve().parents[1] / "experiments"
SIM, SCHEDLAB, REAL = [PY, "-m", "sim"], [PY, "-m", "analysis"], [PY, "-m", "real"]
PREP, PROFILE, ROUNDS = [PY, "-m", "real.data", "prepare", "--input"], [PY, "-m", "real.profile"], [
    PY, "-m", "real.rounds"]
SMALL = ["--layers", "2", "--dim", "16", "--heads", "2", "--vocab", "32", "--seq", "8"]
UNITS = ["--model", "gpt-6.2b", "--cluster", "dgx-h100:2", "--pp", "8", "--schedule", "1f1b", "--microbatches", "8"]
ONE = ["--schedule", "gpipe", "--pp", "1", "--microbatches", "2", "--steps", "1", *SMALL]
TTL = [*SCHEDLAB, "compare", "--model", "gpt-6.2b", "--cluster", "dgx-h100:1", "--pp", "1", "--dp", "8",
       "--microbatches", "4", "--time-to-loss", "2.3"]


def _tokenizer(path: Path, vocab: dict[str, int]) -> str:
    """A word-level tokenizer.json of ``vocab`` (ids may have gaps), split on whitespace."""
    import tokenizers as tk

    tok = tk.Tokenizer(tk.models.WordLevel(vocab, unk_token="a"))
    tok.pre_tokenizer = tk.pre_tokenizers.Whitespace()
    tok.save(str(path))
    return str(path)


def _files(d: Path) -> dict[str, Path]:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    f = {name: d / name for name in (
        "surrogate.jsonl", "latin1.jsonl", "latin1.txt", "empty.parquet", "corrupt.parquet", "dict.parquet",
        "gaps.json", "wide.json", "u32.u16", "measured_rank.json", "measured_nan.json", "measured_memory.json",
        "negative.csv", "good.csv", "spec0.json", "specbad.json", "garbage.json")}
    f["surrogate.jsonl"].write_text('{"text": "fine"}\n{"text": "half \\ud800 a pair"}\n')
    f["latin1.jsonl"].write_bytes(b'{"text": "caf\xe9"}\n')
    f["latin1.txt"].write_bytes(b"caf\xe9 au lait\n")
    f["empty.parquet"].write_bytes(b"")
    f["corrupt.parquet"].write_bytes(b"PAR1" + b"\x00" * 64 + b"PAR1")
    pq.write_table(pa.table({"text": pa.array(["a b", "b a", "a b"]).dictionary_encode()}), f["dict.parquet"])
    _tokenizer(f["gaps.json"], {"a": 0, "b": 1, "<|endoftext|>": 2, "c": 5000})
    _tokenizer(f["wide.json"], {"a": 0, "b": 1, "<|endoftext|>": 2, "c": 70000})
    np.arange(1, 41, dtype=np.uint32).tofile(f["u32.u16"])  # uint32 tokens under a uint16 name, no sidecar
    run = {"schedule": "1f1b", "pp": 1, "dp": 8, "dp_mode": "ddp", "step_times": [0.5, 0.004, 0.006],
           "memory": [{"rank": 0, "pp_rank": 0, "param_bytes": 1000}]}
    f["measured_rank.json"].write_text(json.dumps({**run, "memory": [{"pp_rank": "x", "param_bytes": 1}]}))
    f["measured_nan.json"].write_text(json.dumps(run).replace("0.004", "NaN"))
    f["measured_memory.json"].write_text(json.dumps({**run, "memory": 7}))
    f["negative.csv"].write_text("step,loss\n-5,3.0\n0,2.5\n1,2.2\n")
    f["good.csv"].write_text("step,loss\n0,3.0\n1,2.5\n2,2.2\n")
    f["spec0.json"].write_text(json.dumps({"configs": [{}], "attempts": 0, "result": str(d / "r.json")}))
    f["specbad.json"].write_text(json.dumps({"configs": [{"layout": {}}], "result": str(d / "r.json")}))
    f["garbage.json"].write_text("garbage\n")
    return f


def cases(d: Path) -> list[Case]:
    """The cases, their input files written into ``d`` (a fresh folder)."""
    from common.errors import quote

    f = _files(d)
    out: list[Case] = []

    def add(argv: list, message: str | None, expect: str = "error", keep: tuple = ()) -> None:
        out.append(Case("parse", tuple(map(str, argv)), expect, None, message, tuple(map(str, keep))))

    def q(p: Path | str) -> str:
        return quote(str(p))

    # -- digits that are not ASCII, and bounds --------------------------------------------------------------------
    codec = ("valid: none, fp16, bf16, int8, powersgd:R (R a rank from 1 to 1,048,576 (2^20), e.g. powersgd:2) "
             "(flag --grad-compression)")
    add([*SIM, *UNITS, "--dp", "2", "--dp-mode", "ddp", "--grad-compression", "powersgd:²"],
        f"unknown grad compression 'powersgd:²'; {codec}")
    add([*SIM, *UNITS, "--dp", "2", "--dp-mode", "ddp", "--grad-compression", "powersgd:2097152"],
        f"unknown grad compression 'powersgd:2097152'; {codec}")
    add([*SIM, "--schedule", "1f1b", "--pp", "٣", "--microbatches", "8"],
        "python -m sim: argument --pp: invalid int value: '٣' (see --help)")
    add([*SIM, "--schedule", "1f1b", "--pp", "4", "--microbatches", "1_000"],
        "python -m sim: argument --microbatches: invalid int value: '1_000' (see --help)")
    add([*SIM, "--schedule", "1f1b", "--pp", "4", "--microbatches", "8", "--tf", "١.٥"],
        "python -m sim: argument --tf: invalid float value: '١.٥' (see --help)")
    add([*REAL, *ONE, "--split", "1,²"], "python -m real: argument --split: invalid value '1,²': give integers "
        "separated by commas, e.g. 2,4 (see --help)")
    bpe = "write bpe:VOCAB with VOCAB from 257 (256 bytes and <|endoftext|>) to 1,048,576 (2^20), e.g. bpe:4096 " \
          "(flag --train-tokenizer)"
    for spec in ("bpe:4294967296", "bpe:５１２"):
        add([*PREP, f["latin1.txt"], "--train-tokenizer", spec, "--out", d / "bpe.tok"],
            f"train_tokenizer {q(spec)}: {bpe}")

    # -- data readers ---------------------------------------------------------------------------------------------
    add([*PREP, f["surrogate.jsonl"], "--out", d / "s.tok"],
        f"{f['surrogate.jsonl']}:2: field 'text' holds a lone surrogate '\\ud800' at character 5, which is not "
        "text; remove it or pair it (flag --input)")
    add([*PREP, f["latin1.jsonl"], "--out", d / "l.tok"],
        f"{f['latin1.jsonl']}:1: not UTF-8 (byte 13: invalid continuation byte); JSON Lines are UTF-8 text "
        "(flag --input)")
    add([*PREP, f["latin1.txt"], "--tokenizer", f["gaps.json"], "--out", d / "t.tok"],
        f"{f['latin1.txt']} is not UTF-8 text (byte 3: invalid continuation byte); a tokenizer reads text, byte "
        "level reads any bytes (flag --input)")
    add([*PREP, f["empty.parquet"], "--out", d / "e.tok"],
        f"{f['empty.parquet']}: not a Parquet file pyarrow can read (Parquet file size is 0 bytes) (flag --input)")
    add([*PREP, f["corrupt.parquet"], "--out", d / "c.tok"], None)  # pyarrow's own words: any one line
    add([*PREP, f["dict.parquet"], "--tokenizer", f["gaps.json"], "--out", d / "dict.tok"], None, "ok")
    add([*PREP, f["dict.parquet"], "--tokenizer", f["wide.json"], "--out", d / "wide.tok"], None, "ok")
    add([*REAL, *ONE, "--data", f["u32.u16"]],
        f"token file {q(f['u32.u16'])} has no sidecar {q(str(f['u32.u16']) + '.json')} to say its dtype; the tokens "
        'of a file are never guessed: write {"dtype": "uint16", "vocab": N} there (or uint32), or make the file with '
        "python -m real.data prepare (flag --data)")

    # -- files a command reads ------------------------------------------------------------------------------------
    dpm = [*SCHEDLAB, "compare", "--model", "gpt-6.2b", "--cluster", "dgx-h100:1", "--pp", "1", "--dp", "8",
           "--microbatches", "4", "--schedules", "1f1b", "--dp-modes", "ddp", "--out", d / "cmp", "--measured"]
    where = f"measured runs {q(f['measured_rank.json'])}: the ddp run's"
    add([*dpm, f["measured_rank.json"]], f"{where} pp_rank 'x' is not an integer from 0 to 1,048,575 (flag "
        "--measured)")
    add([*dpm, f["measured_nan.json"]], f"measured runs {q(f['measured_nan.json'])}: not JSON (NaN is not a "
        "number) (flag --measured)")
    add([*dpm, f["measured_memory.json"]], f"measured runs {q(f['measured_memory.json'])}: the ddp run's memory "
        "must be a list of entries (pp_rank and the byte counts), got 7 (flag --measured)")
    add([*TTL, "--curve", f"ddp={f['negative.csv']}", "--out", d / "ttl"],
        f"time to loss: curve file {q(f['negative.csv'])} row 1: step '-5' is not an integer >= 0 (flag --curve)")
    add([*ROUNDS, f["spec0.json"]], f"SPEC {q(f['spec0.json'])}: attempts 0 is not an integer from 1 to 10,000")
    add([*ROUNDS, f["specbad.json"]], f"SPEC {q(f['specbad.json'])}: configs[0] is not a RunConfig.to_dict() object "
        "(TypeError: Layout.__init__() missing 1 required keyword-only argument: 'schedule')")
    add([*ROUNDS, "--help"], None, "ok")
    add([*ROUNDS], "usage: torchrun --nproc-per-node N -m real.rounds SPEC.json")
    add([*PROFILE, *SMALL, "--out", d / "p.json", "--lr", "-0.1"],
        "profile: lr must be a finite number > 0, got -0.1 (flag --lr)")
    add([PY, EXPERIMENTS / "validate_sim.py", "--costs", f["garbage.json"], "--out", d / "validate"],
        f"cost file {q(f['garbage.json'])} is not readable JSON: Expecting value: line 1 column 1 (char 0)")

    # -- names without regard to case, and the same name twice ----------------------------------------------------
    add([*SIM, *UNITS, "--dp", "2", "--dp-mode", "DDP", "--reduce-dtype", "FP32", "--json"], None, "ok")
    add([*REAL, *ONE, "--optimizer", "SGD", "--dtype", "FLOAT32", "--json"], None, "ok")
    add([*TTL, "--curve", f"ddp={f['good.csv']}", "--curve", f"DDP={f['good.csv']}", "--out", d / "ttl2"],
        "--curve names mode ddp twice ('DDP'); give one curve per mode")

    # -- placements -----------------------------------------------------------------------------------------------
    ps = [*REAL, "--schedule", "gpipe", "--pp", "1", "--microbatches", "2", "--steps", "1", *SMALL, "--placement"]
    twice = "/pserver/CPU:0,/trainer/CPU:0,/trainer/CPU:0"
    add([*ps, twice], f"placement {q(twice)} lists device node0/trainer/CPU:0 twice; name each device once (flag "
        "--placement)")
    two = "/pserver/CPU:0,/trainer/CPU:0-1"
    add([*ps, two, "--dp", "1"], f"--dp 1 does not match placement {q(two)}: 2 trainers at pp 1 are dp 2; leave "
        "--dp out")
    return out
