"""Hostile input, by class: every bad file or field gives one line naming where it is and what would be valid.

Each class is a table of (input, expected error). A case passes when the
right SchedlabError subclass is raised, its message matches, and the message
is one line (no traceback from a library underneath escapes).
"""

from __future__ import annotations

import re

import pytest

from schedules.errors import ConfigError, SchedlabError
from sim.study import load_study, study_from_dict


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
    ("run", "seed", 1, "config [run]: unknown key(s) ['seed']; valid: chunks, efficiency, layers_per_stage, "
                       "microbatch_size, microbatches, pair_overlap, schedule"),
    ("parallel", "pp", True, "config [parallel]: pp must be an integer >= 1, got True"),
    ("parallel", "dp", "2", "config [parallel]: dp must be an integer >= 1, got '2'"),
    ("parallel", "tp", 1.0, "config [parallel]: tp must be an integer >= 1, got 1.0"),
    ("parallel", "bucket_mb", "x", "config [parallel]: bucket_mb must be a finite number > 0 MiB, got 'x'"),
    ("parallel", "dp_mode", 3, "config [parallel]: unknown dp mode 3; valid: none, sync, ddp"),
    ("parallel", "order", ["dp-inner"], "config [parallel]: unknown order ['dp-inner']; valid: dp-inner, pp-inner"),
    ("parallel", "collective", True, "config [parallel]: unknown collective True; valid: auto, ring"),
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
    ("\udcff", "config file '{path}' is not UTF-8 text (byte 0)"),
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
