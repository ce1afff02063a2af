"""The planner's exports checked by their targets' own code.

torchtitan 0.3.0 (the ``exports`` extra): its ``ConfigManager`` builds the
config from each exported module (running ``Trainer.Config``'s validation), its
``ParallelDims`` reads the degrees, and its stage builder
(``_pipeline_module_split``, ``_build_pipeline_schedule``) places the stages and
loads the schedule CSV on a fake process group, one pp rank at a time; a slow
test runs one step of a V-shaped CSV schedule on 2 gloo ranks and compares
the loss and gradients with the unsplit model. Megatron-LM: no package ships
its parser, so the flags are checked against :data:`FLAG_SOURCES` (upstream file
and line) and the layout string is decoded by its documented format.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import shlex
import sys
from pathlib import Path

import pytest

from analysis.plan.exports import PlanLayout, plan_layout, plan_schedule, write_exports
from analysis.plan.megatron import FLAG_SOURCES, REDUCE_FLAGS, megatron_layout, megatron_script
from analysis.plan.torchtitan import torchtitan_notes
from common.errors import ConfigError
from schedules.interop.torch_csv import read_torch_csv
from sim.costs.cluster import cluster_preset
from sim.costs.moe import MoEConfig
from sim.costs.transformer import TransformerConfig
from sim.plan.search import plan
from sim.plan.space import PlanConfig, PlanSpace

# 7 layers: 4 stages of interleaved 1F1B on pp=2 split unevenly (2, 2, 2, 1).
TINY = TransformerConfig(name="tiny-llama", layers=7, hidden=64, heads=4, vocab=256, seq_len=32, ffn=128, kv_heads=2,
                         gated_mlp=True, bias=False, tied_embeddings=False, learned_positions=False)
# Five planning questions on one DGX H100 node (8 devices), global batch 16, microbatch size 1.
QUESTIONS = {
    "1f1b": dict(schedules=("1f1b",), pp=(2,), tp=(1,), dp_modes=("ddp",), recompute=("none",)),
    "interleaved-uneven": dict(schedules=("interleaved-1f1b",), pp=(2,), tp=(1,), chunks=(2,), dp_modes=("ddp",)),
    "zb-v": dict(schedules=("zb-v",), pp=(2,), tp=(1,), dp_modes=("ddp",), recompute=("selective",)),
    "fsdp-tp-recompute": dict(schedules=("1f1b",), pp=(1,), tp=(2,), dp_modes=("fsdp",), recompute=("full",),
                              sp=(True,)),
    "zero1": dict(schedules=("1f1b", "zb-h1"), pp=(2,), tp=(1,), dp_modes=("zero1",), recompute=("none",)),
}
# What each question's winner must be.
EXPECTED = {
    "1f1b": lambda c: c.schedule == "1f1b" and c.pp == 2 and c.dp_mode == "ddp",
    "interleaved-uneven": lambda c: c.schedule == "interleaved-1f1b" and c.chunks == 2,
    "zb-v": lambda c: c.schedule == "zb-v" and c.recompute == "selective",
    "fsdp-tp-recompute": lambda c: c.dp_mode == "fsdp" and c.tp == 2 and c.sp and c.recompute == "full",
    "zero1": lambda c: c.dp_mode == "zero1" and c.pp == 2,
}


def _winner(cluster: str, global_batch: int, **choices) -> PlanConfig:
    space = PlanSpace(model=TINY, cluster=cluster_preset(cluster), global_batch=global_batch,
                      microbatch_sizes=(1,), **choices)
    return plan(space, top=1, workers=1).top[0].config


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> dict[str, tuple[PlanConfig, PlanLayout, dict[str, Path]]]:
    out = {}
    for name, choices in QUESTIONS.items():
        c = _winner("dgx-h100:1", 16, **choices)
        assert EXPECTED[name](c), (name, c)
        layout = plan_layout(c, TINY, plan_schedule(c))
        out[name] = c, layout, write_exports(c, TINY, 16, None, tmp_path_factory.mktemp(name))
    return out


# --------------------------------------------------------------------------------------------- layout
def test_layouts_of_the_five_winners(exported):
    got = {name: (lay.layers, lay.ranks, lay.placement) for name, (_, lay, _) in exported.items()}
    assert got == {
        "1f1b": ((4, 3), (0, 1), "loop"),
        "interleaved-uneven": ((2, 2, 2, 1), (0, 1, 0, 1), "loop"),
        "zb-v": ((2, 2, 2, 1), (0, 1, 1, 0), "v"),
        "fsdp-tp-recompute": ((7,), (0,), "loop"),
        "zero1": ((4, 3), (0, 1), "loop"),
    }


def test_csv_is_the_planned_order(exported):
    for c, _, files in exported.values():
        assert read_torch_csv(files["schedule.csv"]).programs == plan_schedule(c).programs


# --------------------------------------------------------------------------------------------- Megatron-LM
def _decode_layout(text: str) -> list[str]:
    """Megatron's layout format (pipeline_parallel_layer_layout.py, parse_str_to_list): x*n repeats x; | splits."""
    import re

    return re.sub(r"(.)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), text).split("|")


def _flags(line: str) -> dict[str, str | None]:
    words, flags = shlex.split(line), {}
    for i, w in enumerate(words):
        if w.startswith("--"):
            nxt = words[i + 1] if i + 1 < len(words) else None
            flags[w] = None if nxt is None or nxt.startswith("--") else nxt
    return flags


def test_megatron_lines_of_the_five_winners(exported):
    for name, (c, layout, files) in exported.items():
        lines = files["megatron"].read_text().splitlines()
        flags = _flags(lines[-1])
        assert set(flags) <= set(FLAG_SOURCES), name
        assert (flags["--tensor-model-parallel-size"], flags["--pipeline-model-parallel-size"]) == (str(c.tp), str(c.pp))
        assert flags["--micro-batch-size"] == "1" and flags["--global-batch-size"] == "16"
        shape = {k: flags[k] for k in ("--num-layers", "--hidden-size", "--ffn-hidden-size", "--num-attention-heads",
                                       "--num-query-groups", "--seq-length", "--max-position-embeddings",
                                       "--position-embedding-type", "--normalization", "--vocab-size")}
        assert shape == {"--num-layers": "7", "--hidden-size": "64", "--ffn-hidden-size": "128",
                         "--num-attention-heads": "4", "--num-query-groups": "2", "--seq-length": "32",
                         "--max-position-embeddings": "32", "--position-embedding-type": "rope",
                         "--normalization": "RMSNorm", "--vocab-size": "256"}
        assert {"--group-query-attention", "--swiglu", "--disable-bias-linear",
                "--untie-embeddings-and-output-weights"} <= set(flags)
        if c.pp > 1:
            stages = _decode_layout(flags["--pipeline-model-parallel-layout"])
            assert [s.count("t") for s in stages] == list(layout.layers)
            assert stages[0].startswith("E") and stages[-1].endswith("L") and "".join(stages).count("E") == 1
            assert len(stages) == c.pp * c.chunks  # Megatron: virtual stages = stages / pp
        else:
            assert "--pipeline-model-parallel-layout" not in flags
    notes = {name: [x for x in files["megatron"].read_text().splitlines() if x.startswith("# note:")]
             for name, (_, _, files) in exported.items()}
    assert notes["1f1b"] == notes["interleaved-uneven"] == notes["fsdp-tp-recompute"] == []
    assert notes["zb-v"] == ["# note: schedule zb-v places stages 0,1,1,0 (a V); Megatron-LM places stage s on rank "
                             "s mod pp and runs interleaved 1F1B on them: the nearest, with the same split"]
    assert notes["zero1"][0].startswith("# note: schedule zb-h1 has no Megatron-LM flag")
    fl = {name: _flags(files["megatron"].read_text().splitlines()[-1]) for name, (_, _, files) in exported.items()}
    assert "--use-distributed-optimizer" in fl["zero1"] and "--use-megatron-fsdp" not in fl["zero1"]
    assert (fl["fsdp-tp-recompute"]["--data-parallel-sharding-strategy"], fl["fsdp-tp-recompute"]["--ckpt-format"]) \
        == ("optim_grads_params", "fsdp_dtensor")
    assert (fl["fsdp-tp-recompute"]["--recompute-granularity"], fl["fsdp-tp-recompute"]["--recompute-method"],
            fl["fsdp-tp-recompute"]["--recompute-num-layers"]) == ("full", "uniform", "1")
    assert "--sequence-parallel" in fl["fsdp-tp-recompute"] and fl["zb-v"]["--recompute-granularity"] == "selective"


def test_flag_table_covers_every_flag_the_exporter_writes():
    """Every flag of every (dp mode, recompute, sp, model variant, schedule) is in the table, and every row is used."""
    gpt = TransformerConfig(name="gpt", layers=8, hidden=64, heads=4, vocab=256, seq_len=32)
    seen: set[str] = set()
    for model in (TINY, gpt, dataclasses.replace(TINY, dropout=False)):
        for sched, chunks in (("1f1b", 1), ("interleaved-1f1b", 2), ("zb-v", 2)):
            for mode in ("sync", "ddp", "zero1", "zero2", "fsdp", "zero3"):
                for rc in ("none", "selective", "full"):
                    for tp, sp in ((1, False), (2, True)):
                        c = PlanConfig(tp, 2, 2, sched, chunks, 1, 4, mode, rc, sp)
                        for reduce in ("bf16", "fp32"):
                            line = megatron_script(c, model, 8, plan_layout(c, model, plan_schedule(c)), reduce)
                            seen |= set(_flags(line.splitlines()[-1]))
    # a MoE model with shared experts and a dense first layer, its experts over ep 2 (docs/exports.md)
    moe = TransformerConfig(name="moe", layers=8, hidden=64, heads=4, vocab=256, seq_len=32, gated_mlp=True, bias=False,
                            tied_embeddings=False, learned_positions=False, dropout=False,
                            moe=MoEConfig(experts=4, top_k=2, expert_ffn=64, shared_experts=1, dense_layers=1))
    for c in (PlanConfig(1, 2, 2, "1f1b", 1, 1, 4, "zero1", "none", False, 2),
              PlanConfig(1, 2, 2, "combined-1f1b", 2, 1, 4, "zero1", "none", False, 2)):  # the EP A2A overlap
        seen |= set(_flags(megatron_script(c, moe, 8, plan_layout(c, moe, plan_schedule(c))).splitlines()[-1]))
    assert seen == set(FLAG_SOURCES)


def test_megatron_trains_in_bf16_and_reduces_gradients_in_the_plans_dtype():
    """--bf16 alone makes Megatron-LM accumulate and reduce gradients in fp32 (arguments.py:1204-1217 at
    MEGATRON_COMMIT): the planner's default bf16 reduction needs --grad-reduce-in-bf16."""
    c = _mode_config("zero1")  # DDP's flags; Megatron-FSDP's are in tests/test_megatron_launch.py
    layout = plan_layout(c, TINY, plan_schedule(c))
    for reduce, flag in (("bf16", "--grad-reduce-in-bf16"), ("fp32", "--accumulate-allreduce-grads-in-fp32")):
        fl = _flags(megatron_script(c, TINY, 8, layout, reduce).splitlines()[-1])
        assert "--bf16" in fl and flag in fl and not ({*REDUCE_FLAGS.values()} - {flag}) & set(fl)
    assert "--grad-reduce-in-bf16" in _flags(megatron_script(c, TINY, 8, layout).splitlines()[-1])  # the default
    with pytest.raises(ConfigError) as exc:
        megatron_script(c, TINY, 8, layout, "fp16")
    assert str(exc.value) == "reduce dtype 'fp16': give one of bf16, fp32"


def test_torchtitan_notes_a_bf16_reduction_it_cannot_run():
    """torchtitan 0.3.0 reduces gradients in float32 only (TrainingConfig.mixed_precision_reduce)."""
    c = _mode_config("fsdp")
    layout = plan_layout(c, TINY, plan_schedule(c))
    note = ("gradients reduced in bf16: torchtitan reduces them in float32 only (TrainingConfig.mixed_precision_reduce), "
            "so its gradient collectives carry twice the bytes the plan timed (plan with --reduce-dtype fp32 to time "
            "what torchtitan runs)")
    assert note in torchtitan_notes(c, TINY, layout)
    assert note not in torchtitan_notes(c, TINY, layout, "fp32")
    c1 = _mode_config("fsdp", dp=1)
    assert note not in torchtitan_notes(c1, TINY, plan_layout(c1, TINY, plan_schedule(c1)))


def _mode_config(mode: str, dp: int = 2) -> PlanConfig:
    return PlanConfig(1, 2, dp, "1f1b", 1, 1, 4, mode, "none", False)


def test_megatron_flags_of_every_dp_mode():
    """Each mode's flags, and validate_args' rules on them (megatron/training/arguments.py at MEGATRON_COMMIT):
    --overlap-param-gather needs --overlap-grad-reduce and the distributed optimizer or Megatron-FSDP (line 1024),
    Megatron-FSDP needs --ckpt-format fsdp_dtensor (line 1169), --use-torch-fsdp2 is refused with pp > 1 (1035)."""
    want = {
        "sync": set(),  # overlap_grad_reduce defaults False: DDP all-reduces after the backward
        "ddp": {"--overlap-grad-reduce"},
        "zero1": {"--use-distributed-optimizer", "--overlap-grad-reduce"},
        "zero2": {"--use-megatron-fsdp", "--data-parallel-sharding-strategy", "--ckpt-format", "--overlap-grad-reduce"},
        "zero3": {"--use-megatron-fsdp", "--data-parallel-sharding-strategy", "--ckpt-format", "--overlap-grad-reduce",
                  "--overlap-param-gather"},
    }
    want["fsdp"] = want["zero3"]
    dp_flags = {"--overlap-grad-reduce", "--overlap-param-gather", "--use-distributed-optimizer", "--use-megatron-fsdp",
                "--data-parallel-sharding-strategy", "--ckpt-format", "--use-torch-fsdp2"}
    strategy = {"zero2": "optim_grads", "zero3": "optim_grads_params", "fsdp": "optim_grads_params"}
    for mode, expect in want.items():
        c = _mode_config(mode)
        fl = _flags(megatron_script(c, TINY, 8, plan_layout(c, TINY, plan_schedule(c))).splitlines()[-1])
        assert set(fl) & dp_flags == expect, mode
        assert fl.get("--data-parallel-sharding-strategy") == strategy.get(mode), mode
        if "--overlap-param-gather" in fl:
            assert "--overlap-grad-reduce" in fl and ({"--use-distributed-optimizer", "--use-megatron-fsdp"} & set(fl))
        if "--use-megatron-fsdp" in fl:
            assert fl["--ckpt-format"] == "fsdp_dtensor"
        c1 = _mode_config(mode, dp=1)  # one replica: no data-parallel flag whatever the mode
        assert not set(_flags(megatron_script(c1, TINY, 4, plan_layout(c1, TINY, plan_schedule(c1))).splitlines()[-1])) \
            & dp_flags
    for mode in ("ps", "none"):
        c = _mode_config(mode)
        with pytest.raises(ValueError, match=rf"^dp mode '{mode}' has no Megatron-LM setting \(it runs sync, ddp, "
                                             r"zero1, zero2, zero3, fsdp\); plan with one of those$"):
            megatron_script(c, TINY, 8, plan_layout(c, TINY, plan_schedule(c)))


def test_megatron_zero2_and_layouts():
    c = PlanConfig(1, 4, 2, "1f1b", 1, 1, 8, "zero2", "none", False)
    line = megatron_script(c, TINY, 16, plan_layout(c, TINY, plan_schedule(c))).splitlines()[-1]
    assert "--use-megatron-fsdp --data-parallel-sharding-strategy optim_grads --ckpt-format fsdp_dtensor" in line
    assert "--use-torch-fsdp2" not in line  # validate_args refuses it with pp > 1
    assert "--pipeline-model-parallel-layout 'Et*2|t*2|t*2|tL'" in line
    assert megatron_layout(PlanLayout((1, 0, 3), (0, 1, 2), "loop")) == "Et||t*3L"


# --------------------------------------------------------------------------------------------- torchtitan
def _titan_config(path: Path):
    """torchtitan's ConfigManager on the exported module, as ``--module torchtitan_plan --config schedlab_plan``."""
    from torchtitan.config import ConfigManager

    spec = importlib.util.spec_from_file_location("torchtitan_plan", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules["torchtitan_plan"] = module  # torchtitan's import_module("torchtitan_plan") finds it here
    try:
        return ConfigManager().parse_args(["--module", "torchtitan_plan", "--config", "schedlab_plan"])
    finally:
        sys.modules.pop("torchtitan_plan", None)


def _stages_on(cfg, world: int, global_rank: int):
    """torchtitan's stage builder for one rank on a fake process group: (pp rank, stages, schedule)."""
    import torch
    import torch.distributed as dist
    from torch.nn import functional
    from torch.testing._internal.distributed.fake_pg import FakeStore
    from torchtitan.distributed import ParallelDims
    from torchtitan.distributed import pipeline_parallel as ttpp

    dist.init_process_group("fake", store=FakeStore(), rank=global_rank, world_size=world)
    try:
        dims = ParallelDims.from_config(cfg.parallelism, world)
        dims.build_mesh()
        with torch.device("meta"):
            model = cfg.model_spec.model.build()
        pp_mesh = dims.get_mesh("pp")
        stages, _ = ttpp._pipeline_module_split(model, pp_mesh, cfg.parallelism.pipeline_parallel_schedule,
                                                 torch.device("cpu"), cfg.parallelism.module_fqns_per_model_part)
        sched = ttpp._build_pipeline_schedule(
            parallelism=cfg.parallelism, local_batch_size=cfg.training.local_batch_size, stages=stages,
            loss_fn=lambda pred, labels: (functional.cross_entropy(pred.flatten(0, 1), labels.flatten()), None))
        return pp_mesh.get_local_rank(), stages, sched
    finally:
        dist.destroy_process_group()


def test_torchtitan_builds_and_places_the_five_winners(exported):
    pytest.importorskip("torchtitan", reason="the exports extra: pip install -e '.[exports]'")
    from torchtitan.distributed import ParallelDims
    from torchtitan.distributed.activation_checkpoint import FullAC

    for name, (c, layout, files) in exported.items():
        cfg = _titan_config(files["torchtitan"])
        world = c.tp * c.pp * c.dp
        dims = ParallelDims.from_config(cfg.parallelism, world)
        assert (dims.dp_replicate * dims.dp_shard, dims.tp, dims.pp) == (c.dp, c.tp, c.pp), name
        assert dims.dp_shard == (c.dp if c.dp_mode in ("fsdp", "zero1") else 1), name
        assert isinstance(cfg.activation_checkpoint, FullAC.Config) == (c.recompute == "full"), name
        assert cfg.activation_checkpoint is None or c.recompute == "full", name
        assert cfg.parallelism.enable_sequence_parallel == c.sp, name
        assert (cfg.training.global_batch_size, cfg.training.seq_len) == (16, 32), name
        mc = cfg.model_spec.model
        attn = mc.layers[0].attention
        assert (len(mc.layers), mc.dim, mc.vocab_size, attn.n_heads, attn.n_kv_heads) == (7, 64, 256, 4, 2), name
        mc.update_from_config(config=cfg)  # torchtitan's own checks of the model against the parallelism
        if c.pp == 1:
            assert cfg.training.local_batch_size * c.dp * c.microbatches == 16, name  # accumulation steps
            continue
        assert cfg.training.local_batch_size // cfg.parallelism.pipeline_parallel_microbatch_size == c.microbatches
        for pp_rank in range(c.pp):
            got_rank, stages, sched = _stages_on(cfg, world, pp_rank * (world // c.pp))
            assert got_rank == pp_rank
            assert [s.stage_index for s in stages] == [s for s, r in enumerate(layout.ranks) if r == pp_rank], name
            assert [len(s.submod.layers) for s in stages] == [layout.layers[s.stage_index] for s in stages], name
            assert sched.stage_index_to_group_rank == dict(enumerate(layout.ranks)), name
            assert sched._n_microbatches == c.microbatches, name


def test_torchtitan_notes(exported):
    reduce = "# note: gradients reduced in bf16: torchtitan reduces them in float32 only"
    notes = {name: [x for x in files["torchtitan"].read_text().splitlines() if x.startswith("# note:")]
             for name, (_, _, files) in exported.items()}
    assert {name for name, n in notes.items() if n and n[0].startswith(reduce)} == \
        {name for name, (c, _, _) in exported.items() if c.dp > 1}  # the plans reduce in bf16, the default
    notes = {name: [x for x in n if not x.startswith(reduce)] for name, n in notes.items()}
    assert notes["1f1b"] == notes["interleaved-uneven"] == notes["fsdp-tp-recompute"] == []
    assert len(notes["zb-v"]) == 1 and notes["zb-v"][0].startswith("# note: selective recomputation of the attention")
    assert notes["zero1"] == ["# note: zero1: torch's CSV runtime reduce-scatters each stage's gradients once a step, "
                              "after its last backward (REDUCE_GRAD), and holds them unsharded in float32 until then; "
                              "the parameters are gathered once a step (UNSHARD, fsdp_reshard_after_forward never): "
                              "as planned"]


def test_torchtitan_reads_every_dp_mode(tmp_path):
    """Each mode's degrees and FSDP setting at pp 2 as torchtitan's ConfigManager and ParallelDims read them; the
    modes torchtitan runs otherwise say so in a note (at pp > 1 every sharded mode keeps its parameters gathered
    through the step: fsdp_reshard_after_forward never); ps and none with replicas are refused in one line."""
    pytest.importorskip("torchtitan", reason="the exports extra: pip install -e '.[exports]'")
    from torchtitan.distributed import ParallelDims

    want = {"sync": (2, 1, "default"), "ddp": (2, 1, "default"), "zero1": (1, 2, "never"), "zero2": (1, 2, "never"),
            "zero3": (1, 2, "never"), "fsdp": (1, 2, "never")}
    csv = "once a step, after its last backward (REDUCE_GRAD), and holds them unsharded in float32 until then"
    noted = {"sync": ["# note: sync: torchtitan's replicated data parallelism"],
             **{m: [f"# note: {m}: torch's CSV runtime reduce-scatters each stage's gradients {csv}"]
                for m in ("zero1", "zero2", "zero3", "fsdp")}}
    ends = {"zero1": ": as planned", **{m: f"so {m} runs as zero1 (whole gradients and parameters through the step)"
                                        for m in ("zero2", "zero3", "fsdp")}}
    for m in ("zero3", "fsdp"):
        noted[m].append(f"# note: {m}: fsdp_reshard_after_forward always is not written: with a CSV that splits the "
                        "backward (I, W) the last stage gets no gradients")
    read: dict[str, object] = {}  # modules of the same parallelism are read once (a read costs ~0.5 s)
    for mode, expect in want.items():
        c = _mode_config(mode)
        (tmp_path / mode).mkdir()
        path = write_exports(c, TINY, 8, None, tmp_path / mode, reduce_dtype="fp32")["torchtitan"]  # torchtitan's
        block = path.read_text().split("config.parallelism = ParallelismConfig(")[1].split(")\n")[0]
        key = "\n".join(x for x in block.splitlines() if "schedule_csv" not in x)  # the CSV is in the mode's folder
        cfg = read[key] if key in read else read.setdefault(key, _titan_config(path))
        dims = ParallelDims.from_config(cfg.parallelism, 4)
        assert (dims.dp_replicate, dims.dp_shard, cfg.parallelism.fsdp_reshard_after_forward) == expect, mode
        assert (dims.pp, dims.tp) == (2, 1), mode
        notes = [x for x in path.read_text().splitlines() if x.startswith("# note:")]
        assert len(notes) == len(noted.get(mode, [])), mode
        assert [n[:len(m)] for n, m in zip(notes, noted.get(mode, []), strict=True)] == noted.get(mode, []), mode
        if mode in ends:
            assert notes[0].endswith(ends[mode]), mode
    assert len(read) == 2  # replicated; sharded and kept whole through the step
    for mode in ("ps", "none"):
        c = _mode_config(mode)
        with pytest.raises(ValueError, match=rf"^dp mode '{mode}' has no torchtitan setting \(it runs sync, ddp, zero1, "
                                             r"zero2, zero3, fsdp\); plan with one of those$"):
            write_exports(c, TINY, 8, None, tmp_path)


def test_torchtitan_notes_what_its_runtime_runs_otherwise():
    """zero2 v4 at pp 2: torch's CSV runtime runs it as zero1, re-timed by the simulator's zero1, and gathers the
    fourth stage of a rank again and again (torch's own _add_unshard_reshard on the CSV: 15 UNSHARDs, not 4)."""
    import dataclasses

    from analysis.plan.torchtitan import retimed
    from sim.plan.bounds import Bounds
    from sim.plan.study import Study

    model = dataclasses.replace(TINY, layers=16)
    c = PlanConfig(1, 2, 4, "interleaved-1f1b", 4, 1, 8, "zero2", "none", False)
    space = PlanSpace(model=model, cluster=cluster_preset("dgx-h100:1"), global_batch=32, microbatch_sizes=(1,))
    study = Study(schedule=c.schedule, microbatches=8, chunks=4, costs=Bounds(space).costs(c))
    sched = plan_schedule(c)
    (t, peak), (t0, peak0) = retimed(study, "zero1"), retimed(study, "zero2")
    assert peak > peak0  # whole gradients held through the step
    assert torchtitan_notes(c, model, plan_layout(c, model, sched), "fp32", sched, study) == [
        "zero2: torch's CSV runtime reduce-scatters each stage's gradients once a step, after its last backward "
        "(REDUCE_GRAD), and holds them unsharded in float32 until then; the parameters are gathered once a step "
        "(UNSHARD, fsdp_reshard_after_forward never): so zero2 runs as zero1 (whole gradients and parameters through "
        "the step)",
        f"zero2 re-timed as torchtitan runs it (zero1): {t:.4g} s a step, {peak / 1e9:.4g} GB peak; the plan's zero2: "
        f"{t0:.4g} s, {peak0 / 1e9:.4g} GB",
        "4 stages per rank: torch's runtime keeps 3 unsharded and gathers the others again, 15 UNSHARDs a step on a "
        "rank where the plan times 4"]


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_torchtitan_places_405b_interleaved_on_16_ranks(tmp_path):
    """Llama 3 405B, tp8 pp16 dp4 interleaved v2 FSDP: 126 layers in 32 stages (30 of 4, 2 of 3), placed as planned."""
    pytest.importorskip("torchtitan", reason="the exports extra: pip install -e '.[exports]'")
    import dataclasses

    from sim.costs.transformer import model_preset

    model = dataclasses.replace(model_preset("llama3-405b"), seq_len=8192)
    c = PlanConfig(8, 16, 4, "interleaved-1f1b", 2, 1, 128, "fsdp", "none", True)
    layout = plan_layout(c, model, plan_schedule(c))
    assert layout.layers == (4,) * 30 + (3, 3)
    cfg = _titan_config(write_exports(c, model, 2048, None, tmp_path)["torchtitan"])
    cfg.model_spec.model.update_from_config(config=cfg)
    for pp_rank in (0, 15):
        got_rank, stages, sched = _stages_on(cfg, 8 * 16 * 4, pp_rank * 32)
        assert (got_rank, [s.stage_index for s in stages]) == (pp_rank, [pp_rank, pp_rank + 16])
        assert [len(s.submod.layers) for s in stages] == ([4, 4] if pp_rank == 0 else [4, 3])
        assert sched._n_microbatches == 128 and sched.stage_index_to_group_rank == dict(enumerate(layout.ranks))


# --------------------------------------------------------------------------------------------- one real step
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_torchtitan_runs_a_v_shaped_csv_step_on_two_gloo_ranks(tmp_path):
    """The planner's zb-v winner on a 2-core CPU host: torchtitan's stage builder and CSV runtime run one step.

    FlexAttention (torchtitan's attention for language models) has no backward on CPU in torch 2.13.0, so the
    worker swaps in torchtitan's SDPA attention; torchtitan 0.3.0's trainer calls ``step(arg_mbs=...)``, which
    torch 2.13.0 lacks, so the worker calls ``_step_microbatches`` as 2.13's ``step`` does after splitting.
    """
    pytest.importorskip("torchtitan", reason="the exports extra: pip install -e '.[exports]'")
    from tests.conftest import launch_worker

    c = _winner("cpu-host", 4, schedules=("zb-v",), dp_modes=("ddp",))
    assert (c.pp, c.dp, c.chunks, c.microbatches) == (2, 1, 2, 4)
    files = write_exports(c, TINY, 4, None, tmp_path / "plan")
    res = launch_worker(__file__, 2, {"module": str(files["torchtitan"])}, tmp_path, timeout=240)
    assert res["stages"] == [[0, 3], [1, 2]]
    assert res["placement"] == {0: 0, 1: 1, 2: 1, 3: 0}
    assert res["loss"] == pytest.approx(res["reference_loss"], rel=1e-5)
    assert max(res["grad_error"]) < 1e-5


def _worker(payload_file: str, out_file: str) -> None:
    import copy
    import json

    import torch
    import torch.distributed as dist
    import torchtitan.distributed.parallel_dims as titan_dims
    from torch.nn import functional
    from torchtitan.distributed import ParallelDims
    from torchtitan.distributed import pipeline_parallel as ttpp
    from torchtitan.models.common.attention import ScaledDotProductAttention

    cfg = _titan_config(Path(json.loads(Path(payload_file).read_text())["module"]))
    dist.init_process_group("gloo")
    titan_dims.device_type = "cpu"  # torchtitan picks "cuda" on a build without accelerators
    dims = ParallelDims.from_config(cfg.parallelism, dist.get_world_size())
    dims.build_mesh()
    mc = cfg.model_spec.model
    mc.update_from_config(config=cfg)
    for layer in mc.layers:
        layer.attention.inner_attention = ScaledDotProductAttention.Config()
    torch.manual_seed(0)
    model = mc.build()
    model.init_weights(buffer_device=None)
    reference = copy.deepcopy(model)

    def loss_fn(pred, labels):
        return functional.cross_entropy(pred.flatten(0, 1).float(), labels.flatten(), reduction="sum"), None

    stages, parts = ttpp._pipeline_module_split(model, dims.get_mesh("pp"), cfg.parallelism.pipeline_parallel_schedule,
                                                torch.device("cpu"), cfg.parallelism.module_fqns_per_model_part)
    sched = ttpp._build_pipeline_schedule(parallelism=cfg.parallelism, local_batch_size=cfg.training.local_batch_size,
                                          stages=stages, loss_fn=loss_fn)
    batch, seq, mb = cfg.training.local_batch_size, cfg.training.seq_len, cfg.parallelism.pipeline_parallel_microbatch_size
    tokens = torch.randint(0, mc.vocab_size, (batch, seq + 1), generator=torch.Generator().manual_seed(1))
    inputs, labels = tokens[:, :-1], tokens[:, 1:]
    n = batch // mb
    first, last = any(s.is_first for s in stages), any(s.is_last for s in stages)
    losses = [] if last else None
    for stage in stages:  # what torch 2.13's step() does before _step_microbatches
        stage.has_backward = sched._has_backward
        stage.clear_runtime_states()
    sched._step_microbatches(
        arg_mbs=[(inputs[i * mb:(i + 1) * mb],) for i in range(n)] if first else None,
        kwarg_mbs=[{"positions": torch.arange(seq).expand(mb, seq)} for _ in range(n)],
        target_mbs=[labels[i * mb:(i + 1) * mb] for i in range(n)] if last else None, losses=losses,
        return_outputs=False)
    ref_loss = loss_fn(reference(inputs, positions=torch.arange(seq).expand(batch, seq)), labels)[0]
    ref_loss.backward()
    ref_grads = dict(reference.named_parameters())
    errors = [float((p.grad - ref_grads[name].grad).abs().max()) for part in parts
              for name, p in part.named_parameters()]
    mine = {"stages": [s.stage_index for s in stages], "errors": errors,
            "loss": None if losses is None else float(sum(x.detach() for x in losses))}
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    if dist.get_rank() == 0:
        loss = next(x["loss"] for x in every if x["loss"] is not None)
        torch.save({"stages": [x["stages"] for x in every], "placement": dict(sched.stage_index_to_group_rank),
                    "loss": loss, "reference_loss": float(ref_loss.detach()),
                    "grad_error": [e for x in every for e in x["errors"]]}, out_file)
    dist.destroy_process_group()


if __name__ == "__main__":
    _worker(sys.argv[1], sys.argv[2])


def test_unshard_count_is_torchs_own():
    """The UNSHARDs torch's CSV runtime adds (``_add_unshard_reshard``), counted without its quadratic walk: equal
    to torch's own on every built-in schedule's CSV (pp 2 and 4, 1-4 stages a rank), for 1-3 active stages."""
    from torch.distributed.pipelining.schedules import _Action, _add_unshard_reshard

    from analysis.plan.torchtitan import unshard_count
    from schedules import build
    from schedules.interop.torch_csv import torch_csv_text
    from schedules.registry import names

    checked = set()
    for name in names():
        for pp, chunks in ((2, 1), (2, 2), (4, 2), (2, 4), (4, 3)):
            try:
                sched = build(name, pp=pp, microbatches=8, chunks=chunks)
            except Exception:  # a shape the schedule refuses (one chunk only, a V, ...)
                continue
            for line in torch_csv_text(sched).splitlines():
                row = [_Action.from_str(x) for x in line.split(",") if x]
                for active in (1, 2, 3):
                    want = sum(a.computation_type.name == "UNSHARD" for a in _add_unshard_reshard(row, active))
                    assert unshard_count(row, active) == want, (name, pp, chunks, active)
            checked.add(name)
    assert len(checked) >= 12, checked
