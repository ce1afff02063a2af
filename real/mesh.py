"""Ranks as (data-parallel replica, pipeline rank) coordinates, and a process group per dimension.

Global rank ``g`` is pipeline rank ``g % pp`` of replica ``g // pp``. Each
replica's pipeline gets two groups for its point-to-point messages (lower ->
higher and higher -> lower pipeline rank, see :mod:`real.p2p`); each pipeline
rank's replicas share one data-parallel group for the gradient collectives.
On a GPU the default group is "cpu:gloo,cuda:nccl": CUDA tensors go through
NCCL, the few CPU control messages (clock offsets, losses, results) through
gloo. Multi-node runs need nothing more than torchrun's rendezvous.

With parameter servers (dp mode ps, :mod:`real.dp.ps`) the ``servers`` processes
come after the pp x dp trainers: global ranks pp x dp .. pp x dp + servers - 1;
they share one group (``server_group``) for gathering their shards into a
checkpoint, and talk to the trainers point to point on the default group.

With expert parallelism (``ep`` > 1, :mod:`real.moe`) each pipeline rank's replicas are cut into groups of
``ep`` consecutive ones (``ep_group``, the forward's all-to-alls; ``ep_grad_group``, the same ranks, the
backward's: an overlapped pair's two passes never queue behind each other), and the replicas at the same place of
every ep group share an expert data-parallel group (``expert_dp_group``, the experts' gradient all-reduce; one rank
when ep = dp).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from real.config import Plan

__all__ = ["Mesh", "env_world"]

log = logging.getLogger(__name__)


def env_world() -> tuple[int, int, int]:
    """(rank, world size, local rank): from the process group if there is one, else torchrun's env."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", 0))
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)), int(os.environ.get("LOCAL_RANK", 0))


def _attempt_store(rank: int, world: int, timeout: timedelta) -> dict:
    """Under torchrun: the launcher's store, with keys prefixed by the attempt and the world size.

    torchrun keeps one store across restarts, so without the prefix a
    restarted group would read the dead attempt's addresses and fail to
    connect. A restart after a membership change (``--nnodes MIN:MAX``) keeps
    the restart count but changes the world size, hence both in the prefix.
    """
    if "TORCHELASTIC_RESTART_COUNT" not in os.environ or "MASTER_ADDR" not in os.environ:
        return {}
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world,
                          is_master=not agent and rank == 0, timeout=timeout)
    prefix = f"schedlab/attempt{attempt}/world{world}"
    return {"store": dist.PrefixStore(prefix, store), "rank": rank, "world_size": world}


def _expert_groups(rank: int, pp: int, dp: int, ep: int, timeout: timedelta
                   ) -> tuple[dist.ProcessGroup | None, dist.ProcessGroup | None, dist.ProcessGroup | None]:
    """(ep group, its twin for the backward, expert data-parallel group) of ``rank``; every rank creates every
    group in the same order."""
    mine: list[dist.ProcessGroup | None] = [None, None, None]
    for i in range(pp):
        for g in range(dp // ep):
            ranks = [(g * ep + j) * pp + i for j in range(ep)]
            pair = (dist.new_group(ranks, timeout=timeout), dist.new_group(ranks, timeout=timeout))
            if rank in ranks:
                mine[0], mine[1] = pair
        for j in range(ep):
            ranks = [(g * ep + j) * pp + i for g in range(dp // ep)]
            group = dist.new_group(ranks, timeout=timeout)
            if rank in ranks:
                mine[2] = group
    return mine[0], mine[1], mine[2]


@dataclass(eq=False)
class Mesh:
    """This rank's place in the pp x dp grid and its process groups (None where a dimension is 1)."""

    pp: int
    dp: int
    rank: int
    device: torch.device
    p2p_groups: tuple[dist.ProcessGroup, dist.ProcessGroup] | None
    dp_group: dist.ProcessGroup | None
    owns_process_group: bool = False
    servers: int = 0
    server_group: dist.ProcessGroup | None = None
    ep: int = 1
    ep_group: dist.ProcessGroup | None = None
    expert_dp_group: dist.ProcessGroup | None = None
    ep_grad_group: dist.ProcessGroup | None = None

    @property
    def ep_rank(self) -> int:
        """This replica's place in its ep group (which experts it holds)."""
        return self.dp_rank % self.ep

    @property
    def pp_rank(self) -> int:
        return self.rank % self.pp

    @property
    def dp_rank(self) -> int:
        return self.rank // self.pp

    @property
    def world_size(self) -> int:
        return self.pp * self.dp + self.servers

    @property
    def is_server(self) -> bool:
        """A parameter server (dp mode ps) rather than a trainer."""
        return self.rank >= self.pp * self.dp

    def server_rank(self, index: int) -> int:
        """The global rank of parameter server ``index``."""
        return self.pp * self.dp + index

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    def global_rank(self, pp_rank: int, dp_rank: int | None = None) -> int:
        return (self.dp_rank if dp_rank is None else dp_rank) * self.pp + pp_rank

    @classmethod
    def create(cls, plan: Plan, backend: str, timeout_s: float) -> Mesh:
        """Join (or create) the default process group and build the per-dimension groups.

        Every rank creates every group in the same order, as torch requires.
        """
        rank, world, local = env_world()
        device = torch.device("cuda", local) if backend == "nccl" else torch.device("cpu")
        if device.type == "cuda":
            torch.cuda.set_device(device)
        owns = False
        timeout = timedelta(seconds=timeout_s)  # also for the subgroups: new_group's own default is 30 min
        if world > 1 and not dist.is_initialized():
            spec = "cpu:gloo,cuda:nccl" if backend == "nccl" else "gloo"
            dist.init_process_group(spec, timeout=timeout, **_attempt_store(rank, world, timeout))
            owns = True
        pp, dp = plan.config.layout.pp, plan.config.layout.dp
        p2p = dpg = None
        if pp > 1:
            for d in range(dp):
                ranks = [d * pp + i for i in range(pp)]
                pair = (dist.new_group(ranks, timeout=timeout), dist.new_group(ranks, timeout=timeout))
                if rank in ranks:
                    p2p = pair
        if dp > 1:
            for i in range(pp):
                ranks = [d * pp + i for d in range(dp)]
                group = dist.new_group(ranks, timeout=timeout)
                if rank in ranks:
                    dpg = group
        ep = plan.config.layout.ep
        epg, epgg, edpg = _expert_groups(rank, pp, dp, ep, timeout) if ep > 1 else (None, None, None)
        servers = plan.config.sync.servers
        server_group = None
        if servers:
            group = dist.new_group([pp * dp + j for j in range(servers)], timeout=timeout)
            server_group = group if rank >= pp * dp else None
        log.debug("rank %d: pipeline rank %d of replica %d on %s", rank, rank % pp, rank // pp, device)
        return cls(pp, dp, rank, device, p2p, dpg, owns, servers, server_group, ep, epg, edpg, epgg)

    def close(self) -> None:
        """Destroy the process group if :meth:`create` made it."""
        if self.owns_process_group and dist.is_initialized():
            dist.destroy_process_group()
