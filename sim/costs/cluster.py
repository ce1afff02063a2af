"""Clusters: devices, the links between them, presets and TOML files.

A cluster is a set of nodes; each node holds accelerators (the ``trainer``
job) and optionally parameter-server hosts (the ``pserver`` job). Devices are
named as placements: ``[NODE]/JOB/TYPE:RANGE``, e.g. ``/trainer/GPU:0-7``
(node0 implied), ``node1/trainer/GPU:0-3`` or ``/pserver/CPU:0``.

Two kinds of link, each full duplex with a latency (alpha, seconds) and a
bandwidth per direction (beta = 1/bandwidth):

* ``intra``: a device's port into its node's fabric (NVLink/NVSwitch);
* ``inter``: a device's own NIC into the cluster network (one NIC per GPU, as
  on DGX systems; a parameter server has one NIC too).

Two devices on one node talk over ``intra``, on different nodes over
``inter``. The network core is assumed non-blocking (a full fat tree), so a
transfer is limited only by the two endpoint ports.
"""

from __future__ import annotations

import math
import re
import tomllib
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common.errors import (
    ClusterError,
    ConfigError,
    check_fraction,
    check_positive,
    check_positive_ints,
    choice,
    find_name,
    quote,
)

__all__ = [
    "CLUSTER_PRESETS",
    "DEVICE_PRESETS",
    "Cluster",
    "Device",
    "DeviceSpec",
    "KeyCheck",
    "Link",
    "check_table",
    "cluster_from_dict",
    "cluster_preset",
    "key_choice",
    "key_flag",
    "key_fraction",
    "key_layer_counts",
    "key_positive",
    "key_positive_int",
    "key_seconds",
    "key_string",
    "load_cluster",
    "parse_placement",
    "read_toml",
]

GB = 1e9  # vendors quote memory and bandwidth in decimal units


@dataclass(frozen=True, slots=True, kw_only=True)
class DeviceSpec:
    """One accelerator (or host) type: dense peak, memory capacity, memory bandwidth."""

    name: str
    peak_flops: float  # dense BF16/FP16 FLOP/s
    memory_bytes: float
    memory_bw: float  # bytes/s (HBM), used for the memory-bound optimizer step
    fp8_flops: float = 0.0  # dense FP8 FLOP/s; 0: no FP8 tensor cores

    def __post_init__(self) -> None:
        for key in ("peak_flops", "memory_bytes", "memory_bw"):
            value = getattr(self, key)
            if not 0 < value < float("inf"):
                raise ClusterError(f"device {self.name!r}: {key} must be a finite number > 0, got {value!r}")
        if not 0 <= self.fp8_flops < float("inf"):
            raise ClusterError(f"device {self.name!r}: fp8_flops must be a finite number >= 0 (0: no FP8), "
                               f"got {self.fp8_flops!r}")


# Vendor figures (dense, without sparsity):
# H100 SXM5 80GB: 989 TFLOP/s BF16, 80 GB HBM3 at 3.35 TB/s (NVIDIA H100 datasheet).
# H200 SXM 141GB: same compute as H100, 141 GB HBM3e at 4.8 TB/s (NVIDIA H200 datasheet).
# A100 SXM4 80GB: 312 TFLOP/s BF16, 80 GB HBM2e at 2.039 TB/s (NVIDIA A100 datasheet).
# Parameter-server host: a dual-socket CPU server; 1 TB DRAM and ~2 TFLOP/s are assumptions
# (only its memory and NIC matter here: the optimizer runs on it but is not timed).
DEVICE_PRESETS: dict[str, DeviceSpec] = {
    # FP8 (H100, H200): 1979 TFLOP/s dense (the same datasheets; 3958 is with sparsity).
    # H100 capacity: the driver reports 81,559 MiB on an "H100 80GB HBM3" (nvidia-smi / the device plugin's
    # inventory of a p5.48xlarge), 85.5e9 bytes: the "80 GB" of the name is not the usable decimal figure.
    "H100": DeviceSpec(name="H100", peak_flops=989e12, memory_bytes=81559 * 2**20, memory_bw=3.35e12,
                       fp8_flops=1979e12),
    "H200": DeviceSpec(name="H200", peak_flops=989e12, memory_bytes=141 * GB, memory_bw=4.8e12, fp8_flops=1979e12),
    "A100": DeviceSpec(name="A100", peak_flops=312e12, memory_bytes=80 * GB, memory_bw=2.039e12),
    "CPU": DeviceSpec(name="CPU", peak_flops=2e12, memory_bytes=1000 * GB, memory_bw=0.3e12),
    # One core of this project's CPU host (2 vCPU Xeon VM, 24 GiB), one training process per core:
    # fp32 peak 2.0 GHz x 32 FLOP/cycle (one AVX-512 FMA unit: 16 lanes x 2) = 64 GFLOP/s, half the
    # RAM each, ~10 GB/s memory bandwidth per core. Assumptions to be replaced by a measured profile
    # (python -m real.profile) when validating against the real runtime.
    "CPU-core": DeviceSpec(name="CPU-core", peak_flops=64e9, memory_bytes=12 * GB, memory_bw=10 * GB),
}


@dataclass(frozen=True, slots=True, kw_only=True)
class Link:
    """A full-duplex port: latency ``alpha`` (s) and ``bandwidth`` per direction (bytes/s, the line rate).

    ``efficiency``: the fraction of the line rate NCCL moves payload at over this link (its protocol
    overhead; the bus bandwidth nccl-tests reports for large messages over the line rate). Every transfer
    and collective runs at :attr:`rate` = bandwidth x efficiency.
    """

    alpha: float
    bandwidth: float
    efficiency: float = 1.0

    def __post_init__(self) -> None:
        if not 0 <= self.alpha < float("inf"):
            raise ClusterError(f"link latency (alpha) must be a finite time >= 0 s, got {self.alpha!r}")
        if not 0 < self.bandwidth < float("inf"):
            raise ClusterError(f"link bandwidth must be a finite number > 0 bytes/s, got {self.bandwidth!r}")
        if not 0 < self.efficiency <= 1:
            raise ClusterError(f"link efficiency must be a fraction of the line rate in (0, 1], got {self.efficiency!r}")

    @property
    def rate(self) -> float:
        """Payload bytes/s a transfer reaches: the line rate times the efficiency."""
        return self.bandwidth * self.efficiency

    def time(self, nbytes: float) -> float:
        """Point-to-point: alpha + n / B (the alpha-beta model, Hockney 1994), B the achieved :attr:`rate`."""
        return self.alpha + nbytes / self.rate


# NVLink 4 (H100/H200): 900 GB/s total per GPU = 450 GB/s per direction; NVLink 3 (A100):
# 600 GB/s total = 300 GB/s per direction (NVIDIA datasheets). ConnectX-7 NDR: 400 Gb/s =
# 50 GB/s per direction per GPU (DGX H100: 8 per node); HDR: 200 Gb/s = 25 GB/s (DGX A100).
# Latencies are assumptions of the usual order: ~3 us through NVSwitch, ~5 us over InfiniBand.
# NCCL's achieved fraction of the line rate (efficiency), from the NCCL developers' own figures:
# * NVLink 4: "450GB/s is the line rate. With the protocol overhead (~20%) NCCL can get an effective NVLink
#   bandwidth of 370GB/s" (bus bandwidth of ring collectives and non-all-reduce operations; S. Jeaugey,
#   NVIDIA/nccl-tests issue #212, 2024): 370 / 450. NVLink SHARP all-reduces (NVLS, ~480 GB/s bus bandwidth
#   on 8 GPUs, same thread) are not modelled: an intra-node all-reduce is timed as a ring at 370.
# * NVLink 3: "~160GB/s intra-node" bus bandwidth on 8 A800 (NVLink 3 at 200 GB/s per direction; S. Jeaugey,
#   NVIDIA/nccl issue #412, 2023): 160 / 200, the same protocol on the A100's 300 GB/s.
# * NDR 400 Gb/s: "For NDR @ 400Gbps you should see 46-48GB/s per NIC" (NCCL team, NVIDIA/nccl-tests issue
#   #290, 2025): 47 / 50.
# * HDR 200 Gb/s: "24GB/s inter-node" bus bandwidth (S. Jeaugey, NVIDIA/nccl issue #412): 24 / 25.
_NVLINK4 = Link(alpha=3e-6, bandwidth=450 * GB, efficiency=370 / 450)
_NVLINK3 = Link(alpha=3e-6, bandwidth=300 * GB, efficiency=160 / 200)
_NDR = Link(alpha=5e-6, bandwidth=50 * GB, efficiency=47 / 50)
_HDR = Link(alpha=5e-6, bandwidth=25 * GB, efficiency=24 / 25)
# CPU host: gloo over TCP on loopback between processes of one host (assumed ~50 us, ~2 GB/s),
# 10 Gb Ethernet between hosts (1.25 GB/s, ~50 us). Assumptions, to be calibrated by measurement.
_LOOPBACK = Link(alpha=50e-6, bandwidth=2 * GB)
_TEN_GBE = Link(alpha=50e-6, bandwidth=1.25 * GB)


@dataclass(frozen=True, slots=True)
class Device:
    """One device of the cluster: node index, job (trainer or pserver), type and index on its node."""

    node: int
    job: str
    type: str
    index: int

    def __str__(self) -> str:
        return f"node{self.node}/{self.job}/{self.type}:{self.index}"


_PLACEMENT_RE = re.compile(r"^(?:node([0-9]+))?/(trainer|pserver)/([A-Za-z][A-Za-z0-9]*):([0-9]+)(?:-([0-9]+))?$",
                           re.ASCII | re.IGNORECASE)


def parse_placement(text: str) -> list[Device]:
    """``node1/trainer/GPU:0-3`` -> four devices; a missing node means node0."""
    m = _PLACEMENT_RE.match(text.strip())
    if m is None:
        raise ClusterError(
            f"malformed placement {text!r}: expected [nodeN]/JOB/TYPE:I or :I-J with JOB trainer or pserver, "
            "e.g. '/trainer/GPU:0-7', 'node1/trainer/GPU:0-3', '/pserver/CPU:0'"
        )
    node, job, typ, lo, hi = m.groups()
    first, last = _count(text, lo), _count(text, hi if hi is not None else lo)
    if last < first:
        raise ClusterError(f"malformed placement {text!r}: range {first}-{last} is empty; write the low index first")
    check_cluster_size(text, last - first + 1)
    typ = find_name(typ, ("CPU", "GPU", *DEVICE_PRESETS)) or typ  # names without regard to case: /trainer/cpu:0
    return [Device(_count(text, node or "0"), job.lower(), typ, i) for i in range(first, last + 1)]


def parse_devices(text: str) -> list[Device]:
    """``/pserver/CPU:0,/trainer/CPU:0-3`` -> five devices (:func:`parse_placement` of each part); a device named
    twice is refused (it would be counted, and launched, twice)."""
    devices: list[Device] = []
    seen: set[Device] = set()
    for part in text.split(","):
        for d in parse_placement(part):
            if d in seen:
                raise ClusterError(f"placement {quote(text)} lists device {d} twice; name each device once",
                                   field="placement")
            seen.add(d)
            devices.append(d)
        check_cluster_size(text, len(devices))
    return devices


@dataclass(frozen=True, slots=True, kw_only=True)
class Cluster:
    """Devices and links. ``trainer`` devices are ordered by (node, index); ``pservers`` likewise."""

    name: str
    spec: DeviceSpec
    intra: Link
    inter: Link
    devices: tuple[Device, ...]
    pserver_spec: DeviceSpec = DEVICE_PRESETS["CPU"]
    pservers: tuple[Device, ...] = field(default=())
    #: NVLink SHARP in the node's NVSwitches (DGX H100/H200): NCCL's NVLS all-reduce (sim.costs.nccl)
    nvls: bool = False
    #: Trainer devices per node when every node holds the same number (then device g is on the (g // node_size)-th
    #: node), else 0; and the distinct counts per node. Derived from ``devices`` once, so that questions about nodes
    #: cost nothing per call on a cluster of a million devices.
    node_size: int = field(init=False, repr=False, compare=False)
    node_sizes: tuple[int, ...] = field(init=False, repr=False, compare=False)
    num_nodes: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "devices", tuple(sorted(self.devices, key=lambda d: (d.node, d.index))))
        object.__setattr__(self, "pservers", tuple(sorted(self.pservers, key=lambda d: (d.node, d.index))))
        if not self.devices:
            raise ClusterError(f"cluster {self.name!r} has no trainer devices; add e.g. '/trainer/GPU:0-7'")
        for group in (self.devices, self.pservers):
            seen = set()
            for d in group:
                if (d.node, d.index) in seen:
                    raise ClusterError(f"cluster {self.name!r}: device {d} is listed twice")
                seen.add((d.node, d.index))
        counts: dict[int, int] = {}
        for d in self.devices:
            counts[d.node] = counts.get(d.node, 0) + 1
        sizes = tuple(sorted(set(counts.values())))
        object.__setattr__(self, "node_sizes", sizes)
        object.__setattr__(self, "node_size", sizes[0] if len(sizes) == 1 else 0)
        object.__setattr__(self, "num_nodes", len(counts))

    @property
    def num_devices(self) -> int:
        return len(self.devices)

    @property
    def backend(self) -> str:
        """The collectives library: 'nccl' on GPUs (its own algorithm choice, sim.costs.nccl), 'gloo' on CPUs."""
        return "gloo" if self.spec.name.upper().startswith("CPU") else "nccl"

    def link_between(self, a: int, b: int) -> Link:
        """The link two trainer devices (by position in ``devices``) use to talk."""
        return self.intra if self.devices[a].node == self.devices[b].node else self.inter

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "device": self.spec.name,
            "devices": self.num_devices,
            "nodes": self.num_nodes,
            "pservers": len(self.pservers),
            "intra_GBps": self.intra.bandwidth / GB,
            "inter_GBps": self.inter.bandwidth / GB,
            "intra_alpha_s": self.intra.alpha,
            "inter_alpha_s": self.inter.alpha,
            "intra_efficiency": self.intra.efficiency,
            "inter_efficiency": self.inter.efficiency,
            "backend": self.backend,
            "nvls": self.nvls,
        }


_NODE_PRESETS: dict[str, tuple[DeviceSpec, int, Link, Link]] = {
    # name -> (device, GPUs per node, intra-node link, inter-node link per GPU)
    "dgx-h100": (DEVICE_PRESETS["H100"], 8, _NVLINK4, _NDR),
    "dgx-h200": (DEVICE_PRESETS["H200"], 8, _NVLINK4, _NDR),
    "dgx-a100": (DEVICE_PRESETS["A100"], 8, _NVLINK3, _HDR),
    "cpu-host": (DEVICE_PRESETS["CPU-core"], 2, _LOOPBACK, _TEN_GBE),
}
# Third-generation NVSwitch (DGX H100/H200) carries NVLink SHARP, which NCCL runs as its NVLS algorithm
# (NVIDIA DGX H100 user guide, "NVLink Switch System"; NCCL 2.17 release notes: "Add support for NVLink SHARP");
# the A100's second-generation NVSwitch has none.
_NVLS_PRESETS = frozenset({"dgx-h100", "dgx-h200"})
CLUSTER_PRESETS = tuple(_NODE_PRESETS)


# The most devices a cluster may list (trainers and parameter servers): every device is an object, and the largest
# training clusters reported hold about 10^5 accelerators (Llama 3: 16,384 H100s, arXiv 2407.21783), so 2^20 is
# far beyond any real one while its device list still takes well under a second and a few hundred MB to build.
MAX_DEVICES = 2**20


def check_cluster_size(name: str, devices: int) -> None:
    """A cluster of more than :data:`MAX_DEVICES` devices is refused before any device is built."""
    if devices > MAX_DEVICES:
        raise ClusterError(f"cluster {quote(name)} would hold {devices:,} devices; at most {MAX_DEVICES:,} "
                           "(2^20) are supported: give fewer nodes", field="cluster")


def _count(text: str, digits: str) -> int:
    """A node or server count; one too large to hold is refused by its digits, before int() is asked."""
    if len(digits) > 18:
        raise ClusterError(f"cluster {quote(text)}: a count of {len(digits)} digits; at most {MAX_DEVICES:,} (2^20) "
                           "devices are supported: give fewer nodes", field="cluster")
    return int(digits)


def cluster_preset(text: str) -> Cluster:
    """``dgx-h100:2`` = two DGX H100 nodes; ``dgx-h100:2+ps4`` adds four CPU parameter servers."""
    m = re.match(r"^([a-z0-9-]+)(?::([0-9]+))?(?:\+ps([0-9]+))?$", text.strip(), re.IGNORECASE | re.ASCII)
    if m is None or find_name(m.group(1), _NODE_PRESETS) is None:
        raise ClusterError(
            f"unknown cluster {text!r}: valid presets are {', '.join(CLUSTER_PRESETS)}, written NAME[:NODES][+psK] "
            "(e.g. 'dgx-h100:2', 'dgx-a100:4+ps2'), or a [cluster] table in a TOML config", field="cluster"
        )
    name = find_name(m.group(1), _NODE_PRESETS)
    nodes, ps = _count(text, m.group(2) or "1"), _count(text, m.group(3) or "0")
    if nodes < 1:
        raise ClusterError(f"cluster {text!r}: the node count must be >= 1, got {nodes}")
    spec, per_node, intra, inter = _NODE_PRESETS[name]
    check_cluster_size(text, nodes * per_node + ps)
    kind = "CPU" if spec.name.startswith("CPU") else "GPU"
    devices = [Device(n, "trainer", kind, i) for n in range(nodes) for i in range(per_node)]
    pservers = [Device(nodes + j, "pserver", "CPU", 0) for j in range(ps)]  # one host per node of their own
    return Cluster(name=text.strip(), spec=spec, intra=intra, inter=inter, devices=tuple(devices),
                   pservers=tuple(pservers), nvls=name in _NVLS_PRESETS)


# ---------------------------------------------------------------- TOML tables: every key known and of its kind

#: One key's check: ``check(owner, key, value, error)`` raises ``error`` (one line naming owner, key and value).
KeyCheck = Callable[[str, str, Any, type[ConfigError]], None]


def check_table(table: str, data: Any, schema: Mapping[str, KeyCheck], *,
                error: type[ConfigError] = ConfigError) -> None:
    """``data`` a TOML table whose keys are all in ``schema``, each value passing its key's check.

    The errors name the table as ``config [TABLE]``, the key (as ``field``)
    and the value, and say what would be valid.
    """
    owner = f"config [{table}]"
    if not isinstance(data, Mapping):
        raise error(f"config: [{table}] must be a table of keys, got {quote(data)}")
    unknown = sorted(map(str, set(data) - set(schema)))
    if unknown:
        raise error(f"{owner}: unknown key(s) {quote(unknown)}; valid: {', '.join(sorted(schema))}")
    for key, value in data.items():
        schema[key](owner, key, value, error)


def key_positive_int(owner: str, key: str, value: Any, error: type[ConfigError] = ConfigError) -> None:
    """An integer >= 1 (not a float such as 2.5 or 2.0, not a bool)."""
    check_positive_ints(owner, error, **{key: value})


def key_positive(unit: str = "") -> KeyCheck:
    """A finite number > 0 (``unit`` follows it in the message, e.g. `` MiB``)."""
    def check(owner: str, key: str, value: Any, error: type[ConfigError] = ConfigError) -> None:
        check_positive(owner, key, value, unit, error)
    return check


def key_fraction(what: str = "a fraction", *, open_low: bool = False) -> KeyCheck:
    """A number in [0, 1] (``open_low``: in (0, 1])."""
    def check(owner: str, key: str, value: Any, error: type[ConfigError] = ConfigError) -> None:
        check_fraction(owner, key, value, what, open_low=open_low, error=error)
    return check


def key_choice(valid: Collection[str]) -> KeyCheck:
    """One of ``valid``."""
    def check(owner: str, key: str, value: Any, error: type[ConfigError] = ConfigError) -> None:
        choice(owner, key, value, tuple(valid), error)  # any case: the config taking the value names it canonically
    return check


def key_string(what: str) -> KeyCheck:
    """A non-empty string; ``what`` says what it names, e.g. ``a schedule name``."""
    def check(owner: str, key: str, value: Any, error: type[ConfigError] = ConfigError) -> None:
        if not isinstance(value, str) or not value.strip():
            raise error(f"{owner}: {key} must be {what} (a string), got {quote(value)}", field=key)
    return check


def key_flag(owner: str, key: str, value: Any, error: type[ConfigError] = ConfigError) -> None:
    """true or false (not 1, not "yes")."""
    if not isinstance(value, bool):
        raise error(f"{owner}: {key} must be true or false, got {quote(value)}", field=key)


def key_seconds(owner: str, key: str, value: Any, error: type[ConfigError] = ConfigError) -> None:
    """A finite time >= 0 s."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < math.inf:
        raise error(f"{owner}: {key} must be a finite number >= 0 s, got {quote(value)}", field=key)


def key_layer_counts(owner: str, key: str, value: Any, error: type[ConfigError] = ConfigError) -> None:
    """A list of whole layer counts >= 0, one per stage (never truncated: 6.2 and "12,12" are refused)."""
    ok = isinstance(value, Sequence) and not isinstance(value, str | bytes) and all(
        isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in value)
    if not ok:
        raise error(f"{owner}: {key} must be a list of whole layer counts >= 0, one per stage, e.g. [12, 12], "
                    f"got {quote(value)}", field=key)


def _checked_below(owner: str, key: str, value: Any, error: type[ConfigError] = ConfigError) -> None:
    """A key whose value :func:`cluster_from_dict` checks itself (devices; a device preset or table)."""


_DEVICE_TABLE: dict[str, KeyCheck] = {
    "name": key_string("the device's name"), "peak_TFLOPs": key_positive(" TFLOP/s"),
    "memory_GB": key_positive(" GB"), "memory_GBps": key_positive(" GB/s"),
}
_CLUSTER_TABLE: dict[str, KeyCheck] = {
    "name": key_string("the cluster's name"), "device": _checked_below, "pserver_device": _checked_below,
    "devices": _checked_below, "intra_GBps": key_positive(" GB/s"), "inter_GBps": key_positive(" GB/s"),
    "intra_alpha_s": key_seconds, "inter_alpha_s": key_seconds, "nvls": key_flag,
}


def cluster_from_dict(data: Mapping[str, Any], *, name: str = "custom") -> Cluster:
    """Build a cluster from a TOML table; see ``--config`` in the README for the keys."""
    owner = "config [cluster]"
    if isinstance(data, Mapping) and "preset" in data:
        extra = set(data) - {"preset"}
        if extra:
            raise ClusterError(f"{owner}: 'preset' excludes other keys, got {quote(sorted(extra))}")
        key_string("a cluster preset such as 'dgx-h100:2'")(owner, "preset", data["preset"], ClusterError)
        return cluster_preset(data["preset"])
    check_table("cluster", data, _CLUSTER_TABLE, error=ClusterError)
    spec = _device_spec(data.get("device", "H100"), "device")
    placements = data.get("devices")
    if (not isinstance(placements, Sequence) or isinstance(placements, str) or not placements
            or not all(isinstance(p, str) for p in placements)):
        raise ClusterError(f"{owner}: devices must be a non-empty list of placements (strings), "
                           f"e.g. ['/trainer/GPU:0-7'], got {quote(placements)}", field="devices")
    parsed: list[Device] = []
    for placement in placements:  # each placement is bounded, and so is the sum so far: never past 2 x MAX_DEVICES
        parsed += parse_placement(placement)
        check_cluster_size(str(data.get("name", name)), len(parsed))
    intra = Link(alpha=data.get("intra_alpha_s", 3e-6), bandwidth=data.get("intra_GBps", 450) * GB)
    inter = Link(alpha=data.get("inter_alpha_s", 5e-6), bandwidth=data.get("inter_GBps", 50) * GB)
    return Cluster(
        name=data.get("name", name),
        spec=spec,
        intra=intra,
        inter=inter,
        devices=tuple(d for d in parsed if d.job == "trainer"),
        pserver_spec=_device_spec(data.get("pserver_device", "CPU"), "pserver_device"),
        pservers=tuple(d for d in parsed if d.job == "pserver"),
        nvls=data.get("nvls", False),
    )


def _device_spec(value: Any, key: str) -> DeviceSpec:
    """A device preset's name, or a table of its figures (``[cluster.device]``)."""
    if isinstance(value, Mapping):
        check_table(f"cluster.{key}", value, _DEVICE_TABLE, error=ClusterError)
        missing = sorted({"peak_TFLOPs", "memory_GB", "memory_GBps"} - set(value))
        if missing:
            raise ClusterError(f"config [cluster.{key}]: missing key(s) {missing}; give peak_TFLOPs, memory_GB "
                               "and memory_GBps", field=key)
        return DeviceSpec(name=value.get("name", "custom"), peak_flops=value["peak_TFLOPs"] * 1e12,
                          memory_bytes=value["memory_GB"] * GB, memory_bw=value["memory_GBps"] * GB)
    found = find_name(value, DEVICE_PRESETS)
    if found is None:
        raise ClusterError(f"config [cluster]: unknown {key.replace('_', ' ')} {quote(value)}; "
                           f"valid: {', '.join(DEVICE_PRESETS)} or a table", field=key)
    return DEVICE_PRESETS[found]


def load_cluster(path: str | Path) -> Cluster:
    """Read a cluster from a TOML file: either the top level or its ``[cluster]`` table."""
    data = read_toml(path)
    return cluster_from_dict(data.get("cluster", data), name=Path(path).stem)


def read_toml(path: str | Path) -> dict[str, Any]:
    """A TOML file's tables; a missing, binary or malformed file raises one line naming it."""
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise ClusterError(f"config file {str(path)!r} not found; give an existing .toml file") from None
    except IsADirectoryError:
        raise ClusterError(f"config file {str(path)!r} is a directory; give a .toml file") from None
    except UnicodeDecodeError as exc:
        raise ClusterError(f"config file {str(path)!r} is not UTF-8 text (at byte {exc.start}); give a .toml file") from None
    except tomllib.TOMLDecodeError as exc:
        raise ClusterError(f"config file {str(path)!r} is not valid TOML: {str(exc).splitlines()[0]}") from None

