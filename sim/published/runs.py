"""Published training runs: each row's figure, its source and every setting, assumed ones marked.

Suites:

* ``megatron-2022``: Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer
  Models", arXiv 2205.05198), Table 5 iteration times on A100s (TP 8; configurations from Table 3), and
  the activation memory of Figures 1 and 7 (:data:`KORTHIKANTI_MEMORY`). The four full-recomputation rows
  fitted the A100 GEMM curve (sim.costs.devices); the four others are held out.
* ``torchtitan``: pytorch/torchtitan docs/performance.md (Aug 2024), Llama 3 on 64 A100 80GB with FSDP2:
  8B selective-op AC 2,973 tok/s/GPU (line 11), 70B full AC 331 tok/s/GPU (line 12). Local batch 1, sequence
  8192 (torchtitan's Llama 3 default; 2,973 tok/s x 6.1e10 FLOPs/token = 58% of 312 TFLOP/s, the MFU of the
  row). Its H100 rows (benchmarks/llama3_h100_202412_torchtitan.md) ran on "H100 96GB HBM2e at 500 W",
  whose peak the source itself says is unknown ("between SXM and NVL", footnote 2): they are listed, not
  scored (no device model of that part).
* ``megatron-h100``: NVIDIA/Megatron-LM README, the H100 weak-scaling table (images/model_table.png,
  commit 937571c, July 2024): per-GPU TFLOP/s of GPT models 1.7B-462B, sequence 4096, vocabulary 131,072.
* ``llama3``: Dubey et al. 2024 ("The Llama 3 Herd of Models", arXiv 2407.21783), Table 4: 405B on 8,192
  H100s (TP 8, CP 1, PP 16, DP 64, 430 TFLOP/s per GPU) and 16,384 (DP 128, 400 TFLOP/s); global batch 16M
  tokens of sequence 8192.
* ``megatron-bridge-h100``: NVIDIA Megatron-Bridge performance summary archive (docs.nvidia.com/nemo/megatron-bridge/
  latest/performance-summary-archive.html; its source NVIDIA-NeMo/Megatron-Bridge docs/performance-summary-archive.md,
  commit 4ab94dfad, Aug 2026): the DGX-H100 pre-training rows of dense models, Llama 3 8B, 70B and 3.1 405B, tokens/s
  per GPU. The page prints no BF16 dense H100 row in any release (25.09 to 26.08): these rows are FP8 (FP8-CS),
  scored with dtype fp8. Releases 25.11 (8B, 70B GBS 128, 405B GBS 512) and 26.04.01 (70B GBS 256, 405B GBS 1536).
  Assumed: Megatron's distributed optimizer (zero1, --overlap-param-gather, default buckets) where FSDP is 0, sequence
  parallelism and TP overlap with TP (the page's 25.11 recipes, scripts/performance), even pipeline splits; the 8B
  recipe's 5 of 32 layers recomputed as layer:6. Held out.
* ``automodel-h100``: NVIDIA NeMo AutoModel performance summary (docs.nvidia.com/nemo/automodel/latest/performance/
  performance-summary.md; NVIDIA-NeMo/Automodel docs/performance-summary.mdx, row added April 2026), PyTorch backend
  with FSDP2, DGX-H100 BF16 pre-training: its one dense row, Llama3 70B on 64 GPUs (CP 2, FSDP 32, GBS 128, sequence
  8192), 866.77 tokens/s per GPU. Assumed: activation checkpointing as full recomputation, fp32 gradient reduction
  (AutoModel's FSDP2 default), one-layer FSDP units, fused kernels (torch.compile on). Held out.
* ``megatron-bridge-moe-h100``: the same Megatron-Bridge archive, its DGX-H100 MoE pre-training rows of Qwen3-30B-A3B
  (FP8, tokens/s per GPU; releases 26.04.01 at EP 16 and 26.02.01 at PP 2 x VP 12, EP 8). The page: "we force-balance
  the token distribution among experts and all benchmarks are token-dropless" (uniform routing, no capacity factor).
  Its Qwen3-235B-A22B rows (TP 2 with EP 32 over 16 data-parallel ranks) need MoE parallel folding, which the
  simulator does not model: not listed. Held out.
* ``automodel-moe-h100``: the same AutoModel page, its DGX-H100 BF16 MoE pre-training rows of DeepSeek V3 671B (256
  GPUs) and Qwen3 MoE 30B (8 GPUs), FSDP2 with expert parallelism and "fake balanced gate" routing (uniform). Its
  1,024-GPU DeepSeek row (4 gradient-accumulation steps of the pipeline schedule) and the Kimi, Nemotron and GPT-OSS
  rows (models without a preset) are not listed. Held out.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sim.costs.transformer import model_preset

__all__ = ["KORTHIKANTI_MEMORY", "METRICS", "RUNS", "SUITES", "SUITE_STACKS", "PublishedRun", "suite_runs"]

SUITES = ("megatron-2022", "torchtitan", "megatron-h100", "llama3", "megatron-bridge-h100", "automodel-h100",
          "megatron-bridge-moe-h100", "automodel-moe-h100")
#: The stack each suite's rows ran on (sim.costs.stacks). Korthikanti et al. 2022 measured Megatron-LM before its
#: p2p overlap (May 2023): megatron-legacy; the Megatron-LM README's table (July 2024) Megatron-LM; Megatron-Bridge runs Megatron-core; torchtitan and NeMo AutoModel (FSDP2, PyTorch-native
#: pipelining) run torch.distributed's; Llama 3 ran on Meta's own stack, which is not public: none (no stack costs).
SUITE_STACKS = {"megatron-2022": "megatron-legacy", "torchtitan": "torchtitan", "megatron-h100": "megatron",
                "llama3": "none", "megatron-bridge-h100": "megatron", "automodel-h100": "torchtitan",
                "megatron-bridge-moe-h100": "megatron", "automodel-moe-h100": "torchtitan"}
#: What a row's figure measures: seconds per step, tokens per second per GPU, model TFLOP/s per GPU.
METRICS = ("step_s", "tokens_per_s_per_gpu", "tflops_per_gpu")


@dataclass(frozen=True, slots=True, kw_only=True)
class PublishedRun:
    """One published training run: the figure, where it is printed, and the layout it ran."""

    suite: str
    name: str
    model: str  # a preset of sim.costs.transformer
    cluster: str  # a preset of sim.costs.cluster, e.g. dgx-a100:8
    tp: int
    pp: int
    dp: int
    cp: int = 1  # context parallelism: each sequence split over cp ranks (ring attention); world = tp*pp*dp*cp
    ep: int = 1  # expert parallelism (a MoE model): the routed experts over ep of the dp x cp ranks
    moe_dispatcher: str = "alltoall"  # a MoE model's token dispatch (sim.costs.moe.dispatch_time)
    microbatches: int  # per pipeline replica and step
    microbatch_size: int = 1
    schedule: str = "1f1b"
    chunks: int = 1
    dp_mode: str = "none"
    recompute: str = "none"
    sp: bool = False
    dtype: str = "bf16"
    reduce_dtype: str = "bf16"
    elementwise: str = "fused"
    tp_overlap: bool = False
    overlap_param_gather: bool = False  # zero1/zero2: Megatron-LM's --overlap-param-gather (schedules.dp.modes)
    bucket_mb: float = 25.0  # gradient/parameter bucket (MiB): PyTorch DDP's default, or one FSDP unit
    layers_per_stage: tuple[int, ...] | None = None  # None: as even as possible (sim.costs.transformer.partition_layers)
    metric: str = "step_s"
    published: float
    source: str  # file and line, or table and row
    assumed: tuple[str, ...] = ()  # the settings the source does not give
    fit: bool = False  # the row fitted a parameter (sim.costs.devices)
    scored: bool = True  # False: listed with its reason in ``note``, no prediction scored
    note: str = ""
    settings_source: str = ""  # where the settings (not the figure) come from
    extra: dict = field(default_factory=dict)
    stack: str | None = None  # the training stack it ran on (sim.costs.stacks); None: its suite's (SUITE_STACKS)

    @property
    def run_stack(self) -> str:
        return self.stack or SUITE_STACKS[self.suite]


def _korthikanti(name: str, model: str, pp: int, m: int, b: int, v: int, full_s: float, sel_s: float,
                 row: str) -> list[PublishedRun]:
    common = dict(suite="megatron-2022", model=model, cluster=f"dgx-a100:{pp}", tp=8, pp=pp, dp=1, microbatches=m,
                  microbatch_size=b, schedule="interleaved-1f1b" if v > 1 else "1f1b", chunks=v,
                  settings_source="Korthikanti et al. 2022, Table 3")
    return [PublishedRun(name=f"{name} full", recompute="full", published=full_s, fit=True,
                         source=f"Korthikanti et al. 2022, Table 5, row {row}, 'full recompute'", **common),
            PublishedRun(name=f"{name} sp+selective", recompute="selective", sp=True, published=sel_s,
                         source=f"Korthikanti et al. 2022, Table 5, row {row}, 'selective + sequence parallel'",
                         **common)]


_TT_DOC = "pytorch/torchtitan docs/performance.md"
# FSDP2 as torchtitan applies it: bf16 parameters, gradients reduced in fp32 (torchtitan's default
# [training] mixed_precision_reduce = "float32", torchtitan/config: the MixedPrecisionPolicy it builds).
_TT_H100 = "pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md"
_TT_H100_NOTE = ("H100 96GB HBM2e at a 500 W cap: a device of its own whose peak the source says is unknown; "
                 "no device model, not scored")
_MEG = "NVIDIA/Megatron-LM README.md, images/model_table.png (commit 937571c)"
# Settings the README states: --tp-comm-overlap, --overlap-grad-reduce, --overlap-param-gather (README,
# "Training Speed and Scalability"). The rest is assumed:
_MEG_ASSUMED = ("microbatch_size=1 and 1F1B without virtual stages, as the README's GPT-3 175B example script "
                "at the same commit (examples/gpt3/train_gpt3_175b_distributed.sh)", "recompute none",
                "sequence parallelism", "dp_mode zero1 (distributed optimizer)", "FFN 4h, flash attention, dropout",
                "buckets of Megatron-core's default size, max(40M, 1M x dp) parameters")
_LLAMA = "Dubey et al. 2024 (arXiv 2407.21783), Table 4"


def _megatron_bucket_mib(dp: int) -> float:
    """Megatron-core's default gradient/parameter bucket, max(40M, 1M x dp) parameters (megatron/core/distributed/
    distributed_data_parallel_config.py, ``bucket_size``: "larger DP sizes need larger buckets to ensure
    collectives do not become latency-bound"), in MiB of 16-bit values."""
    return 2 * max(40_000_000, 1_000_000 * dp) / 2**20


def _megatron_h100(model: str, tp: int, pp: int, dp: int, batch: int, tflops: float, row: int) -> PublishedRun:
    return PublishedRun(suite="megatron-h100", name=model.removeprefix("gpt-").upper(), model=model,
                        cluster=f"dgx-h100:{tp * pp * dp // 8}", tp=tp, pp=pp, dp=dp, microbatches=batch // dp,
                        dp_mode="zero1", sp=tp > 1, tp_overlap=tp > 1, overlap_param_gather=True,
                        bucket_mb=_megatron_bucket_mib(dp),
                        metric="tflops_per_gpu", published=tflops,
                        source=f"{_MEG}, row {row}", assumed=_MEG_ASSUMED if tp > 1 else _MEG_ASSUMED[:2] + _MEG_ASSUMED[3:],
                        settings_source=f"{_MEG}, row {row} (heads, hidden, layers, TP, PP, DP, GPUs, batch)")


def _layer_mib(model: str, tp: int, ep: int = 1) -> float:
    """One transformer layer's 16-bit weights per tensor shard, MiB: FSDP's communication unit (it wraps each
    block, as torchtitan and Meta's FSDP do), the bucket the planner also uses (sim.plan.space); a MoE model's MoE
    layer with its E/ep routed experts."""
    m = model_preset(model)
    return 2 * (m.moe_layer_params(ep) if m.moe is not None else m.layer_params) / tp / 2**20


# 126 layers on 16 x 8 = 128 virtual stages: the first holds only the embedding, the last only the output
# (Dubey et al. 2024, sec. 3.3.2, "Pipeline parallelism improvements"; sim.costs.transformer.partition_layers splits them
# so). Gradients accumulated across microbatches and reduce-scattered across the data-parallel workers in FP32
# (sec. 3.3.2, "Numerical stability"): reduce_dtype fp32 (4-byte reduce-scatters, an fp32 gradient shard).
_LLAMA_SETTINGS = (f"{_LLAMA} (TP, CP, PP, DP, sequence, batch size/DP); sec. 3.3.2 'Pipeline parallelism "
                   "improvements' (embedding and output alone on the first and last stage) and 'Numerical stability' "
                   "(gradients accumulated and reduce-scattered in FP32)")
_LLAMA_ASSUMED = ("schedule interleaved-1f1b, chunks=8 (one layer per virtual stage, inferred from 126 = 128 - 2)",
                  "buckets of one layer (FSDP's unit)", "microbatch_size=1", "recompute none", "dp_mode zero2 (FSDP keeping the "
                  "weights after the forward)", "sequence parallelism", "flash attention")

# Megatron-Bridge performance summary (NVIDIA-NeMo/Megatron-Bridge docs/performance-summary-archive.md, rendered at
# docs.nvidia.com/nemo/megatron-bridge/latest/performance-summary-archive.html; commit 4ab94dfad, Aug 2026). Its DGX-H100
# rows of dense models are all FP8 (there is no BF16 dense H100 row in any release): the FP8-CS (current scaling)
# Llama 3 rows, scored with dtype fp8. Figure: Tokens / sec / GPU (the page's Model TFLOP/sec/GPU counts causal
# attention, half the s x s of the count here, sim.published.score: the measured throughput is compared instead).
_MB = ("Megatron-Bridge performance summary archive (docs.nvidia.com/nemo/megatron-bridge/latest/"
       "performance-summary-archive.html; NVIDIA-NeMo/Megatron-Bridge docs/performance-summary-archive.md, commit 4ab94dfad)")
# The page points to its recipes (scripts/performance); the 25.11 ones are at commit 97ad8cc6f ("Added 25.11 starter
# pack"): configs/llama/llama3{,1}_workload_base_configs.py and llama3{,1}_llm_pretrain.py.
_MB_RECIPE = "NVIDIA-NeMo/Megatron-Bridge scripts/performance/configs/llama (commit 97ad8cc6f, 25.11)"
_MB_ASSUMED = ("FP8 as the simulator models it (weight GEMMs at the H100's FP8 GEMM curve; FP8-CS current scaling's "
               "amax and casts not charged)", "flash attention (Transformer Engine)")
_MB_TP_ASSUMED = ("sequence parallelism with TP (the recipes' WorkloadBaseConfig.sequence_parallel = TP > 1)",
                  "TP communication overlap (the recipes' CommOverlapConfig, userbuffers for H100)",
                  "dp_mode zero1 (Megatron's distributed optimizer) with --overlap-param-gather",
                  "buckets of Megatron-core's default size, max(40M, 1M x dp) parameters",
                  "pipeline layers as even as possible (the page gives no split)")


def _bridge_h100(release: str, model: str, name: str, gpus: int, gbs: int, tp: int, pp: int, cp: int, vp: int,
                 fsdp: bool, tokens: float, tflops: float, *, recompute: str = "none",
                 assumed: tuple[str, ...] = ()) -> PublishedRun:
    dp = gpus // (tp * pp * cp)
    precision = "FP8-CS" if release == "25.11" else "FP8"
    table = "'System: DGX-H100'" if release == "25.11" else f"'Model: {name}'"
    return PublishedRun(
        suite="megatron-bridge-h100", name=f"{name} {release}, {gpus} GPUs, GBS {gbs}", model=model,
        cluster=f"dgx-h100:{gpus // 8}", tp=tp, pp=pp, dp=dp, cp=cp, microbatches=gbs // dp, microbatch_size=1,
        schedule="interleaved-1f1b" if vp > 1 else "1f1b", chunks=vp, dtype="fp8", recompute=recompute,
        dp_mode="fsdp" if fsdp else "zero1", sp=tp > 1, tp_overlap=tp > 1, overlap_param_gather=not fsdp,
        bucket_mb=_layer_mib(model, tp) if fsdp else _megatron_bucket_mib(dp),
        metric="tokens_per_s_per_gpu", published=tokens,
        source=f"{_MB}, '{release} NeMo Container', Pre-Training, table {table}, row {name} (DGX-H100, {precision})",
        settings_source=(f"the same row (#GPUs, GBS, MBS 1, sequence 8192, FSDP, TP, PP, CP, VP); {_MB_RECIPE} "
                         "(grad_reduce_in_fp32 False: 16-bit reduction; recompute; sequence parallelism; TP overlap)"),
        assumed=(*_MB_ASSUMED, *(_MB_TP_ASSUMED if not fsdp else ()), *assumed),
        extra={"model_tflops_per_gpu": tflops, "release": release, "precision": precision})


_MB_405B_SPLIT = ("Llama 3.1 405B as the llama3-405b preset (same shape: 126 layers, h 16384, FFN 53248, 128/8 heads)",)
_MB_8B_ASSUMED = ("recompute layer:6: the 25.11 recipe recomputes 5 of 32 layers in full (recompute_num_layers=5), "
                  "modelled as one layer in 6", "FSDP (Megatron-FSDP) over all 8 GPUs, buckets of one layer",
                  "no sequence parallelism (TP 1)")
_MB_2604 = ("settings beyond the row as the 25.11 recipe (the 26.04.01 recipe not read)",)

# NeMo AutoModel performance summary (NVIDIA-NeMo/Automodel docs/performance-summary.mdx, rendered at
# docs.nvidia.com/nemo/automodel/latest/performance/performance-summary.md; the row added in commit 2013a4dd6, April
# 2026, "FSDP2 w weight prefetching and async TP optimization"; page footer "Last Updated: 2025-10-02, main branch").
# PyTorch backend, FSDP2. The one dense pre-training row on DGX-H100 BF16 is Llama3 70B; the others are MoE
# (EP > 1, or GPT-OSS's experts).
_AM = ("NeMo AutoModel performance summary (docs.nvidia.com/nemo/automodel/latest/performance/performance-summary.md; "
       "NVIDIA-NeMo/Automodel docs/performance-summary.mdx, commit 36044ad3d)")
_AM_RECIPE = ("NVIDIA-NeMo/Automodel examples/llm_benchmark/llama3_3/custom_llama3_1_70b_pretrain_benchmark_8nodes.yaml "
              "(the page's configuration file for the row; commit e45812012)")


_MB_MOE_ASSUMED = ("FP8 as the simulator models it (weight GEMMs, the experts' too, at the H100's FP8 GEMM curve, with "
                   "FP8-CS casts)", "flash attention (Transformer Engine)", "dp_mode zero1 (Megatron's distributed "
                   "optimizer) with --overlap-param-gather, buckets of Megatron-core's default size",
                   "the HybridEP dispatcher as the deepep dispatch (once per remote node over the NIC, then NVLink)",
                   "head_dim 128 (Qwen3MoeConfig's default)")


def _bridge_moe(release: str, gpus: int, gbs: int, pp: int, vp: int, ep: int, tokens: float, tflops: float) -> PublishedRun:
    dp = gpus // pp
    return PublishedRun(
        suite="megatron-bridge-moe-h100", name=f"Qwen3_30B_a3B {release}, {gpus} GPUs, EP {ep}", model="qwen3-30b-a3b",
        cluster=f"dgx-h100:{gpus // 8}", tp=1, pp=pp, dp=dp, ep=ep, moe_dispatcher="deepep", microbatches=gbs // dp,
        microbatch_size=1,
        schedule="interleaved-1f1b" if vp > 1 else "1f1b", chunks=vp, dtype="fp8", dp_mode="zero1",
        overlap_param_gather=True, bucket_mb=_megatron_bucket_mib(dp), metric="tokens_per_s_per_gpu", published=tokens,
        source=f"{_MB}, '{release} NeMo Container', Pre-Training, 'Model: Qwen3_30B_a3B', row DGX-H100 (FP8)",
        settings_source=("the same row (#GPUs, GBS, MBS 1, sequence 4096, TP 1, PP, CP 1, VP, EP); the model: "
                         "sim.costs.transformer's qwen3-30b-a3b (Qwen3 report, Bridge's test config); no recompute "
                         "(the H100 FP8-CS recipe, src/megatron/bridge/perf_recipes/qwen/h100/qwen3_moe.py)"),
        assumed=_MB_MOE_ASSUMED, extra={"model_tflops_per_gpu": tflops, "release": release})


_AM_MOE_ASSUMED = ("activation checkpointing as full recomputation of every layer", "gradients reduced in fp32 "
                   "(AutoModel's FSDP2 default)", "buckets of one layer (FSDP2 wraps each decoder layer)",
                   "the DeepEP/HybridEP dispatcher as the deepep dispatch (once per remote node over the NIC, then NVLink)",
                   "FSDP2 prefetching as the simulator's FSDP overlap")


RUNS: tuple[PublishedRun, ...] = (
    *_korthikanti("22B", "megatron-22b", 1, 1, 4, 1, 1.42, 1.10, "22B"),
    *_korthikanti("175B", "gpt3-175b", 8, 64, 1, 3, 18.13, 13.75, "175B"),
    *_korthikanti("530B", "mt-nlg-530b", 35, 280, 1, 3, 49.05, 37.83, "530B"),
    *_korthikanti("1T", "megatron-1t", 64, 512, 1, 1, 94.42, 71.49, "1T"),
    PublishedRun(suite="torchtitan", name="Llama 3 8B, selective op AC", model="llama-8b", cluster="dgx-a100:8", tp=1,
                 pp=1, dp=64, microbatches=1, dp_mode="fsdp", recompute="selective-op", metric="tokens_per_s_per_gpu",
                 reduce_dtype="fp32", elementwise="eager", bucket_mb=_layer_mib("llama-8b", 1),
                 published=2973, source=f"{_TT_DOC}, line 11", settings_source=f"{_TT_DOC}, lines 3-14",
                 assumed=("sequence 8192 (torchtitan's Llama 3 default; consistent with the row's 58.2% MFU)",
                          "eager elementwise kernels (no torch.compile: torchtitan's default then)")),
    PublishedRun(suite="torchtitan", name="Llama 3 70B, full AC", model="llama-70b", cluster="dgx-a100:8", tp=1, pp=1,
                 dp=64, microbatches=1, dp_mode="fsdp", recompute="full", metric="tokens_per_s_per_gpu", published=331,
                 reduce_dtype="fp32", elementwise="eager", bucket_mb=_layer_mib("llama-70b", 1),
                 source=f"{_TT_DOC}, line 12", settings_source=f"{_TT_DOC}, lines 3-14",
                 assumed=("sequence 8192 (torchtitan's Llama 3 default; consistent with the row's 51.7% MFU)",
                          "eager elementwise kernels (no torch.compile: torchtitan's default then)")),
    *(PublishedRun(suite="torchtitan", name=f"Llama 3.1 8B, 8 GPUs, {what}", model="llama-8b", cluster="dgx-h100:1",
                   tp=1, pp=1, dp=8, microbatches=1, microbatch_size=2, dp_mode="fsdp", recompute="selective-op",
                   reduce_dtype="fp32", elementwise="eager", bucket_mb=_layer_mib("llama-8b", 1),
                   metric="tokens_per_s_per_gpu", published=tps, source=f"{_TT_H100}, Table 1, row '{what}'",
                   scored=False, note=_TT_H100_NOTE)
      for what, tps in (("FSDP", 5762), ("FSDP + torch.compile", 6667))),
    _megatron_h100("gpt-1.7b", 1, 1, 48, 192, 408.8, 1),
    _megatron_h100("gpt-7.1b", 2, 1, 48, 192, 465.9, 2),
    _megatron_h100("gpt-16b", 4, 1, 48, 192, 489.1, 3),
    _megatron_h100("gpt-32b", 8, 1, 48, 192, 459.6, 4),
    _megatron_h100("gpt-70b", 8, 2, 48, 384, 419.7, 5),
    _megatron_h100("gpt-119b", 8, 4, 48, 768, 420.5, 6),
    _megatron_h100("gpt-177b", 8, 6, 48, 1152, 432.8, 7),
    _megatron_h100("gpt-314b", 8, 8, 48, 1536, 474.4, 8),
    _megatron_h100("gpt-462b", 8, 16, 48, 3072, 459.9, 9),
    *(PublishedRun(suite="llama3", name=f"405B on {gpus:,} H100", model="llama3-405b", cluster=f"dgx-h100:{gpus // 8}",
                   tp=8, pp=16, dp=dp, microbatches=per_dp, schedule="interleaved-1f1b", chunks=8, dp_mode="zero2",
                   bucket_mb=_layer_mib("llama3-405b", 8), reduce_dtype="fp32",
                   sp=True, metric="tflops_per_gpu", published=tflops, source=f"{_LLAMA}, row '{gpus:,} GPUs, CP 1'",
                   settings_source=_LLAMA_SETTINGS,
                   assumed=_LLAMA_ASSUMED)
      for gpus, dp, per_dp, tflops in ((8192, 64, 32, 430), (16384, 128, 16, 400))),
    _bridge_h100("25.11", "llama-8b", "LLAMA3_8B", 8, 128, 1, 1, 1, 1, True, 14451, 744, recompute="layer:6",
                 assumed=_MB_8B_ASSUMED),
    _bridge_h100("25.11", "llama-70b", "LLAMA3_70B", 64, 128, 4, 8, 1, 5, False, 1602, 719),
    _bridge_h100("25.11", "llama3-405b", "LLAMA3.1_405B", 1024, 512, 8, 8, 2, 8, False, 292, 737,
                 assumed=_MB_405B_SPLIT),
    _bridge_h100("26.04.01", "llama-70b", "LLAMA3_70B", 64, 256, 4, 8, 1, 5, False, 1664, 731, assumed=_MB_2604),
    _bridge_h100("26.04.01", "llama3-405b", "LLAMA3.1_405B", 1024, 1536, 8, 8, 2, 8, False, 328, 827,
                 assumed=(*_MB_405B_SPLIT, *_MB_2604)),
    PublishedRun(suite="automodel-h100", name="Llama3 70B, 64 GPUs, CP 2, FSDP 32", model="llama-70b",
                 cluster="dgx-h100:8", tp=1, pp=1, dp=32, cp=2, microbatches=4, microbatch_size=1, dp_mode="fsdp",
                 recompute="full", reduce_dtype="fp32", bucket_mb=_layer_mib("llama-70b", 1),
                 metric="tokens_per_s_per_gpu", published=866.77,
                 source=(f"{_AM}, 'Pre-Training Performance', table 'System: DGX-H100, Precision: BF16', row 'Llama3 70B' "
                         "(18.90 s per global step, 389 model TFLOP/s per GPU)"),
                 settings_source=(f"the same row (#GPUs 64, GBS 128, MBS 1, LBS 1, GA 4, sequence 8192, TP 1, PP 1, CP 2, "
                                  f"FSDP 32, 'TE + fsdp2_prefetch'); {_AM_RECIPE}: activation_checkpointing True, "
                                  "enable_compile True, reshard_after_forward True"),
                 assumed=("Llama 3.1 70B as the llama-70b preset (same shape)",
                          "activation checkpointing as full recomputation of every layer",
                          "gradients reduced in fp32 (AutoModel's FSDP2 MixedPrecisionPolicy default, reduce_dtype "
                          "float32)", "buckets of one layer (FSDP2 wraps each decoder layer)",
                          "fused elementwise kernels (torch.compile on)",
                          "FSDP2 prefetching as the simulator's FSDP overlap"),
                 extra={"model_tflops_per_gpu": 389, "step_s": 18.90}),
    _bridge_moe("26.04.01", 16, 1024, 1, 1, 16, 8960, 206),
    _bridge_moe("26.02.01", 16, 1024, 2, 12, 8, 9058, 208),
    PublishedRun(suite="automodel-moe-h100", name="DeepSeek V3 671B, 256 GPUs, PP 4 x VP 8, EP 64", model="deepseek-v3",
                 cluster="dgx-h100:32", tp=1, pp=4, dp=64, ep=64, moe_dispatcher="deepep", microbatches=8,
                 microbatch_size=1,
                 schedule="interleaved-1f1b", chunks=8, dp_mode="fsdp", recompute="full", reduce_dtype="fp32",
                 bucket_mb=_layer_mib("deepseek-v3", 1, ep=64), metric="tokens_per_s_per_gpu", published=1002,
                 source=(f"{_AM}, 'Pre-Training Performance', table 'System: DGX-H100, Precision: BF16', row 'DeepSeek V3 "
                         "671B' (256 GPUs; 8.18 s per global step, 250 model TFLOP/s per GPU)"),
                 settings_source=("the same row (#GPUs 256, GBS 512, MBS 1, LBS 8, GA 1, sequence 4096, TP 1, PP 4, "
                                  "CP 1, EP 64, VP 8, FSDP 64, 'TE + DeepEP'); NVIDIA-NeMo/Automodel examples/"
                                  "llm_benchmark/deepseek/deepseek_v3_te_deepep.yaml (interleaved1f1b, activation "
                                  "checkpointing, fake balanced gate)"),
                 assumed=("DeepSeek V3 as the deepseek-v3 preset (MLA, 3 dense layers, 1 shared + 256 routed experts, "
                          "top-8; no multi-token prediction)", *_AM_MOE_ASSUMED),
                 extra={"model_tflops_per_gpu": 250, "step_s": 8.18}),
    PublishedRun(suite="automodel-moe-h100", name="Qwen3 MoE 30B, 8 GPUs, EP 8", model="qwen3-30b-a3b",
                 cluster="dgx-h100:1", tp=1, pp=1, dp=8, ep=8, moe_dispatcher="deepep", microbatches=16,
                 microbatch_size=4, dp_mode="fsdp",
                 recompute="full", reduce_dtype="fp32", bucket_mb=_layer_mib("qwen3-30b-a3b", 1, ep=8),
                 metric="tokens_per_s_per_gpu", published=12040,
                 source=(f"{_AM}, 'Pre-Training Performance', table 'System: DGX-H100, Precision: BF16', row 'Qwen3 MoE "
                         "30B' (21.773 s per global step, 277 model TFLOP/s per GPU)"),
                 settings_source=("the same row (#GPUs 8, GBS 512, MBS 4, LBS 4, GA 16, sequence 4096, TP 1, PP 1, "
                                  "CP 1, EP 8, FSDP 8, 'TE + DeepEP'); NVIDIA-NeMo/Automodel examples/llm_benchmark/"
                                  "qwen/qwen3_moe_30b_te_deepep.yaml (activation checkpointing, fake balanced gate)"),
                 assumed=("Qwen3 MoE 30B as the qwen3-30b-a3b preset (head_dim 128)", *_AM_MOE_ASSUMED),
                 extra={"model_tflops_per_gpu": 277, "step_s": 21.773}),
)


def suite_runs(suite: str) -> tuple[PublishedRun, ...]:
    """The rows of ``suite`` ('all': every row)."""
    return RUNS if suite == "all" else tuple(r for r in RUNS if r.suite == suite)


# Korthikanti et al. 2022, activation memory per GPU of the first pipeline stage: Figure 1 (GiB) for the
# tensor-parallel baseline and with sequence parallelism + selective recomputation; Figure 7 (% of the
# baseline) for sp, selective, sp+selective, full.
KORTHIKANTI_MEMORY = {
    "megatron-22b": ((59.25, 9.5625), (66.84, 49.42, 16.18, 7.64)),
    "gpt3-175b": ((66.84375, 12.3515625), (62.04, 56.53, 18.49, 8.71)),
    "mt-nlg-530b": ((114.0234375, 23.076171875), (58.31, 62.04, 20.27, 9.42)),
    "megatron-1t": ((131.25, 26.5625), (58.31, 62.04, 20.27, 9.42)),
}
