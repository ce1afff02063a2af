"""Device models of the A100, H100 and H200: what each parameter is and where it comes from.

GEMMs. Only the A100's curve is fitted on training runs: two parameters,
least squares on the four full-recomputation rows of Korthikanti et al. 2022,
Table 5 (``sim.published.fit_gemm_efficiency``; its four other rows are held
out). The H100 and H200 curves are the A100's transferred by a public
microbenchmark: Bekman's Maximum Achievable Matmul FLOPS (stas00/ml-engineering,
compute/accelerator/README.md, "Maximum Achievable Matmul FLOPS comparison
table", BF16 v2: A100 SXM 271.2 of 312 TFLOP/s, 86.9%; H100 SXM 794.5 of 989,
80.3%; GH200 (the H200's die and HBM3e, at 900 W) 828.6 of 989, 83.6%; FP8:
H100 SXM 1402.6 of 1979, 70.9%; GH200 1535.0 of 1979, 77.6%). A device's peak
fraction is its MAMF efficiency times the A100's ratio of fitted fraction to
MAMF efficiency (0.794 / 0.869): what training GEMMs reach of the best matmul
on the A100 is assumed the same on the others. The half-size point is kept in
time (a GEMM of ``half_flops`` takes the same ~0.2 ms on every device: launch
and tail waves), so ``half_flops`` scales with the device's achievable FLOP/s.

Fused attention: fraction of dense 16-bit peak on the FLOPs a causal kernel
computes. A100: FlashAttention-2 (Dao 2023, arXiv 2307.08691, Figs. 4-5, A100
80GB SXM4, causal, head dimension 128, sequence 8k: ~220 TFLOP/s forward,
~190 backward, read from the bar charts). H100 and H200: FlashAttention-3
(Shah et al. 2024, arXiv 2407.08608, Figs. 5-6, H100 SXM5 BF16, causal, head
dimension 128, sequence 8k-16k: ~610 TFLOP/s forward, ~470 backward, read from
the charts; cuDNN's fused attention, which Transformer Engine runs, is of the
same speed there). The H200 has the H100's tensor cores: the same fractions.

Memory-bound operations run at the datasheet HBM bandwidth (sim.costs.cluster).
Links run at NCCL's achieved fraction of their line rate (sim.costs.cluster, each
figure with its source); the latencies are assumptions.

Compute slowed by communication (``comm_slowdown``): while a rank's NCCL
transfers run, its compute takes 1.189 times as long. Lee et al. 2025
("Characterizing Compute-Communication Overlap in GPU-Accelerated Distributed
Deep Learning: Performance and Power Implications", arXiv 2507.03114,
abstract): overlapping computation and communication slows the computation by
18.9% on average (40.0% at most) against the same computation alone, measured
on A100, H100, MI250 and MI210 with GPT and Llama models. One mean for all
three devices: the study does not give it per device in its abstract.
"""

from __future__ import annotations

from sim.costs.gpu_model import DeviceModel, GemmEfficiency

__all__ = ["COMM_SLOWDOWN", "DEVICE_MODELS", "MAMF", "transferred_gemm"]

# Maximum Achievable Matmul FLOPS, fraction of the datasheet peak (module docstring).
MAMF = {"A100": 271.2 / 312, "H100": 794.5 / 989, "H200": 828.6 / 989,
        "H100-fp8": 1402.6 / 1979, "H200-fp8": 1535.0 / 1979}

# Fitted on Korthikanti et al. 2022 Table 5, full-recomputation rows (sim.published.fit_gemm_efficiency).
A100_GEMM = GemmEfficiency(peak_fraction=0.794, half_flops=2.6e10,
                           source="fitted on Korthikanti et al. 2022 Table 5, full-recomputation rows")
_A100_PEAK = 312e12
COMM_SLOWDOWN = 0.189  # Lee et al. 2025, arXiv 2507.03114: mean slowdown of compute overlapped with communication


def transferred_gemm(mamf: float, peak_flops: float, base: GemmEfficiency = A100_GEMM, what: str = "") -> GemmEfficiency:
    """The A100 curve moved to a device whose matmul microbenchmark reaches ``mamf`` of its ``peak_flops``."""
    fraction = base.peak_fraction * mamf / MAMF["A100"]
    half_time = base.half_flops / (_A100_PEAK * base.peak_fraction)  # seconds of a half-efficiency GEMM
    return GemmEfficiency(peak_fraction=round(fraction, 4), half_flops=float(f"{half_time * peak_flops * fraction:.3g}"),
                          source=f"A100 fit x MAMF {what} / MAMF A100 (Bekman, ml-engineering)")


DEVICE_MODELS: dict[str, DeviceModel] = {
    "A100": DeviceModel(name="A100", gemm=A100_GEMM, attention_forward=220 / 312, attention_backward=190 / 312,
                        comm_slowdown=COMM_SLOWDOWN, source="GEMM fitted (Korthikanti et al. 2022 Table 5); attention FlashAttention-2 paper"),
    "H100": DeviceModel(name="H100", gemm=transferred_gemm(MAMF["H100"], 989e12, what="H100 SXM"),
                        attention_forward=610 / 989, attention_backward=470 / 989,
                        fp8_gemm=transferred_gemm(MAMF["H100-fp8"], 1979e12, what="H100 SXM FP8"),
                        comm_slowdown=COMM_SLOWDOWN,
                        source="GEMM transferred from the A100 by MAMF; attention FlashAttention-3 paper"),
    "H200": DeviceModel(name="H200", gemm=transferred_gemm(MAMF["H200"], 989e12, what="GH200"),
                        attention_forward=610 / 989, attention_backward=470 / 989,
                        fp8_gemm=transferred_gemm(MAMF["H200-fp8"], 1979e12, what="GH200 FP8"),
                        comm_slowdown=COMM_SLOWDOWN,
                        source="GEMM transferred from the A100 by MAMF (GH200); attention as the H100"),
}
