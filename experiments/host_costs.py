"""Host-side fixed costs of eager PyTorch training on one GPU: a launch, a synchronize, a layer's host work.

The simulator's stacks (sim.costs.stacks) charge three fixed costs a FLOP count does not see; this measures
them on the GPU at hand:

* ``launch_s``: host time to issue one small CUDA op from eager PyTorch (dispatch + launch), the median over
  blocks of 2,000 in-place adds on a 1 KiB tensor, timed on the host while the GPU keeps up;
* ``sync_s``: the step time a ``torch.cuda.synchronize()`` after every pass adds (what Megatron-LM's blocking
  pipeline sends do after each send/receive: megatron/core/pipeline_parallel/p2p_communication.py,
  ``batch_p2p_sync``): passes of a Llama-3-8B-shaped layer (hidden 4096, 32 heads, 8 KV heads, FFN 14336,
  sequence 4096, bf16) run back to back with and without a synchronize between them; the difference per
  pass, median of rounds;
* ``layer_host_s``: host time to issue one such layer's forward and backward (the host-bound case: a layer of
  hidden 512 at sequence 64, so that the GPU waits for the host), with the number of kernels it launches.

    python experiments/host_costs.py --markdown docs/results/host_costs.md     # on a GPU machine
    python experiments/host_costs.py --device cpu --rounds 2 --json             # a smoke run on the CPU
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F  # noqa: N812 (torch's convention)
from torch import nn


class Layer(nn.Module):
    """A Llama-style decoder layer: RMSNorm, GQA attention (SDPA), RMSNorm, SwiGLU MLP."""

    def __init__(self, hidden: int, heads: int, kv_heads: int, ffn: int) -> None:
        super().__init__()
        self.heads, self.kv, self.hd = heads, kv_heads, hidden // heads
        self.n1, self.n2 = nn.RMSNorm(hidden), nn.RMSNorm(hidden)
        self.qkv = nn.Linear(hidden, (heads + 2 * kv_heads) * self.hd, bias=False)
        self.o = nn.Linear(hidden, hidden, bias=False)
        self.up = nn.Linear(hidden, 2 * ffn, bias=False)
        self.down = nn.Linear(ffn, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q, k, v = self.qkv(self.n1(x)).split([self.heads * self.hd, self.kv * self.hd, self.kv * self.hd], -1)
        q = q.view(b, s, self.heads, self.hd).transpose(1, 2)
        k = k.view(b, s, self.kv, self.hd).transpose(1, 2).repeat_interleave(self.heads // self.kv, 1)
        v = v.view(b, s, self.kv, self.hd).transpose(1, 2).repeat_interleave(self.heads // self.kv, 1)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, h)
        x = x + self.o(a)
        g, u = self.up(self.n2(x)).chunk(2, -1)
        return x + self.down(F.silu(g) * u)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def launch_cost(device: torch.device, rounds: int, n: int = 2000) -> float:
    x = torch.zeros(256, device=device)
    out = []
    for _ in range(rounds + 1):
        _sync(device)
        t = time.perf_counter()
        for _ in range(n):
            x.add_(1.0)
        out.append((time.perf_counter() - t) / n)
        _sync(device)
    return statistics.median(out[1:])


def _pass(layer: Layer, x: torch.Tensor) -> None:
    y = layer(x)
    y.sum().backward()


def sync_cost(device: torch.device, rounds: int, passes: int, shape: tuple[int, ...], dtype: torch.dtype) -> dict:
    hidden, heads, kv, ffn, seq = shape
    layer = Layer(hidden, heads, kv, ffn).to(device, dtype)
    x = torch.randn(1, seq, hidden, device=device, dtype=dtype, requires_grad=True)
    for _ in range(3):
        _pass(layer, x)
    _sync(device)
    plain, synced = [], []
    for _ in range(rounds):
        for sync, out in ((False, plain), (True, synced)):
            _sync(device)
            t = time.perf_counter()
            for _ in range(passes):
                _pass(layer, x)
                if sync:
                    _sync(device)
            _sync(device)
            out.append((time.perf_counter() - t) / passes)
    p, s = statistics.median(plain), statistics.median(synced)
    return {"pass_s": p, "pass_synced_s": s, "sync_s": s - p}


def layer_host(device: torch.device, rounds: int, dtype: torch.dtype) -> dict:
    layer = Layer(512, 8, 8, 1536).to(device, dtype)
    x = torch.randn(1, 64, 512, device=device, dtype=dtype, requires_grad=True)
    for _ in range(3):
        _pass(layer, x)
    _sync(device)
    kernels = gpu_s = None
    if device.type == "cuda":
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            _pass(layer, x)
            _sync(device)
        kernels = sum(1 for e in prof.events() if e.device_type.name == "CUDA")
        gpu_s = sum(e.self_device_time_total for e in prof.key_averages()) * 1e-6
    out = []
    for _ in range(rounds):
        _sync(device)
        t = time.perf_counter()
        for _ in range(20):
            _pass(layer, x)
        out.append((time.perf_counter() - t) / 20)  # host-bound: the GPU waits for each launch
        _sync(device)
    opt = torch.optim.AdamW(layer.parameters(), lr=1e-4, foreach=True)
    steps = []
    for _ in range(rounds):
        _sync(device)
        t = time.perf_counter()
        for _ in range(20):
            torch.nn.utils.clip_grad_norm_(layer.parameters(), 1.0)
            opt.step()
        _sync(device)
        steps.append((time.perf_counter() - t) / 20)
    return {"layer_fwd_bwd_host_s": statistics.median(out), "kernels": kernels, "kernels_gpu_s": gpu_s,
            "optim_step_small_s": statistics.median(steps), "optim_tensors": len(list(layer.parameters()))}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu (a smoke run)")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--passes", type=int, default=20, help="layer passes per timed block")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--markdown", type=Path, help="write the results page here")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("host_costs: no CUDA device; give --device cpu for a smoke run", file=sys.stderr)
        return 2
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    shape = (4096, 32, 8, 14336, 4096) if device.type == "cuda" else (256, 4, 4, 512, 64)
    res = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
           "torch": torch.__version__, "launch_s": launch_cost(device, args.rounds),
           **sync_cost(device, args.rounds, args.passes, shape, dtype), **layer_host(device, args.rounds, dtype),
           "shape": dict(zip(("hidden", "heads", "kv_heads", "ffn", "seq"), shape, strict=True))}
    if args.json:
        print(json.dumps(res, indent=1))
    else:
        for k, v in res.items():
            print(f"{k:24s} {v}")
    if args.markdown:
        gpu = "-" if res["kernels_gpu_s"] is None else f"{res['kernels_gpu_s'] * 1e6:.1f} us"
        lines = ["# Host-side fixed costs of eager PyTorch on one GPU", "",
                 f"- Command: `python experiments/host_costs.py --markdown {args.markdown}`",
                 f"- Date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
                 f"- Device: {res['device']}, torch {res['torch']}, host {platform.platform()}", "",
                 "Written by the command above (medians of its rounds); used by sim.costs.stacks.", "",
                 "| figure | value |", "|---|---:|",
                 f"| launch of one small op (host) | {res['launch_s'] * 1e6:.2f} us |",
                 f"| Llama-3-8B layer, forward + backward | {res['pass_s'] * 1e3:.3f} ms |",
                 f"| the same with a synchronize after each | {res['pass_synced_s'] * 1e3:.3f} ms |",
                 f"| what one synchronize adds | {res['sync_s'] * 1e6:.1f} us |",
                 f"| one small layer's forward + backward, host-bound | {res['layer_fwd_bwd_host_s'] * 1e6:.1f} us |",
                 f"| its CUDA kernels, and their GPU time | {res['kernels']}, {gpu} |",
                 f"| clip + AdamW (foreach) step of its {res['optim_tensors']} tensors | "
                 f"{res['optim_step_small_s'] * 1e6:.1f} us |", ""]
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
