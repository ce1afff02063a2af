"""The Megatron-LM launch script of every planning question, as bash launches it, against what Megatron-LM checked.

No package ships Megatron-LM's argument parser, so experiments/check_megatron_launch.py runs it (parse_args,
validate_args, core_transformer_config_from_args, get_megatron_ddp_config at MEGATRON_COMMIT) on every
question's script and records each launch and what Megatron-LM resolved it to in docs/results/megatron_launch.json.
Here: each script, run by bash with a recording torchrun, must launch exactly what was checked, what was checked
must be what the plan means (plan_settings), and every flag must be megatron-core's (the installed 0.16.1's
dataclasses) or have a recorded upstream line (FLAG_SOURCES). A dropped or renamed flag fails, as tested below.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
from pathlib import Path

import pytest

import analysis.plan.megatron_launch as ml
from analysis.plan.exports import plan_layout, plan_schedule
from analysis.plan.megatron import MEGATRON_COMMIT, megatron_env, megatron_script
from analysis.plan.megatron_launch import check_flags, launch_script, plan_settings, torchrun_env
from sim.plan.space import PlanConfig
from tests.plan_questions import GLOBAL_BATCH, QUESTIONS, TINY, Question

RECORD = Path(__file__).resolve().parents[1] / "docs" / "results" / "megatron_launch.json"
STARTS = {"unset": {}, "at 1": {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}}
_F = QUESTIONS["1f1b"]  # as experiments/check_megatron_launch.py: the 1f1b question on a model without dropout
CASES = {**QUESTIONS, "1f1b-no-dropout": Question(dataclasses.replace(TINY, dropout=False), _F.expect, **_F.choices)}


def _flags(argv) -> dict[str, str | None]:
    out, words = {}, list(argv)
    for i, w in enumerate(words):
        if w.startswith("--"):
            nxt = words[i + 1] if i + 1 < len(words) else None
            out[w] = None if nxt is None or nxt.startswith("--") else nxt
    return out


def _differences(launch: ml.Launch, rec: dict) -> list[str]:
    """How ``launch`` differs from the launch Megatron-LM checked (its record), one line each."""
    have, had = _flags(launch.argv), _flags(rec["argv"])
    out = [f"{f} {had[f] or ''}".strip() + " dropped" for f in had if f not in have]
    out += [f"{f} {have[f] or ''}".strip() + " added" for f in have if f not in had]
    out += [f"{f} {had[f]} -> {have[f]}" for f in have if f in had and have[f] != had[f]]
    if list(launch.argv) != rec["argv"] and not out:
        out.append("the arguments are in another order")
    if launch.torchrun != rec["torchrun"] or launch.script != rec["script"]:
        out.append(f"torchrun {launch.torchrun} {launch.script}: Megatron-LM checked {rec['torchrun']} {rec['script']}")
    return out


@pytest.fixture(scope="module")
def launched():
    """Each case: (plan, model, reduce dtype, layout, script, {start: launch})."""
    out = {}
    for name, q in CASES.items():
        c = q.winner()
        layout = plan_layout(c, q.model, plan_schedule(c))
        text = megatron_script(c, q.model, GLOBAL_BATCH, layout, q.reduce_dtype, 8)
        out[name] = c, q, layout, text, {s: launch_script(text, env) for s, env in STARTS.items()}
    return out


@pytest.fixture(scope="module")
def record():
    return json.loads(RECORD.read_text())


def test_every_launch_is_the_one_megatron_checked(launched, record):
    assert record["commit"] == MEGATRON_COMMIT and set(record["questions"]) == set(CASES)
    for name, (*_, launches) in launched.items():
        rec = record["questions"][name]
        assert _differences(launches["unset"], rec) == [], f"{name}: rerun experiments/check_megatron_launch.py"
        assert {s: la.env.get("CUDA_DEVICE_MAX_CONNECTIONS") for s, la in launches.items()} \
            == rec["CUDA_DEVICE_MAX_CONNECTIONS"], name
        assert launches["unset"].argv == launches["at 1"].argv


def test_what_megatron_resolved_is_the_plan(launched, record):
    """Every degree, split, microbatch count, mode, dtype and shape Megatron-LM resolved equals the plan's."""
    for name, (c, q, layout, _, _) in launched.items():
        assert record["questions"][name]["megatron"] == plan_settings(c, q.model, GLOBAL_BATCH, layout,
                                                                      q.reduce_dtype), name
    got = {n: record["questions"][n]["megatron"] for n in ("zero2-v2", "fsdp-tp-recompute", "interleaved-uneven")}
    assert got["interleaved-uneven"]["stages"] == [[2, True, False], [2, False, False], [2, False, False],
                                                   [1, False, True]]
    assert got["interleaved-uneven"]["virtual_pipeline_model_parallel_size"] == 2
    assert (got["zero2-v2"]["data_parallel_sharding_strategy"], got["zero2-v2"]["megatron_fsdp_main_grads_dtype"],
            got["zero2-v2"]["megatron_fsdp_grad_comm_dtype"]) == ("optim_grads", "float32", "bfloat16")
    assert record["questions"]["fp32-reduce"]["megatron"]["grad_reduce_in_fp32"] is True
    assert record["questions"]["1f1b"]["megatron"]["grad_reduce_in_fp32"] is False
    assert record["questions"]["1f1b-no-dropout"]["megatron"]["hidden_dropout"] == 0.0
    assert got["fsdp-tp-recompute"]["recompute"] == ["full", "uniform", 1]


def test_the_wrong_environment_is_what_megatron_refuses(record):
    """What validate_args said with CUDA_DEVICE_MAX_CONNECTIONS the other way: why the script sets it."""
    refused = {n: r["refused_with_the_variable_the_other_way"] for n, r in record["questions"].items() if
               r["refused_with_the_variable_the_other_way"]}
    fsdp = "AssertionError: FSDP requires CUDA_DEVICE_MAX_CONNECTIONS > 1 or unset."
    assert refused == {"fsdp-tp-recompute": fsdp, "zero2-v2": fsdp,
                       "pp1-accumulation": "AssertionError: Using tensor model parallelism or context parallelism "
                                           "require setting the environment variable CUDA_DEVICE_MAX_CONNECTIONS to 1"}


def test_every_flag_is_megatrons(launched):
    for name, (*_, launches) in launched.items():
        assert check_flags(launches["unset"].argv) == [], name


def test_a_dropped_or_renamed_flag_fails(launched, record, monkeypatch):
    *_, text, launches = launched["1f1b-no-dropout"]
    dropped = launch_script(text.replace(" --hidden-dropout 0", ""))
    assert _differences(dropped, record["questions"]["1f1b-no-dropout"]) == ["--hidden-dropout 0 dropped"]
    renamed = launch_script(text.replace("--hidden-size 64", "--hidden-dim 64"))
    assert _differences(renamed, record["questions"]["1f1b-no-dropout"]) == ["--hidden-size 64 dropped",
                                                                             "--hidden-dim 64 added"]
    assert check_flags(renamed.argv) == [f"--hidden-dim: not a Megatron-LM flag at {MEGATRON_COMMIT[:12]} "
                                         "(no row in FLAG_SOURCES)"]
    argv = launches["unset"].argv
    field = ml.CORE_FIELDS["--hidden-dropout"]
    monkeypatch.setitem(ml.CORE_FIELDS, "--hidden-dropout", (*field[:2], "hidden_dropout_prob", 0.1))
    assert check_flags(argv) == ["--hidden-dropout: megatron-core's TransformerConfig has no field hidden_dropout_prob"]
    monkeypatch.setitem(ml.CORE_FIELDS, "--hidden-dropout", (*field[:3], 0.0))
    assert check_flags(argv) == ["--hidden-dropout: megatron-core's TransformerConfig.hidden_dropout defaults to 0.1, "
                                 "the export relies on 0.0"]


def test_the_environment_of_each_mode():
    def env(mode, tp, dp=4):
        return megatron_env(PlanConfig(tp, 2 if tp == 1 else 1, dp, "1f1b", 1, 1, 4, mode, "none", False))

    fsdp = (None, "Megatron-FSDP: validate_args refuses CUDA_DEVICE_MAX_CONNECTIONS=1 (arguments.py:1166)")
    tp = ("1", "tensor parallelism: on Hopper and older GPUs validate_args requires it (arguments.py:1477)")
    free = ("", "no requirement (no tensor parallelism, no Megatron-FSDP)")
    assert [env(m, 1) for m in ("sync", "ddp", "zero1")] == [free] * 3
    assert [env(m, t) for m in ("zero2", "zero3", "fsdp") for t in (1, 2)] == [fsdp] * 6
    assert [env(m, 2) for m in ("sync", "ddp", "zero1")] == [tp] * 3
    assert env("fsdp", 2, dp=1) == tp  # one replica: no Megatron-FSDP


def test_the_script_refuses_another_gpu_count(launched):
    text = launched["1f1b"][3]
    for env, n in (({"NNODES": "2"}, 16), ({"GPUS_PER_NODE": "4"}, 4)):
        with pytest.raises(ValueError) as err:
            launch_script(text, env)
        assert str(err.value) == (f"the launch script exited 2: error: NNODES x GPUS_PER_NODE is {n}; the plan runs "
                                  "on 8 GPUs (tp 1 x pp 2 x dp 4): set them to make 8")
    two = launch_script(text, {"NNODES": "2", "GPUS_PER_NODE": "4", "NODE_RANK": "1", "MASTER_ADDR": "node0"})
    assert two.torchrun == {"--nnodes": "2", "--nproc-per-node": "4", "--node-rank": "1", "--master-addr": "node0",
                            "--master-port": "6000"}
    assert torchrun_env(two, 5)["WORLD_SIZE"] == "8" and torchrun_env(two, 5)["LOCAL_RANK"] == "1"


def test_the_zero2_script_whole(launched):
    """The interleaved ZeRO-2 winner's script, line by line: what it states, the environment, the command."""
    c, _, _, text, launches = launched["zero2-v2"]
    lines = text.splitlines()
    assert lines[:2] == ["#!/usr/bin/env bash", "# Megatron-LM main (d98e8a64ddf3) launch of the schedlab plan "
                         f"{c.label()}"]
    assert lines[3:] == [
        "# default: data-parallel size = WORLD_SIZE / (tp x pp x cp) with context parallelism 1 (arguments.py:448, "
        "model_parallel_config.py:100): 8 processes give dp 4",
        "# default: microbatches = global batch / (micro batch x dp) (num_microbatches_calculator.py:388): "
        "16 / (1 x 4) = 4",
        "# default: --make-vocab-size-divisible-by 128 pads the vocabulary to a multiple of 128 x tp (arguments.py:2441, "
        "vocab_utils.py:58): 256 rows, as planned",
        "# default: hidden and attention dropout 0.1 (transformer_config.py:188); the plan has dropout, its rate is "
        "not planned",
        "# override: --megatron-fsdp-main-grads-dtype fp32: Megatron-FSDP ignores --accumulate-allreduce-grads-in-fp32 "
        "and by default accumulates gradients in the parameters' bf16 (param_and_grad_buffer.py:2322, training.py:2647)",
        "# override: --megatron-fsdp-grad-comm-dtype bf16: the plan reduces gradients in bf16 (the default, auto, "
        "reduces in the main gradients' fp32)",
        "set -euo pipefail",
        "NNODES=${NNODES:-1}",
        "GPUS_PER_NODE=${GPUS_PER_NODE:-8}",
        "if [ $((NNODES * GPUS_PER_NODE)) -ne 8 ]; then",
        '    echo "error: NNODES x GPUS_PER_NODE is $((NNODES * GPUS_PER_NODE)); the plan runs on 8 GPUs (tp 1 x pp 2 '
        'x dp 4): set them to make 8" >&2',
        "    exit 2",
        "fi",
        "# Not planned (choose them for your run): the number of steps and the learning rate.",
        "TRAIN_ITERS=${TRAIN_ITERS:-100}",
        "LR=${LR:-0.0003}",
        "unset CUDA_DEVICE_MAX_CONNECTIONS  # Megatron-FSDP: validate_args refuses CUDA_DEVICE_MAX_CONNECTIONS=1 "
        "(arguments.py:1166)",
        'torchrun --nnodes "$NNODES" --nproc-per-node "$GPUS_PER_NODE" --node-rank "${NODE_RANK:-0}" --master-addr '
        '"${MASTER_ADDR:-localhost}" --master-port "${MASTER_PORT:-6000}" pretrain_gpt.py \\',
        "--tensor-model-parallel-size 1 --pipeline-model-parallel-size 2 --pipeline-model-parallel-layout "
        "'Et*2|t*2|t*2|tL' --micro-batch-size 1 --global-batch-size 16 --num-layers 7 --hidden-size 64 "
        "--ffn-hidden-size 128 --num-attention-heads 4 --group-query-attention --num-query-groups 2 --seq-length 32 "
        "--max-position-embeddings 32 --position-embedding-type rope --swiglu --disable-bias-linear --normalization "
        "RMSNorm --untie-embeddings-and-output-weights --bf16 --use-megatron-fsdp --data-parallel-sharding-strategy "
        "optim_grads --ckpt-format fsdp_dtensor --overlap-grad-reduce --megatron-fsdp-main-grads-dtype fp32 "
        "--megatron-fsdp-grad-comm-dtype bf16 --tokenizer-type NullTokenizer --vocab-size 256 --mock-data "
        '--train-iters "$TRAIN_ITERS" --lr "$LR"',
    ]
    assert shlex.split(lines[-1].replace('"$TRAIN_ITERS"', "100").replace('"$LR"', "0.0003")) \
        == list(launches["unset"].argv)
