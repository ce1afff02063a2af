"""The task graph: what the simulator and the runtime both consume.

Every task has a rank, a stream (compute, send, recv, collective) and the
tasks it waits for. :mod:`schedules.lower` builds the graph from a Schedule;
:func:`topological_order` and :func:`find_cycle` walk it.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from functools import cached_property

from schedules.ir import Action, Kind, Schedule

__all__ = ["STREAM_OF", "Stream", "Task", "TaskGraph", "find_cycle", "topological_order"]


class Stream(StrEnum):
    COMPUTE = "compute"
    SEND = "send"
    RECV = "recv"
    COLLECTIVE = "collective"


STREAM_OF = {
    Kind.SEND_F: Stream.SEND,
    Kind.SEND_B: Stream.SEND,
    Kind.RECV_F: Stream.RECV,
    Kind.RECV_B: Stream.RECV,
}


@dataclass(frozen=True, slots=True)
class Task:
    """One node of the task graph. ``peer`` is the other rank of a SEND/RECV."""

    id: int
    rank: int
    stream: Stream
    action: Action
    deps: tuple[int, ...]
    peer: int | None = None


@dataclass(frozen=True, eq=False)
class TaskGraph:
    """A lowered schedule: tasks (ids 0..n-1) and each rank's program of task ids."""

    schedule: Schedule
    tasks: tuple[Task, ...]
    programs: tuple[tuple[int, ...], ...]

    def __len__(self) -> int:
        return len(self.tasks)

    @property
    def num_ranks(self) -> int:
        return self.schedule.num_ranks

    @cached_property
    def successors(self) -> tuple[tuple[int, ...], ...]:
        succ: list[list[int]] = [[] for _ in self.tasks]
        for t in self.tasks:
            i = t.id
            for d in t.deps:
                succ[d].append(i)
        return tuple(map(tuple, succ))

    def program_actions(self, rank: int) -> list[Action]:
        """Rank ``rank``'s program with communication, as actions (torch's comm-lowered form)."""
        return [self.tasks[i].action for i in self.programs[rank]]

    def to_text(self) -> str:
        """One line per rank, compute and communication actions comma-separated."""
        rows = (",".join(str(a) for a in self.program_actions(r)) for r in range(self.num_ranks))
        return "\n".join(rows) + "\n"


def topological_order(graph: TaskGraph) -> tuple[list[int], list[int]]:
    """Task ids in an order where each comes after its deps (Kahn), and each task's unmet deps.

    The order covers every task exactly when the graph has no cycle; the tasks
    left out (unmet deps > 0) are those waiting on a cycle.
    """
    indeg = [len(t.deps) for t in graph.tasks]
    succ = graph.successors
    ready = [i for i, d in enumerate(indeg) if d == 0]
    order: list[int] = []
    pop, push, emit = ready.pop, ready.append, order.append
    while ready:
        i = pop()
        emit(i)
        for j in succ[i]:
            d = indeg[j] - 1
            indeg[j] = d
            if d == 0:
                push(j)
    return order, indeg


def find_cycle(graph: TaskGraph) -> list[int] | None:
    """Task ids of one cycle of waits (first == last), or None if the graph is acyclic."""
    if _runs_in_program_order(graph):
        return None
    order, indeg = topological_order(graph)
    n = len(graph.tasks)
    if len(order) == n:
        return None
    # Every unfinished task waits on an unfinished task: walk those waits until one repeats.
    stuck = {i for i in range(n) if indeg[i] > 0}
    node = min(stuck)
    path: list[int] = []
    index: dict[int, int] = {}
    while node not in index:
        index[node] = len(path)
        path.append(node)
        node = next(d for d in graph.tasks[node].deps if d in stuck)
    cycle = [*path[index[node] :], node]
    return cycle[::-1]  # in the direction of time: each waits for the one before


def _runs_in_program_order(graph: TaskGraph) -> bool:
    """True if every task can run with each rank taking its program strictly in order (a certificate of no cycle).

    Round robin over the ranks, each advancing while the task at its position has its dependencies done. When
    all tasks run, that order is a topological order. False says nothing (a receive posted ahead of the send it
    waits for can stall a rank here without a cycle): :func:`find_cycle` then looks for real.
    """
    deps = [t.deps for t in graph.tasks]
    done = bytearray(len(deps))
    programs = [p for p in graph.programs if p]
    pos = [0] * len(programs)
    left = len(deps)
    moved = True
    while moved and left:
        moved = False
        for r, prog in enumerate(programs):
            p, end = pos[r], len(prog)
            while p < end:
                t = prog[p]
                for d in deps[t]:
                    if not done[d]:
                        break
                else:
                    done[t] = 1
                    p += 1
                    continue
                break
            if p != pos[r]:
                left -= p - pos[r]
                pos[r] = p
                moved = True
    return left == 0 and all(done)
