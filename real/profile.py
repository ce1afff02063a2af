"""Time the passes of one stage: F, B, and B split into I and W, per microbatch.

The same functions the executor runs (:mod:`real.backward`), on the CPU with
``time.perf_counter`` or on a GPU with CUDA events on the current stream.
The medians are what a profiled cost model for the simulator needs
(``tf``, ``tb`` = I, ``tw`` = W; B should be close to I + W).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from real.backward import backward_full, backward_input, backward_weight
from real.config import ModelConfig
from real.models import activation_shape, build_layers

__all__ = ["StageProfile", "profile_stage"]


@dataclass(frozen=True, slots=True)
class StageProfile:
    """Median seconds per microbatch of each pass of layers ``layers`` (a middle stage)."""

    layers: range
    microbatch: int
    device: str
    f: float
    b: float
    i: float
    w: float

    def row(self) -> dict[str, float | int | str]:
        return {"layers": f"{self.layers.start}..{self.layers.stop - 1}", "microbatch": self.microbatch,
                "device": self.device, "F": self.f, "B": self.b, "I": self.i, "W": self.w,
                "I+W/B": (self.i + self.w) / self.b if self.b else float("nan")}


def _timer(device: torch.device) -> Callable[[Callable[[], object]], float]:
    if device.type == "cuda":
        def timed(fn: Callable[[], object]) -> float:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1e3
    else:
        def timed(fn: Callable[[], object]) -> float:
            t = time.perf_counter()
            fn()
            return time.perf_counter() - t
    return timed


def _one_rep(stage: torch.nn.Module, params: list[torch.Tensor], shape: tuple[int, ...], grad: torch.Tensor,
             timed: Callable[[Callable[[], object]], float]) -> tuple[float, float, float, float]:
    """(F, B, I, W) seconds: one forward timed with a full backward, one with the split backward."""
    x = torch.randn(shape, device=grad.device, requires_grad=True)
    out: list[torch.Tensor] = []
    tf = timed(lambda: out.append(stage(x)))
    tb = timed(lambda: backward_full(out[0], grad))
    x2 = torch.randn(shape, device=grad.device, requires_grad=True)
    out2 = stage(x2)
    work: list = []
    ti = timed(lambda: work.append(backward_input(out2, grad, x2, params)[1]))
    tw = timed(lambda: backward_weight(work[0]))
    return tf, tb, ti, tw


def profile_stage(model: ModelConfig, layers: range, microbatch: int, device: torch.device,
                  *, reps: int = 20, warmup: int = 3, seed: int = 0) -> StageProfile:
    """F, B, I and W of a middle stage (its input is a hidden state that needs a gradient)."""
    if layers.start < 1 or layers.stop > model.num_layers - 1:
        raise ValueError(f"profile a middle stage: layers within 1..{model.num_layers - 2}, got {layers}")
    stage = torch.nn.Sequential(*build_layers(model, seed, layers)).to(device)
    params = list(stage.parameters())
    shape = activation_shape(model, microbatch)
    grad = torch.randn(shape, device=device)
    timed = _timer(device)
    times: dict[str, list[float]] = {"f": [], "b": [], "i": [], "w": []}
    for rep in range(warmup + reps):
        sample = _one_rep(stage, params, shape, grad, timed)
        if rep >= warmup:
            for k, v in zip("fbiw", sample, strict=True):
                times[k].append(v)
    med = {k: statistics.median(v) for k, v in times.items()}
    return StageProfile(layers, microbatch, str(device), **med)
