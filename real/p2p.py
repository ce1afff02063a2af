"""Point-to-point messages of one pipeline rank's program: activations forward, gradients back.

Shapes are agreed up front (every boundary carries the model's hidden state,
or, for a user model, the shape and dtype every rank inferred for it), so a
receive is posted into a fresh buffer without a handshake. Ordering is
what makes this deadlock-free on every backend:

* messages from rank a to rank b travel on a process group used only for
  that direction (one group for lower -> higher pipeline rank, one for higher
  -> lower), so a pair's two directions never queue behind each other (NCCL
  runs a pair's operations in order on one stream);
* receives from a peer are posted in the order the peer's program sends them
  (every rank knows every program), so the k-th send meets the k-th receive
  even where a backend ignores tags (NCCL); gloo gets a unique tag per
  message too;
* receives are posted early: ``recv_ahead`` per peer (all of a step's by
  default) at the step's start, topped up as they are consumed, and waited
  for only right before the compute that needs them. Sends are asynchronous;
  their completion is polled between tasks and awaited at the end of the step
  (gloo reports a point-to-point completion only through ``wait``, so there a
  SEND's recorded end is bounded by its receiver's, see :mod:`real.train`).

The static validation of the task graph (no cycle of waits with asynchronous
sends) then guarantees that every wait is eventually satisfied.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from schedules import Kind, Task, TaskGraph

__all__ = ["Inflight", "PeerError", "PipeComm", "matching_sends"]

_MATCH = {Kind.RECV_F: Kind.SEND_F, Kind.RECV_B: Kind.SEND_B}


def matching_sends(graph: TaskGraph) -> dict[int, int]:
    """The SEND task id that every RECV task id of the graph receives from."""
    by_work = {(t.action.kind, t.action.stage, t.action.microbatch): t.id for t in graph.tasks if t.action.is_comm}
    out = {}
    for t in graph.tasks:
        a = t.action
        if a.kind in _MATCH:
            src_stage = a.stage - 1 if a.kind is Kind.RECV_F else a.stage + 1
            out[t.id] = by_work[(_MATCH[a.kind], src_stage, a.microbatch)]
    return out


class Inflight:
    """Asynchronous works whose end is stamped when first seen complete (polled between tasks)."""

    def __init__(self, stamp: Callable[[], object]) -> None:
        self._stamp = stamp
        self._works: deque[tuple[dist.Work, list | None, object]] = deque()

    def add(self, work: dist.Work, row: list | None, keepalive: object = None) -> None:
        """``keepalive``: what must outlive the work (a send's tensor)."""
        self._works.append((work, row, keepalive))

    def poll(self) -> None:
        while self._works and self._works[0][0].is_completed():
            self._finish(self._works.popleft()[1])

    def drain(self) -> None:
        while self._works:
            work, row, _ = self._works.popleft()
            work.wait()
            self._finish(row)

    def _finish(self, row: list | None) -> None:
        if row is not None:
            row[2] = self._stamp()


@dataclass(eq=False)
class _Posted:
    buffer: torch.Tensor
    work: dist.Work


class PeerError(RuntimeError):
    """A peer did not answer within the process group's timeout (or its connection closed): names the peer."""


class PipeComm:
    """Sends and receives of pipeline rank ``pp_rank`` for the task graph ``graph``.

    ``global_rank(pp_rank)`` maps a pipeline rank of this replica to its global
    rank; ``groups`` is (lower -> higher, higher -> lower).
    """

    def __init__(
        self,
        graph: TaskGraph,
        pp_rank: int,
        *,
        global_rank: Callable[[int], int],
        groups: tuple[dist.ProcessGroup, dist.ProcessGroup],
        shape: tuple[int, ...],
        dtype: torch.dtype,
        device: torch.device,
        recv_ahead: int | None,
        stamp: Callable[[], object],
        boundaries: dict[int, tuple[tuple[int, ...], torch.dtype]] | None = None,
    ) -> None:
        """``boundaries[s]``: (shape, dtype) of stage ``s``'s output and its gradient, where not ``shape``/``dtype``."""
        self.pp_rank, self.shape, self.dtype, self.device = pp_rank, shape, dtype, device
        self._boundaries = boundaries or {}
        self._tasks = graph.tasks
        self._global, self._groups, self._ahead = global_rank, groups, recv_ahead
        self._queue, self._where, self._tag = self._plan(graph, pp_rank)
        self._posted: dict[int, _Posted] = {}
        self._next = dict.fromkeys(self._queue, 0)  # per peer: index of the next receive to post
        self._open = dict.fromkeys(self._queue, 0)  # per peer: posted and not yet consumed
        self.sends = Inflight(stamp)
        self._stream = torch.cuda.Stream(device) if device.type == "cuda" else None

    @staticmethod
    def _plan(graph: TaskGraph, me: int) -> tuple[dict[int, list[int]], dict[int, tuple[int, int]], dict[int, int]]:
        """Per peer, my receives in the order the peer sends them; each receive's tag (its send's id)."""
        tag = {r: s for r, s in matching_sends(graph).items() if graph.tasks[r].rank == me}
        send_to_recv = {s: r for r, s in tag.items()}
        queue: dict[int, list[int]] = {}
        for peer, prog in enumerate(graph.programs):
            mine = [send_to_recv[t] for t in prog if t in send_to_recv]
            if mine:
                queue[peer] = mine
        where = {r: (peer, i) for peer, rs in queue.items() for i, r in enumerate(rs)}
        return queue, where, tag

    def _buffer(self, tid: int) -> torch.Tensor:
        """A fresh buffer for RECV task ``tid``: RECV_F of stage s carries stage s-1's output, RECV_B stage s's."""
        a = self._tasks[tid].action
        shape, dtype = self._boundaries.get(a.stage - 1 if a.kind is Kind.RECV_F else a.stage, (self.shape, self.dtype))
        return torch.empty(shape, dtype=dtype, device=self.device)

    def _group(self, src: int, dst: int) -> dist.ProcessGroup:
        return self._groups[0] if src < dst else self._groups[1]

    def start_step(self) -> None:
        if self._posted:
            raise RuntimeError(f"pipeline rank {self.pp_rank}: {len(self._posted)} receives left over from the last step")
        for peer, recvs in self._queue.items():
            self._next[peer] = self._open[peer] = 0
            self._post(peer, len(recvs) if self._ahead is None else self._ahead)

    def _post(self, peer: int, upto: int) -> None:
        recvs = self._queue[peer]
        group = self._group(peer, self.pp_rank)
        while self._next[peer] < min(upto, len(recvs)):
            tid = recvs[self._next[peer]]
            if self._stream is not None:
                with torch.cuda.stream(self._stream):
                    buf = self._buffer(tid)
                    work = dist.irecv(buf, src=self._global(peer), group=group, tag=self._tag[tid])
            else:
                buf = self._buffer(tid)
                work = dist.irecv(buf, src=self._global(peer), group=group, tag=self._tag[tid])
            self._posted[tid] = _Posted(buf, work)
            self._next[peer] += 1
            self._open[peer] += 1

    def recv(self, task: Task) -> torch.Tensor:
        """The value of RECV task ``task``; posts it (and the peer's earlier ones) if not yet posted."""
        peer, index = self._where[task.id]
        self._post(peer, index + 1)
        posted = self._posted.pop(task.id)
        try:
            posted.work.wait()  # on a GPU: makes the current stream wait for the transfer
        except RuntimeError as exc:  # the group's timeout passed, or the peer's connection closed
            raise PeerError(
                f"rank {self._global(self.pp_rank)}: no {task.action} from rank {self._global(peer)} "
                f"(pipeline rank {peer}): the peer died or hangs ({str(exc).splitlines()[0]})"
            ) from exc
        if self._stream is not None:
            posted.buffer.record_stream(torch.cuda.current_stream(self.device))
        self._open[peer] -= 1
        if self._ahead is not None:
            self._post(peer, self._next[peer] + self._ahead - self._open[peer])
        return posted.buffer

    def send(self, task: Task, value: torch.Tensor, row: list | None) -> None:
        """Post SEND task ``task`` of ``value``; the row's end is stamped when it completes."""
        value = value.detach().contiguous()
        dst = self._global(task.peer)
        group = self._group(self.pp_rank, task.peer)
        if self._stream is not None:
            self._stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(self._stream):
                work = dist.isend(value, dst=dst, group=group, tag=task.id)
            value.record_stream(self._stream)
        else:
            work = dist.isend(value, dst=dst, group=group, tag=task.id)
        self.sends.add(work, row, value)

    def finish_step(self) -> None:
        self.sends.drain()
        if self._posted:
            raise RuntimeError(f"pipeline rank {self.pp_rank}: receives {sorted(self._posted)} were never consumed")
