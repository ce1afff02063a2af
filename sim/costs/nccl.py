"""Collectives as NCCL runs them: the algorithm and protocol NCCL's own cost model picks, and their time.

NCCL chooses, per collective call, the algorithm (ring, tree, NVLS, PAT) and the protocol (LL, LL128, Simple)
whose predicted time ``latency + bytes / bandwidth`` is lowest (``ncclTopoGetAlgoTime`` and the tables of
``ncclTopoTuneModel``, src/graph/tuning.cc, NCCL 2.30.7, github.com/NVIDIA/nccl at 5067397). This module takes
that model's structure and its published constants; the bandwidth each algorithm starts from is this
simulator's achieved link rate (:attr:`sim.costs.cluster.Link.rate`, NCCL's bus bandwidth for a ring), not the
topology search's per-channel figures, which exist only on the machine:

* **latency** (microseconds): a base latency per algorithm and protocol, plus per step a hardware latency of
  the hop (NVLink inside a node, the network across nodes). Ring: ``(steps - inter_steps) * intra +
  inter_steps * inter``, steps 2(p-1) for all-reduce and p-1 for reduce-scatter/all-gather, inter_steps
  2(q-1) or q-1 over q nodes; an intra hop on a multi-node ring is at least the network post overhead (1 us,
  x3 for Simple: ``getNetOverhead`` on x86). Multi-node Simple ring all-reduce latency x1.4 (NCCL's "plateau
  effect of ring", compute capability >= 8.0) once each channel carries >= 64 bytes per rank. Tree all-reduce:
  ``2 ((p/q - 1) intra + log2(q) inter)``. With one GPU per node the network hop takes the tree's latency
  (NCCL: "with ppn=1 latencies are fully exposed"). NVLS: its hop latency alone. PAT: ``log2(q) inter / 3.5 +
  2.8 p``;
* **bandwidth** (bus bandwidth B, then the algorithm bandwidth): ring B (``min(NVLink rate, GPUs per node x
  NIC rate)`` across nodes: one ring per NIC, as NCCL builds them on rail-optimised nodes), algorithm bandwidth
  B p / steps; tree all-reduce 0.92 B, algorithm bandwidth half of it, times NCCL's tree correction for medium
  sizes; PAT 0.75 B, no conversion; LL rings half of B capped at NCCL's LL maximum, LL trees B / 3.8, LL128
  rings 0.92 B, LL128 trees 7/9 B on one node and 120/128 B across nodes. NVLS all-reduce (NVLink SHARP, one
  node of Hopper GPUs on NVSwitch): bus bandwidth 480 GB/s on 8 H100s, the NCCL developers' measured figure
  (S. Jeaugey, NVIDIA/nccl-tests issue #212, 2024) in place of the per-channel model;
* **which algorithms exist**: all-reduce: ring, tree, NVLS (one node, a device with NVLS); reduce-scatter and
  all-gather: ring, and PAT when every rank is on its own node (``ncclPatEnable``: "PAT only supports 1 GPU per
  node"), Simple protocol only. LL128 is on for NVLink nodes with NICs on the GPUs' PCIe switch (DGX A100 and
  H100 both). NVLS reduce-scatter/all-gather and multi-node NVLS (CollNet) are not modelled.

Left out, with their reason: per-channel caps (``perChMax*Bws`` x channels: above every bus bandwidth here
at NCCL's 16-32 channels), the aggregation of several calls into one launch (``numPipeOps``), and the tuner
plugins a site may install.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from sim.costs.cluster import Cluster, Link

__all__ = ["NCCL_ALGORITHMS", "NCCL_VERSION", "OPS", "PROTOCOLS", "NcclChoice", "arch_of", "nccl_choice", "on_cluster",
           "runs_nccl"]

NCCL_VERSION = "2.30.7"
NCCL_ALGORITHMS = ("ring", "tree", "nvls", "pat")
PROTOCOLS = ("LL", "LL128", "Simple")
OPS = ("allreduce", "reduce_scatter", "all_gather")

# ncclTunerConstantsDefaults (tuning.cc): microseconds, per protocol (LL, LL128, Simple)
_BASE_LAT = {"tree": (6.8, 14.0, 8.4), "ring": (6.6, 14.0, 8.4), "nvls": (0.0, 0.0, 0.0), "pat": (8.0, 8.0, 8.0)}
_HW_LAT = {
    "nvlink": {"tree": (0.6, 1.25, 4.0), "ring": (0.6, 1.9, 3.4), "nvls": (0.0, 0.0, 25.0), "pat": (0.0, 0.0, 4.0)},
    "net": {"tree": (5.0, 8.5, 14.0), "ring": (2.7, 4.0, 14.0), "nvls": (0.0, 0.0, 18.0), "pat": (0.0, 0.0, 14.0)},
}
_NET_OVERHEAD_US = 1.0  # getNetOverhead on x86 Intel hosts (NCCL_NET_OVERHEAD unset)
# llMaxBws (GB/s) [row][nodes 1 / 2 / >2]: one node by the GPU (Ampere, Hopper); several nodes by the host CPU
# (Intel: the first row)
_LL_MAX = {"ampere": (87.7, 22.5, 19.0), "hopper": (141.0, 45.0, 35.0), "intel-host": (39.0, 39.0, 20.4)}
# treeCorrectionFactor[protocol][log2(bytes / 64)], 64 B to 256 MiB
_TREE_CORRECTION = (
    (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0, 1.0, 1.0),
    (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1.0, 1.0, 1.0),
    (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9, .9),
)
_NVLS_BUS_BW = 480e9  # bytes/s, 8 H100s on NVSwitch (module docstring)
_NVLS_LINE = 450e9  # the line rate that figure was measured on (NVLink 4, per direction)
_CHANNELS = 16  # NCCL's channel count for the ring plateau's per-channel size test (assumed: 16-32 on H100)


@dataclass(frozen=True, slots=True)
class NcclChoice:
    """What NCCL would run for one collective call, and how long it takes (seconds)."""

    algorithm: str
    protocol: str
    time: float
    latency: float  # the part paid before bytes move: the latency term


def _log2i(x: int) -> int:
    return max(x, 1).bit_length() - 1


def _candidates(op: str, ranks: int, nodes: int, nvls: bool) -> list[tuple[str, int]]:
    algos = ["ring"]
    if op == "allreduce":
        algos.append("tree")
        if nvls and nodes == 1:
            algos.append("nvls")
    elif nodes == ranks and nodes > 1:
        algos.append("pat")
    out = []
    for a in algos:
        for p in range(3):
            if a in ("nvls", "pat") and p != 2:
                continue  # NVLS and PAT run the Simple protocol only
            out.append((a, p))
    return out


def _latency_us(op: str, algo: str, proto: int, ranks: int, nodes: int, nbytes: float) -> float:
    ppn = ranks / nodes
    base = _BASE_LAT[algo][proto]
    intra = _HW_LAT["nvlink"][algo][proto]
    if nodes > 1 and proto == 0:
        intra *= 1.8  # LL's intra-node latency on a multi-node communicator (tuning.cc)
    inter = _HW_LAT["net"]["tree" if ppn == 1 else algo][proto]
    if algo == "ring":
        steps = 2 * (ranks - 1) if op == "allreduce" else ranks - 1
        inter_steps = 0 if nodes == 1 else (2 * (nodes - 1) if op == "allreduce" else nodes - 1)
        if nodes > 1:
            intra = max(intra, _NET_OVERHEAD_US * (3 if proto == 2 else 1))
        lat = base + (steps - inter_steps) * intra + inter_steps * inter
        if proto == 2 and nodes > 1 and op == "allreduce" and nbytes / (_CHANNELS * ranks) >= 64:
            lat *= 1.4  # plateau effect of ring (compute capability >= 8.0)
        return lat
    if algo == "tree":
        return base + 2 * ((ranks // nodes - 1) * intra + _log2i(nodes) * inter)
    if algo == "nvls":
        return intra + (inter if nodes > 1 else 0.0)
    return base + _log2i(nodes) * (inter / 3.5) + ranks * 2.8  # pat


def _bandwidth(op: str, algo: str, proto: int, ranks: int, nodes: int, bus: float, arch: str,
               intra_line: float, nbytes: float) -> float:
    """Algorithm bandwidth (bytes/s): time = latency + bytes / this."""
    steps = 2 * (ranks - 1) if op == "allreduce" else ranks - 1
    col = 0 if nodes == 1 else 1 if nodes == 2 else 2
    ll_max = 1e9 * (_LL_MAX[arch][col] if nodes == 1 else _LL_MAX["intel-host"][col])
    if algo == "nvls":
        return _NVLS_BUS_BW / _NVLS_LINE * intra_line * ranks / steps
    if algo == "pat":
        return 0.75 * bus
    if algo == "ring":
        b = min(ll_max, 0.5 * bus) if proto == 0 else 0.92 * bus if proto == 1 else bus
        return b * ranks / steps
    b = 0.92 * bus  # tree all-reduce
    if proto == 0:
        b = min(b / 3.8, ll_max)
    elif proto == 1:
        b *= 7 / 9 if nodes == 1 else 120 / 128
    log = _log2i(int(nbytes) >> 6)
    if 0 <= log < 23 and int(nbytes) >= 64:
        b *= _TREE_CORRECTION[proto][log]
    return 0.5 * b


@lru_cache(maxsize=4096)
def nccl_choice(op: str, nbytes: float, ranks: int, nodes: int, intra: Link, inter: Link, *, nvls: bool = False,
                arch: str = "hopper", algorithm: str = "auto") -> NcclChoice:
    """The algorithm and protocol NCCL picks for ``op`` on ``nbytes`` (the full buffer: all-reduce's input,
    reduce-scatter's input, all-gather's output) over ``ranks`` GPUs on ``nodes`` nodes (the same number on
    each), and its time. ``algorithm`` forces one where the operation has it (NCCL_ALGO); elsewhere NCCL's
    own pick stands (a reduce-scatter has no tree)."""
    if op not in OPS:
        raise ValueError(f"nccl: unknown collective {op!r}; valid: {', '.join(OPS)}")
    if ranks <= 1:
        return NcclChoice("ring", "Simple", 0.0, 0.0)
    bus = intra.rate if nodes == 1 else min(intra.rate, ranks // nodes * inter.rate)
    cands = _candidates(op, ranks, nodes, nvls)
    if algorithm != "auto" and any(a == algorithm for a, _ in cands):
        cands = [(a, p) for a, p in cands if a == algorithm]
    best = None
    for a, p in cands:
        lat = 1e-6 * _latency_us(op, a, p, ranks, nodes, nbytes)
        t = lat + nbytes / _bandwidth(op, a, p, ranks, nodes, bus, arch, intra.bandwidth, nbytes)
        if best is None or t < best.time:
            best = NcclChoice(a, PROTOCOLS[p], t, lat)
    assert best is not None
    return best


def arch_of(device: str) -> str:
    """NCCL's tuning row for a device preset's name: Ampere for A100, Hopper otherwise (H100, H200, later)."""
    return "ampere" if device.upper().startswith("A100") else "hopper"


def runs_nccl(cluster: Cluster, algorithm: str = "auto") -> bool:
    """Whether NCCL's choice times ``cluster``'s collectives: a GPU cluster, and any ``--collective`` but
    hierarchical (a 2D scheme NCCL does not run, kept as the alpha-beta formula)."""
    return cluster.backend == "nccl" and algorithm != "hierarchical"


def on_cluster(cluster: Cluster, op: str, nbytes: float, ranks: int, nodes: int, algorithm: str = "auto") -> NcclChoice:
    """:func:`nccl_choice` with ``cluster``'s links, NVLS and GPU generation."""
    return nccl_choice(op, float(nbytes), ranks, nodes, cluster.intra, cluster.inter, nvls=cluster.nvls,
                       arch=arch_of(cluster.spec.name), algorithm=algorithm)
