"""Hostile numbers, names, sizes and data files, by class: each case's exact outcome, run in-process.

The table is :mod:`analysis.hostile_parse`'s (``python experiments/hostile_inputs.py --only parse`` runs the
same cases as subprocesses): a refusal is exit status 2 and exactly one line, the case's own; a case that must
succeed exits 0. The tests below the table check what the accepted inputs give: the right tokens, vocabulary and
dtype, one row per mode, the same result for ``FP32`` as for ``fp32``.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np
import pytest
from conftest import run_case_in_process as run_in_process

from analysis import hostile_parse
from analysis.hostile import classify
from common import parse
from common.errors import ConfigError

pytest.importorskip("tokenizers", reason="the data extra: pip install -e '.[data]'")
pytest.importorskip("pyarrow", reason="the data extra: pip install -e '.[data]'")

def _case_ids() -> list[str]:
    """One id per case, its command without the scratch folder (the cases are written once to count them)."""
    with tempfile.TemporaryDirectory() as tmp:
        return [" ".join(a.replace(tmp + "/", "") for a in c.argv[2:])[:90]
                for c in hostile_parse.cases(Path(tmp))]


IDS = _case_ids()


@pytest.fixture(scope="module")
def table(tmp_path_factory) -> tuple[Path, list]:
    d = tmp_path_factory.mktemp("parse")
    return d, hostile_parse.cases(d)


@pytest.mark.parametrize("index", range(len(IDS)), ids=IDS)
def test_each_case_has_its_exact_outcome(table, capsys, index) -> None:
    case = table[1][index]
    code, out, err = run_in_process(case.argv, capsys)
    outcome = classify(case, code, out, err)
    assert outcome == ("clean error" if case.expect == "error" else "ok"), (case.argv[1:], code, err[-600:])


def test_the_table_holds_every_class_once(table) -> None:
    cases = table[1]
    assert (len(cases), sum(c.expect == "ok" for c in cases)) == (31, 5)
    assert {c.group for c in cases} == {"parse"} and all(c.message is None for c in cases if c.expect == "ok")
    loose = [Path(c.argv[5]).name for c in cases if c.expect == "error" and c.message is None]
    assert loose == ["corrupt.parquet"]  # every refusal has its exact line but this one's: pyarrow's own words


# -- the parser itself --------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "value"), [("8", 8), ("+8", 8), ("-3", -3), ("007", 7), (12, 12)])
def test_integers_are_ascii_digits(text, value) -> None:
    assert parse.integer(text, "x") == value


@pytest.mark.parametrize(("text", "message"), [
    ("²", "count '²' is not an integer >= 1"),
    ("٣", "count '٣' is not an integer >= 1"),
    ("1_000", "count '1_000' is not an integer >= 1"),
    (" 3", "count ' 3' is not an integer >= 1"),
    ("3.0", "count '3.0' is not an integer >= 1"),
    (True, "count True is not an integer >= 1"),
    (0, "count 0 is not an integer >= 1"),
    (2**63, "count 9223372036854775808 is not an integer from 1 to 9,223,372,036,854,775,807 (2^63 - 1)"),
])
def test_what_is_not_an_integer_is_refused_in_one_line(text, message) -> None:
    with pytest.raises(ConfigError) as e:
        parse.integer(text, "count", low=1)
    assert str(e.value) == message


def test_bounds_are_named() -> None:
    with pytest.raises(ConfigError) as e:
        parse.integer("4294967296", "vocab", low=257, high=2**20)
    assert str(e.value) == "vocab '4294967296' is not an integer from 257 to 1,048,576 (2^20)"
    with pytest.raises(ConfigError) as e:
        parse.number("nan", "lr", low=0, open_low=True)
    assert str(e.value) == "lr 'nan' is not a finite number > 0"
    assert parse.number("2.5e-3", "lr", low=0, open_low=True) == 0.0025
    assert parse.real_text("-inf") == float("-inf") and parse.real_text("ınf") is None  # a dotless i


def test_names_and_sizes_ignore_case() -> None:
    assert parse.name("FP32", ("bf16", "fp32"), "reduce dtype") == "fp32"
    assert parse.size("56gib") == 56 * 2**30 and parse.size("60GB") == 60e9
    kelvin = "60\u212aB"  # KELVIN SIGN: a k that IGNORECASE alone would take
    with pytest.raises(ConfigError) as e:
        parse.size(kelvin)
    assert str(e.value) == f"mem_limit {kelvin!r} is not a size in bytes; write {parse.SIZE_FORMS}"


# -- what the accepted inputs give ---------------------------------------------------------------------------------

def test_a_tokenizer_with_gaps_writes_its_ids_under_a_vocabulary_that_holds_them(table, capsys) -> None:
    d, cases = table
    for case in cases:  # the two prepare cases that write these files (again: the test stands alone)
        if case.argv[-1] in (str(d / "dict.tok"), str(d / "wide.tok")):
            assert run_in_process(case.argv, capsys)[0] == 0
    tokens = np.fromfile(d / "dict.tok", dtype=np.uint16)  # the gaps tokenizer: c is 5000, the text has a, b
    meta = json.loads((d / "dict.tok.json").read_text())
    assert (meta["dtype"], meta["vocab"], meta["documents"]) == ("uint16", 5001, 3)
    assert tokens.tolist() == [0, 1, 2, 1, 0, 2, 0, 1]  # a b <eot> b a <eot> a b: the dictionary column's rows
    wide = json.loads((d / "wide.tok.json").read_text())
    assert (wide["dtype"], wide["vocab"]) == ("uint32", 70001)  # an id past 65535: uint32, never wrapped


def test_one_mode_in_two_spellings_is_one_row(tmp_path, capsys) -> None:
    from analysis.cli import main as schedlab

    argv = ["compare", "--model", "gpt-6.2b", "--cluster", "dgx-h100:1", "--pp", "1", "--dp", "8", "--microbatches",
            "4", "--schedules", "1f1b", "--dp-modes", "ddp,DDP,Zero1", "--out", str(tmp_path / "c"), "--json"]
    assert schedlab(argv) == 0
    rows = json.loads(capsys.readouterr().out)["dp_modes"]
    assert [r["mode"] for r in rows] == ["ddp", "zero1"]


def test_upper_case_names_give_the_result_of_lower_case(capsys) -> None:
    from analysis.cli.simulate import main as sim

    base = ["--model", "gpt-6.2b", "--cluster", "dgx-h100:2", "--pp", "8", "--schedule", "1f1b", "--microbatches", "8",
            "--dp", "2", "--json"]
    results = []
    for names in (["--dp-mode", "ddp", "--reduce-dtype", "fp32"], ["--dp-mode", "DDP", "--reduce-dtype", "FP32"]):
        assert sim([*base, *names]) == 0
        results.append(json.loads(capsys.readouterr().out))
    assert results[0] == results[1]
