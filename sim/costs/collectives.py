"""Collective costs in the alpha-beta model: every formula of the simulator's collectives.

``n`` bytes per participant's full buffer, ``p`` participants, a link with
latency alpha (s) and bandwidth B (bytes/s per direction: the rate NCCL achieves,
:attr:`sim.costs.cluster.Link.rate`, the line rate times the link's efficiency). Sources:

* ring all-reduce = reduce-scatter + all-gather, each (p-1) steps of n/p
  bytes: 2(p-1)alpha + 2(p-1)/p * n/B (Patarasuk & Yuan 2009, "Bandwidth
  optimal all-reduce algorithms"; Thakur, Rabenseifner & Gropp 2005);
* ring reduce-scatter or all-gather alone: (p-1)alpha + (p-1)/p * n/B (same);
* tree all-reduce, pipelined double binary tree (Sanders, Speck & Traeff 2009,
  "Two-tree algorithms for full bandwidth broadcast, reduction and scan"; used
  by NCCL): reduce up and broadcast down, 2 ceil(log2 p) alpha + 2 n/B;
* hierarchical all-reduce over q nodes of g devices (Goyal et al. 2017 style
  2D): intra-node reduce-scatter, inter-node ring all-reduce of the n/g shard,
  intra-node all-gather: 2[(g-1)a1 + (g-1)/g n/B1] + 2(q-1)a2 + 2(q-1)/q (n/g)/B2;
* parameter server (Li et al. 2014; the push/pull analysis of Jiang et al.
  2020, BytePS, sec. 3): w workers each push n bytes sharded over k servers;
  a worker's NIC sends n, a server's NIC receives w n / k, so a push takes
  alpha + max(n/B_worker, w n/(k B_server)); a pull is symmetric.
"""

from __future__ import annotations

import math

from sim.costs.cluster import Link

__all__ = [
    "ALGORITHMS",
    "hierarchical_allreduce",
    "ps_transfer",
    "ring_allreduce",
    "ring_gather",
    "tree_allreduce",
]

#: ``--collective``: auto (NCCL's own choice per call on GPUs, sim.costs.nccl; gloo's ring or the hierarchical
#: scheme on CPUs), or one forced: ring, tree, hierarchical (the 2D formula below), nvls, pat (NCCL only).
ALGORITHMS = ("auto", "ring", "tree", "hierarchical", "nvls", "pat")


def ring_allreduce(n: float, p: int, link: Link) -> float:
    if p <= 1:
        return 0.0
    return 2 * (p - 1) * link.alpha + 2 * (p - 1) / p * n / link.rate


def ring_gather(n: float, p: int, link: Link) -> float:
    """Reduce-scatter or all-gather of an n-byte buffer (each rank ends with / starts from n/p)."""
    if p <= 1:
        return 0.0
    return (p - 1) * link.alpha + (p - 1) / p * n / link.rate


def tree_allreduce(n: float, p: int, link: Link) -> float:
    if p <= 1:
        return 0.0
    return 2 * math.ceil(math.log2(p)) * link.alpha + 2 * n / link.rate


def hierarchical_allreduce(n: float, g: int, q: int, intra: Link, inter: Link) -> float:
    """``g`` devices per node, ``q`` nodes."""
    return 2 * ring_gather(n, g, intra) + ring_allreduce(n / g, q, inter)


def ps_transfer(n: float, workers: int, servers: int, worker: Link, server: Link) -> float:
    """One push (or one pull) of n bytes by each of ``workers`` through ``servers`` shards."""
    if servers < 1:
        raise ValueError("a parameter-server transfer needs at least one server")
    alpha = max(worker.alpha, server.alpha)
    return alpha + max(n / worker.rate, workers * n / (servers * server.rate))
