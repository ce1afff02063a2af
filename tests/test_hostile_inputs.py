"""Hostile input, by class: every bad file or field gives one line naming where it is and what would be valid.

Each class is a table of (input, expected error). A case passes when the
right SchedlabError subclass is raised, its message matches, and the message
is one line (no traceback from a library underneath escapes).
"""

from __future__ import annotations

import re

import pytest

from common.errors import ConfigError, CostFileError, SchedlabError, ScheduleError
from schedules import build, lower
from schedules.trace import read_trace, write_trace
from sim import UniformCosts, simulate
from sim.plan.study import load_study, study_from_dict


def one_line(err: pytest.ExceptionInfo[SchedlabError]) -> str:
    text = str(err.value)
    assert "\n" not in text and "\r" not in text, text
    return text


# ---------------------------------------------------------------- TOML fields of the wrong type

_BASE = {"model": {"preset": "gpt-tiny"}, "cluster": {"preset": "dgx-h100:1"}, "parallel": {"pp": 2},
         "run": {"schedule": "1f1b", "microbatches": 4}}
_SHAPE = {"layers": 4, "hidden": 256, "heads": 4}  # a [model] table without a preset


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value + '"'
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return repr(value)


def _toml(data: dict) -> str:
    return "".join(f"[{table}]\n" + "".join(f"{k} = {_toml_value(v)}\n" for k, v in keys.items())
                   for table, keys in data.items())


@pytest.mark.parametrize(("table", "key", "value", "message"), [
    ("run", "schedule", 5, "config [run]: schedule must be a schedule name, torch:CLASS or csv:FILE (a string), got 5"),
    ("run", "microbatches", 2.5, "config [run]: microbatches must be an integer >= 1, got 2.5"),
    ("run", "microbatches", "8", "config [run]: microbatches must be an integer >= 1, got '8'"),
    ("run", "chunks", 2.0, "config [run]: chunks must be an integer >= 1, got 2.0"),
    ("run", "microbatch_size", True, "config [run]: microbatch_size must be an integer >= 1, got True"),
    ("run", "efficiency", "high", "config [run]: efficiency must be a fraction of peak in (0, 1], got 'high'"),
    ("run", "pair_overlap", [0.5], "config [run]: pair_overlap must be a fraction in [0, 1], got [0.5]"),
    ("run", "layers_per_stage", "12,12", "config [run]: layers_per_stage must be a list of whole layer counts >= 0, "
                                         "one per stage, e.g. [12, 12], got '12,12'"),
    ("run", "layers_per_stage", [2.5, 1.5], "config [run]: layers_per_stage must be a list of whole layer counts"),
    ("run", "layers_per_stage", [2.0, 2], "got [2.0, 2]"),  # 2.0 is not truncated to 2, nor accepted
    ("run", "layers_per_stage", 4, "config [run]: layers_per_stage must be a list of whole layer counts"),
    ("run", "seed", 1, "config [run]: unknown key(s) ['seed']; valid: chunks, contention, dtype, efficiency, elementwise, "
                       "layers_per_stage, mem_limit, microbatch_size, microbatches, moe_dispatcher, pair_overlap, post_validation, "
                       "recompute, reduce_dtype, schedule, stack, time_limit, tp_overlap"),
    ("run", "mem_limit", "60 G", "config [run]: mem_limit '60 G' is not a size in bytes; write a number of bytes"),
    ("run", "time_limit", "10", "config [run]: time_limit must be a finite number of seconds >= 0, got '10'"),
    ("parallel", "pp", True, "config [parallel]: pp must be an integer >= 1, got True"),
    ("parallel", "dp", "2", "config [parallel]: dp must be an integer >= 1, got '2'"),
    ("parallel", "tp", 1.0, "config [parallel]: tp must be an integer >= 1, got 1.0"),
    ("parallel", "bucket_mb", "x", "config [parallel]: bucket_mb must be a finite number > 0 MiB, got 'x'"),
    ("parallel", "dp_mode", 3, "config [parallel]: unknown dp mode 3; valid: none, sync, ddp"),
    ("parallel", "order", ["dp-inner"], "config [parallel]: unknown order ['dp-inner']; valid: dp-inner, pp-inner"),
    ("parallel", "collective", True, "config [parallel]: unknown collective True; valid: auto, ring"),
    ("parallel", "link_model", "fifo", "config [parallel]: unknown link model 'fifo'; valid: fair, fcfs"),
    ("parallel", "fsdp_reshard_after_forward", "off", "config [parallel]: fsdp_reshard_after_forward must be true or "
                                                      "false, got 'off'"),
    ("parallel", "fsdp_prefetch", 1.0, "config [parallel]: fsdp_prefetch must be a whole number >= 0, got 1.0"),
    ("parallel", "fsdp_prefetch", -1, "config [parallel]: fsdp_prefetch must be a whole number >= 0, got -1"),
    ("parallel", "embedding_allreduce", True, "config [parallel]: unknown embedding allreduce True; valid: auto, on, off"),
    ("model", "preset", 5, "config [model]: preset must be a model preset such as 'gpt-6.2b' (a string), got 5"),
    ("model", "layers", 6.2, "config [model]: layers must be an integer >= 1, got 6.2"),
    ("model", "layers", 6.0, "config [model]: layers must be an integer >= 1, got 6.0"),
    ("model", "hidden", "256", "config [model]: hidden must be an integer >= 1, got '256'"),
    ("model", "ffn", "x", "config [model]: ffn must be an integer >= 1, got 'x'"),
    ("model", "kv_heads", 1.5, "config [model]: kv_heads must be an integer >= 1, got 1.5"),
    ("model", "gated_mlp", "yes", "config [model]: gated_mlp must be true or false, got 'yes'"),
    ("model", "bias", 1, "config [model]: bias must be true or false, got 1"),
    ("model", "name", 7, "config [model]: name must be the model's name (a string), got 7"),
    ("cluster", "preset", 5, "config [cluster]: preset must be a cluster preset such as 'dgx-h100:2' (a string), got 5"),
    ("cluster", "intra_GBps", "fast", "config [cluster]: intra_GBps must be a finite number > 0 GB/s, got 'fast'"),
    ("cluster", "inter_alpha_s", -1, "config [cluster]: inter_alpha_s must be a finite number >= 0 s, got -1"),
    ("cluster", "device", 100, "config [cluster]: unknown device 100; valid: H100, H200, A100, CPU, CPU-core or a table"),
    ("cluster", "devices", "/trainer/GPU:0-7", "config [cluster]: devices must be a non-empty list of placements"),
    ("cluster", "devices", [8], "config [cluster]: devices must be a non-empty list of placements (strings), "
                                "e.g. ['/trainer/GPU:0-7'], got [8]"),
    ("cluster", "name", ["lab"], "config [cluster]: name must be the cluster's name (a string), got ['lab']"),
])
def test_toml_field_of_the_wrong_type(tmp_path, table, key, value, message):
    data = {t: dict(keys) for t, keys in _BASE.items()}
    if table == "model" and key != "preset":
        data["model"] = dict(_SHAPE)
    if table == "cluster" and key != "preset":
        data["cluster"] = {"devices": ["/trainer/GPU:0-7"]}
    data[table][key] = value
    path = tmp_path / "study.toml"
    path.write_text(_toml(data))
    with pytest.raises(ConfigError, match=re.escape(message)) as err:
        load_study(path)
    one_line(err)
    if "unknown key" not in message:
        assert err.value.field == key


@pytest.mark.parametrize(("text", "message"), [
    ("[run]\nschedule = \"1f1b\"\n[model\n", "config file '{path}' is not valid TOML: "),
    ("\udcff", "config file '{path}' is not UTF-8 text (at byte 0)"),
    ("pp = 2\n", "config: unknown table(s) ['pp']; valid: model, cluster, parallel, run (every key goes in one of them)"),
    ("run = 5\n", "config: run must be a table ([run] and its keys), got 5"),
    ("{base}[cluster]\ndevices = [\"/trainer/GPU:0-7\"]\n[cluster.device]\npeak_TFLOPs = \"lots\"\n",
     "config [cluster.device]: peak_TFLOPs must be a finite number > 0 TFLOP/s, got 'lots'"),
    ("{base}[cluster]\ndevices = [\"/trainer/GPU:0-7\"]\n[cluster.device]\npeak_TFLOPs = 100\n",
     "config [cluster.device]: missing key(s) ['memory_GB', 'memory_GBps']"),
    ("{base}[cluster]\ndevices = [\"/trainer/GPU:0-7\"]\npserver_device = [1]\n",
     "config [cluster]: unknown pserver device [1]; valid: H100, H200, A100, CPU, CPU-core or a table"),
])
def test_malformed_toml_file(tmp_path, text, message):
    path = tmp_path / "study.toml"
    base = _toml({table: keys for table, keys in _BASE.items() if table != "cluster"})
    path.write_bytes(text.replace("{base}", base).encode("utf-8", "surrogateescape"))
    with pytest.raises(ConfigError, match=re.escape(message.format(path=path))) as err:
        load_study(path)
    one_line(err)


def test_layer_counts_are_never_truncated():
    """layers = 6.2 or a split of [6.2, 6] is refused; 6 and [3, 3] run."""
    for model, split in (({**_SHAPE, "layers": 6.2}, None), ({**_SHAPE, "layers": 6}, [6.2, 6])):
        data = {**_BASE, "model": model, "run": {**_BASE["run"], **({"layers_per_stage": split} if split else {})}}
        with pytest.raises(ConfigError, match=r"must be (an integer >= 1, got 6\.2|a list of whole layer counts)"):
            study_from_dict(data)
    study = study_from_dict({**_BASE, "model": {**_SHAPE, "layers": 6}, "run": {**_BASE["run"], "layers_per_stage": [3, 3]}})
    assert study.costs.stage_layers(2) == (3, 3)


# ---------------------------------------------------------------- tp divides what it splits

@pytest.mark.parametrize(("model", "cluster", "tp", "message"), [
    ({"preset": "gpt-6.2b"}, "dgx-h100:2", 3,
     "parallel: tp=3 must divide the model's heads (32), hidden (4096), ffn (16384) and the devices per node "
     "(8 on cluster 'dgx-h100:2'; a tensor-parallel group sits inside a node); valid tp: 1, 2, 4, 8"),
    ({"preset": "gpt-6.2b"}, "dgx-h100:2", 16, "valid tp: 1, 2, 4, 8"),  # 16 devices, but a node has 8
    ({"preset": "llama-8b"}, "dgx-h100:2", 16, "heads (32), kv_heads (8), hidden (4096), ffn (14336)"),
    ({"layers": 4, "hidden": 96, "heads": 6}, "dgx-h100:1", 4, "heads (6), hidden (96), ffn (384) and the devices per "
                                                               "node (8 on cluster 'dgx-h100:1'"),
    ({"layers": 4, "hidden": 96, "heads": 6}, "dgx-h100:1", 4, "valid tp: 1, 2"),
    ({"layers": 4, "hidden": 256, "heads": 4, "ffn": 1000}, "dgx-h100:1", 8, "ffn (1000)"),
    ({"preset": "gpt-tiny"}, "cpu-host:2", 4, "devices per node (2 on cluster 'cpu-host:2'"),
])
def test_tp_must_divide_heads_hidden_and_node(model, cluster, tp, message):
    data = {**_BASE, "model": model, "cluster": {"preset": cluster}, "parallel": {"pp": 1, "tp": tp}}
    with pytest.raises(ConfigError, match=re.escape(message)) as err:
        study_from_dict(data)
    one_line(err)
    assert err.value.field == "tp"


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_tp_that_divides_is_accepted(tp):
    study = study_from_dict({**_BASE, "model": {"preset": "gpt-6.2b"}, "cluster": {"preset": "dgx-h100:2"},
                             "parallel": {"pp": 2, "tp": tp}})
    assert study.parallel.tp == tp


# ---------------------------------------------------------------- trace files (schedlab perfetto, report --real)

@pytest.fixture(scope="module")
def trace():
    """1F1B at p=2, m=2 with t_comm=0.5: 16 rows; line 1 the metadata, line 2 the column names."""
    return simulate(lower(build("1f1b", pp=2, microbatches=2)), UniformCosts(tcomm=0.5)).trace


def _good_csv(trace, tmp_path) -> list[str]:
    lines = write_trace(trace, tmp_path / "good.csv").read_text().splitlines(keepends=True)
    assert lines[3] == "0,send,0SEND_F0,SEND_F,0,0,1.0,1.5,0.0\n"  # line 4, which the cases below spoil
    return lines


def _spoil(lines: list[str], line: int, old: str, new: str) -> str:
    assert old in lines[line - 1]
    return "".join([*lines[: line - 1], lines[line - 1].replace(old, new, 1), *lines[line:]])


@pytest.mark.parametrize(("make", "message"), [
    (lambda ls: b"\x89PNG\r\n\x1a\n\xff\xfe binary", "line 1: not UTF-8 text (byte 0x89): binary data? a trace is a "
                                                        "CSV (or .parquet) file"),
    (lambda ls: "".join(ls[:5]).encode() + b"\xff\xfe", "line 6: not UTF-8 text (byte 0xff)"),
    (lambda ls: "".join(ls).replace("0F1", "0F\x001", 1), "line 5: a NUL byte (binary data)"),
    (lambda ls: _spoil(ls, 4, ",1.0,1.5,", ",soon,1.5,"), "line 4: start must be a finite number, got 'soon'"),
    (lambda ls: _spoil(ls, 4, ",1.0,1.5,", ",,1.5,"), "line 4: start must be a finite number, got ''"),
    (lambda ls: _spoil(ls, 4, ",1.0,1.5,", ",nan,1.5,"), "line 4: start must be a finite number, got 'nan'"),
    (lambda ls: _spoil(ls, 4, ",1.0,1.5,", ",1.0,inf,"), "line 4: end must be a finite number, got 'inf'"),
    (lambda ls: _spoil(ls, 4, ",1.0,1.5,", ",1.5,1.0,"), "line 4: end 1.0 is before start 1.5; a task ends at or after "
                                                        "its start"),
    (lambda ls: _spoil(ls, 4, "0,send", "0.5,send"), "line 4: rank must be an integer >= 0, got '0.5'"),
    (lambda ls: _spoil(ls, 4, "0,send", "-1,send"), "line 4: rank must be an integer >= 0, got '-1'"),
    (lambda ls: _spoil(ls, 4, ",SEND_F,0,0,", ",SEND_F,x,0,"), "line 4: stage must be an integer >= -1 (-1: none), "
                                                              "got 'x'"),
    (lambda ls: _spoil(ls, 4, ",1.5,0.0", ",1.5,-8"), "line 4: bytes must be a finite number >= 0, got '-8'"),
    (lambda ls: _spoil(ls, 4, ",SEND_F,", ",,"), "line 4: kind must be a non-empty string, got ''"),
    # the half falls where the header's length puts it (its costs gained input_fraction)
    (lambda ls: "".join(ls)[: len("".join(ls)) // 2], "line 6: 8 of 9 fields, it ends before bytes; is the file cut "
                                                      "short?"),
    (lambda ls: "".join(ls).rstrip("\n")[:-6], "line 18: 8 of 9 fields, it ends before bytes; is the file cut "
                                               "short?"),
    (lambda ls: "".join(ls)[:30], "line 1: the '# schedlab-trace' header is not valid JSON"),
    (lambda ls: "# schedlab-trace {source: sim}\n" + "".join(ls[1:]), "line 1: the '# schedlab-trace' header is not "
                                                                     "valid JSON (Expecting property name enclosed in "
                                                                     "double quotes at character 2)"),
    (lambda ls: "# schedlab-trace [1, 2]\n" + "".join(ls[1:]), "line 1: the '# schedlab-trace' header must be a JSON "
                                                             "object of metadata, got [1, 2]"),
    (lambda ls: "".join(ls).replace(",bytes\n", "\n", 1), "line 2 (the column names): lacks columns ['bytes']; a trace "
                                                          "has ['rank', 'stream', 'action', 'kind', 'stage', "
                                                          "'microbatch', 'start', 'end', 'bytes']"),
    (lambda ls: "".join(ls[2:]), "line 1 (the column names): lacks columns ['rank', 'stream'"),
    (lambda ls: _spoil(ls, 4, ",0.0\n", ",0.0,7\n"), "line 4: 10 fields, but the column names are 9"),
    (lambda ls: _spoil(ls, 4, "0SEND_F0", '"0SEND_F0'), "line 4: not CSV from this line on (unexpected end of data; a quote left open?)"),
    (lambda ls: "", "has no column names; a trace has a line rank,stream,action,kind,stage,microbatch,start,end,bytes"),
    (lambda ls: ls[0], "has no column names"),
])
def test_bad_csv_trace(trace, tmp_path, make, message):
    content = make(_good_csv(trace, tmp_path))
    path = tmp_path / "bad.csv"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(ScheduleError, match=re.escape(f"trace {str(path)!r}") + ".*" + re.escape(message)) as err:
        read_trace(path)
    one_line(err)


def _parquet(trace, path, change=None, meta=b'{"source": "sim"}'):
    import pyarrow as pa
    import pyarrow.parquet as pq

    df = trace.copy()
    if change is not None:
        df = change(df)
    table = pa.Table.from_pandas(df, preserve_index=False)
    pq.write_table(table.replace_schema_metadata({b"schedlab": meta}), path)


def _set(column, row, value, dtype=None):
    def change(df):
        if dtype is not None:
            df[column] = df[column].astype(dtype)
        df.loc[row, column] = value
        return df
    return change


@pytest.mark.parametrize(("write", "message"), [
    (lambda t, p: p.write_bytes(b"PAR1 not really"), "is not a readable Parquet file: Parquet magic bytes not found"),
    (lambda t, p: (_parquet(t, p), p.write_bytes(p.read_bytes()[:200])), "is not a readable Parquet file"),
    (lambda t, p: _parquet(t, p, lambda df: df.drop(columns=["end"])), "its column names: lacks columns ['end']"),
    (lambda t, p: _parquet(t, p, _set("start", 3, "soon", str)), "row 4: start must be a finite number, got 'soon'"),
    (lambda t, p: _parquet(t, p, _set("end", 2, -1.0)), "row 3: end -1.0 is before start 1.0"),
    (lambda t, p: _parquet(t, p, _set("rank", 1, 1.5, float)), "row 2: rank must be an integer >= 0, got 1.5"),
    (lambda t, p: _parquet(t, p, meta=b"{oops"), "its 'schedlab' metadata is not valid JSON"),
])
def test_bad_parquet_trace(trace, tmp_path, write, message):
    path = tmp_path / "bad.parquet"
    write(trace, path)
    with pytest.raises(ScheduleError, match=re.escape(message)) as err:
        read_trace(path)
    one_line(err)


def test_missing_trace_and_a_directory(tmp_path):
    for path, message in ((tmp_path / "none.csv", "not found"), (tmp_path, "is a directory")):
        with pytest.raises(ScheduleError, match=message) as err:
            read_trace(path)
        one_line(err)


def test_good_traces_still_read(trace, tmp_path):
    """A BOM, blank lines, integral floats in integer columns and the columns in another order are all fine."""
    lines = _good_csv(trace, tmp_path)
    text = "\ufeff" + lines[0] + "end,start,rank,stream,action,kind,stage,microbatch,bytes\n" + "\n".join(
        ",".join([(f := line.rstrip("\n").split(","))[7], f[6], f[0] + ".0", *f[1:6], f[8]]) for line in lines[2:]) + "\n\n"
    path = tmp_path / "odd.csv"
    path.write_text(text, encoding="utf-8")
    back = read_trace(path)
    assert back[list(trace.columns)].equals(trace) and back.attrs == trace.attrs


# ---------------------------------------------------------------- torch CSV schedule files (csv:PATH)

def _torch_csv() -> str:
    from schedules.interop.torch_csv import torch_csv_text

    return torch_csv_text(build("1f1b", pp=2, microbatches=2))  # 0F0,0F1,0B0,0B1 / 1F0,1B0,1F1,1B1


@pytest.mark.parametrize(("content", "message"), [
    (b"\x89PNG\r\n\x1a\n\x00\x00", "line 1: not UTF-8 text (byte 0x89): binary data? a torch CSV is text, one row of "
                                   "actions per rank"),
    (_torch_csv().encode("utf-16"), "line 1: not UTF-8 text (byte 0xff)"),
    (_torch_csv().replace("1F0", "1F0\xe9").encode("latin-1"), "line 2: not UTF-8 text (byte 0xe9)"),
    (_torch_csv().replace("1B1", "1B\x001").encode(), "line 2: a NUL byte (binary data)"),
    (_torch_csv().replace("0F0", "Z" * 500).encode(), "row 1 (rank 0), cell 1 '" + "Z" * 76 + "...: invalid action '"),
    (b"\xef\xbb\xbf\xef\xbb\xbf" + _torch_csv().encode(), r"cell 1 '\ufeff0F0': invalid action"),  # one BOM only
    (b"", "is empty; expected one row of actions per rank"),
])
def test_bad_torch_csv(tmp_path, content, message):
    from schedules.interop.torch_csv import read_torch_csv, read_torch_csv_graph

    path = tmp_path / "bad.csv"
    path.write_bytes(content)
    for read in (read_torch_csv, read_torch_csv_graph):
        with pytest.raises(ScheduleError, match=re.escape(f"torch CSV {str(path)!r}") + ".*" + re.escape(message)) as err:
            read(path)
        assert "Z" * 80 not in one_line(err)  # a long cell is quoted, cut to 80 characters


@pytest.mark.parametrize("newline", ["\n", "\r\n"])
def test_torch_csv_with_a_byte_order_mark_reads(tmp_path, newline):
    """Excel and Windows editors start a UTF-8 file with a BOM; the file is the same schedule."""
    from schedules.interop.torch_csv import read_torch_csv, read_torch_csv_graph

    plain, bom = tmp_path / "plain.csv", tmp_path / "bom.csv"
    plain.write_text(_torch_csv())
    bom.write_bytes(b"\xef\xbb\xbf" + _torch_csv().replace("\n", newline).encode())
    assert read_torch_csv(bom).programs == read_torch_csv(plain).programs
    assert [t.action for t in read_torch_csv_graph(bom).tasks] == [t.action for t in read_torch_csv_graph(plain).tasks]


# ---------------------------------------------------------------- cost files (schedlab.profile/1)

def _profile(**changes) -> dict:
    """Two partitions (2 and 4 stages), every time distinct; ``changes`` replace top-level keys."""
    stages = lambda n: [{"stage": s, "param_bytes": 100 * (s + 1), "F": 0.01 * (s + 1), "B": 0.02 * (s + 1),  # noqa: E731
                         "I": 0.012 * (s + 1), "W": 0.008 * (s + 1), "OPTIM": {"median": 0.001}} for s in range(n)]
    return {"schema": "schedlab.profile/1", "activation_bytes": 4096, "p2p": {"alpha": 1e-4, "beta": 1e8},
            "task_overhead": {"median": 2e-4}, "partitions": [{"num_stages": 2, "stages": stages(2)},
                                                              {"num_stages": 4, "stages": stages(4)}], **changes}


def _with_stage_rows(rows: list, num_stages: int = 2) -> dict:
    return _profile(partitions=[{"num_stages": num_stages, "stages": rows}])


def _row(stage: object = 0, **changes) -> dict:
    return {"F": 0.01, "B": 0.02, "I": 0.012, "W": 0.008, **({} if stage is None else {"stage": stage}), **changes}


@pytest.mark.parametrize(("profile", "message"), [
    (_with_stage_rows([_row(None), _row(1)]), 'partitions[0].stages[0] has no "stage" field; give each stage its '
                                              "index, 0..1"),
    (_with_stage_rows([_row("0"), _row(1)]), "partitions[0].stages[0].stage must be an integer in 0..1, got '0'"),
    (_with_stage_rows([_row(0), _row(1.0)]), "partitions[0].stages[1].stage must be an integer in 0..1, got 1.0"),
    (_with_stage_rows([_row(True), _row(0)]), "partitions[0].stages[0].stage must be an integer in 0..1, got True"),
    (_with_stage_rows([_row(0), _row(2)]), "partitions[0].stages[1].stage must be an integer in 0..1, got 2"),
    (_with_stage_rows([_row(-1), _row(0)]), "partitions[0].stages[0].stage must be an integer in 0..1, got -1"),
    (_with_stage_rows([_row(1), _row(1)]), "partitions[0].stages[0] and [1] are both stage 1; list each of 0..1 once"),
    (_with_stage_rows([_row(0), "fast"]), "partitions[0].stages[1] must be an object of a stage's timings, got 'fast'"),
    (_with_stage_rows([_row(0)]), "partition of 2 stages must list that many stages"),
    (_profile(partitions=[{"num_stages": 1, "stages": [_row(0)]}, {"num_stages": 1, "stages": [_row(0, F=9.0)]}]),
     "partitions[0] and partitions[1] both profile 1 stages; keep one of them"),
    (_profile(partitions=[{"num_stages": "2", "stages": [_row(0), _row(1)]}]),
     "partitions[0].num_stages must be an integer >= 1, got '2'"),
    (_with_stage_rows([_row(0, F=float("nan")), _row(1)]), "partitions[0].stages[0].F must be a finite time >= 0 s, "
                                                           "got nan"),
    (_with_stage_rows([_row(0), _row(1, W={"median": -1})]), "partitions[0].stages[1].W must be a finite time >= 0 s"),
    (_with_stage_rows([_row(0), _row(1, B="slow")]), "partitions[0].stages[1].B must be a number or {\"median\": "
                                                     "number}, got 'slow'"),
    (_with_stage_rows([_row(0, param_bytes="1k"), _row(1)]), "partitions[0].stages[0].param_bytes must be a finite "
                                                             "number >= 0, got '1k'"),
    (_profile(p2p="fast"), "p2p must be an object {\"alpha\": s, \"beta\": bytes/s}, got 'fast'"),
    (_profile(p2p={"alpha": 1e-4}), "p2p.beta is missing: give a bandwidth > 0 bytes/s, or null"),
    (_profile(p2p={"alpha": 1e-4, "beta": 0}), "p2p.beta must be a bandwidth > 0 bytes/s, got 0"),
    (_profile(p2p={"alpha": "1us", "beta": 1e8}), "p2p.alpha must be a finite number >= 0, got '1us'"),
    (_profile(activation_bytes="4k"), "activation_bytes must be a finite number >= 0, got '4k'"),
    (_profile(collectives=[1]), "collectives must be an object of op -> {alpha, beta} or null, got [1]"),
    (_profile(collectives={"all_reduce": {"alpha": 0}}), "collectives.all_reduce.beta is missing: give a bandwidth > 0"),
])
def test_bad_cost_file(tmp_path, profile, message):
    import json

    from sim.costs.cost_file import load_profile

    path = tmp_path / "costs.json"
    path.write_text(json.dumps(profile))
    num_stages = profile["partitions"][0]["num_stages"]
    with pytest.raises(CostFileError, match=re.escape(f"cost file {str(path)!r}: {message}")) as err:
        load_profile(path, num_stages if isinstance(num_stages, int) else None)
    one_line(err)


def test_cost_file_stages_are_taken_by_their_stage_field(tmp_path):
    """Listed 3, 1, 0, 2: stage s still costs its own row's times."""
    import json

    from schedules import load_graph, validate
    from sim.costs.cost_file import load_profile

    data = _profile()
    rows = data["partitions"][1]["stages"]
    data["partitions"][1]["stages"] = [rows[3], rows[1], rows[0], rows[2]]
    path = tmp_path / "costs.json"
    path.write_text(json.dumps(data))
    costs = load_profile(path, 4)
    assert [s.f for s in costs.stages] == pytest.approx([0.01, 0.02, 0.03, 0.04], rel=1e-12)
    assert [s.param_bytes for s in costs.stages] == [100, 200, 300, 400]
    graph = validate(load_graph("interleaved-1f1b", pp=2, microbatches=4))
    for task, d in zip(graph.tasks, costs.durations(graph), strict=True):
        if task.action.kind.value == "F":
            assert d == pytest.approx(0.01 * (task.action.stage + 1) + 2e-4, rel=1e-12)


@pytest.mark.parametrize("p2p", ["null", "absent"])
def test_cost_file_without_p2p_refuses_messages(tmp_path, p2p):
    """A one-process profile has no p2p timing: a graph with messages (1F1B, p=2, m=4: 4 + 4 sends) is refused, not
    given free messages."""
    import json

    from schedules import load_graph, validate
    from sim import simulate
    from sim.costs.cost_file import load_profile

    data = _profile(p2p=None)
    if p2p == "absent":
        del data["p2p"]
    path = tmp_path / "costs.json"
    path.write_text(json.dumps(data))
    costs = load_profile(path, 2)  # the file loads: the graph decides
    graph = validate(load_graph("1f1b", pp=2, microbatches=4))
    message = (f"the cost file {str(path)!r} has no p2p timing (p2p is missing or null: profiled by one process) but "
               "schedule '1f1b' sends 8 messages between ranks; profile with 2 or more processes (real.profile)")
    for run in (lambda: costs.check(graph), lambda: simulate(graph, costs)):
        with pytest.raises(CostFileError, match=re.escape(message)) as err:
            run()
        one_line(err)
    one_rank = validate(load_graph("interleaved-1f1b", pp=1, microbatches=2, chunks=2))  # two stages, no messages
    assert simulate(one_rank, costs).makespan > 0


def test_cli_simulate_costs_without_p2p_is_one_line_exit_2(tmp_path, capsys):
    import json

    from analysis.cli import main as schedlab

    path = tmp_path / "costs.json"
    path.write_text(json.dumps(_profile(p2p=None)))
    with pytest.raises(SystemExit) as exc:
        schedlab(["simulate", "--schedule", "1f1b", "--pp", "2", "--microbatches", "4", "--costs", str(path)])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "has no p2p timing" in err and len(err.strip().splitlines()) == 1
