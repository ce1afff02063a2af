"""Lowering: a Schedule becomes a TaskGraph with communication and dependencies.

The TaskGraph is the one object both the simulator and the real runtime
consume. Every task has a rank, a stream and the tasks it waits for:

* compute tasks (F, I, W, B, OVERLAP_F_B) run on the rank's ``compute``
  stream in program order: each waits for the previous compute task;
* data dependencies: F(s, mb) needs F(s-1, mb); a backward (I or B) of
  (s, mb) needs F(s, mb) and the input gradient of stage s+1 (from its I or
  B); W(s, mb) needs I(s, mb). Across ranks the value travels as a
  SEND task on the producer's ``send`` stream and a RECV task on the
  consumer's ``recv`` stream;
* a SEND or RECV is posted when its rank's program reaches it, so it also
  waits for the compute task before it in program order. A RECV placed after
  its consumer thus shows up as a cycle, as it would hang a real run.

Communication tasks are asynchronous (isend/irecv): they do not wait for
each other. The simulator puts a message's flight time on the SEND.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Sequence

from schedules.check import check_schedule
from schedules.errors import ScheduleError
from schedules.graph import STREAM_OF, Stream, Task, TaskGraph
from schedules.ir import Action, Kind, Schedule
from schedules.util import paused_gc

__all__ = ["graph_from_programs", "insert_comms", "lower"]

# Graphs returned by lower(): their compute programs are the checked schedule's, so validate() need not check the
# work again. Identity only (TaskGraph compares by identity): a copy or a dataclasses.replace() is checked anew.
_LOWERED: weakref.WeakSet[TaskGraph] = weakref.WeakSet()

_F, _I, _W, _B, _OV = Kind.F, Kind.I, Kind.W, Kind.B, Kind.OVERLAP_F_B
_SF, _RF, _SB, _RB = Kind.SEND_F, Kind.RECV_F, Kind.SEND_B, Kind.RECV_B
_COMPUTE, _SEND, _RECV = Stream.COMPUTE, Stream.SEND, Stream.RECV
_KNOWN = (_F, _I, _W, _B, _SF, _RF, _SB, _RB)  # the kinds the fast path of _GraphBuilder handles

# A frozen slotted dataclass's __init__ sets each field through object.__setattr__ (about 0.6 us for an Action,
# 0.75 us for a Task on this project's machine, a third of the whole lowering). The two hot loops below make the
# same objects by filling the slots through their descriptors, in about half the time. tests/test_validate.py
# checks that these makers cover every field and give objects equal to the constructor's.
_new = object.__new__
_A_FIELDS = ("kind", "stage", "microbatch", "sub_actions", "bucket")
_T_FIELDS = ("id", "rank", "stream", "action", "deps", "peer")
_A_SET = tuple(getattr(Action, f).__set__ for f in _A_FIELDS)
_T_SET = tuple(getattr(Task, f).__set__ for f in _T_FIELDS)


def _message(kind: Kind, stage: int, mb: int | None,
             _new=_new, _act=Action, _set=_A_SET) -> Action:  # defaults: globals bound once, read as locals
    """``Action(kind, stage, mb)``, made faster (see above)."""
    a = _new(_act)
    _set[0](a, kind)
    _set[1](a, stage)
    _set[2](a, mb)
    _set[3](a, None)
    _set[4](a, None)
    return a


def insert_comms(schedule: Schedule) -> list[list[Action]]:
    """Per-rank programs with SEND/RECV placed around the compute that needs them.

    A RECV goes right before the compute that consumes it, a SEND right after
    the compute that produces it (torch's ``_add_send_recv`` does the same).
    """
    s2r = schedule.stage_to_rank
    last = schedule.num_stages - 1
    msg = _message
    out: list[list[Action]] = []
    for rank, prog in enumerate(schedule.programs):
        # Per stage: does a message cross to the stage below (above), i.e. is it on another rank? One index each.
        below = [s > 0 and s2r[s - 1] != rank for s in range(last + 1)]
        above = [s < last and s2r[s + 1] != rank for s in range(last + 1)]
        lowered: list[Action] = []
        add = lowered.append
        for action in prog:
            subs = action.sub_actions
            if subs is None:  # one pass: its messages around it, no lists to merge
                k, s, mb = action.kind, action.stage, action.microbatch
                if 0 <= s <= last:
                    lo, hi = below[s], above[s]
                elif k is _F or k is _I or k is _B:  # out of range (lower() checks first): the tables' formula
                    lo, hi = s > 0 and s2r[s - 1] != rank, s < last and s2r[s + 1] != rank
                if k is _F:
                    if lo:
                        add(msg(_RF, s, mb))
                    add(action)
                    if hi:
                        add(msg(_SF, s, mb))
                elif k is _I or k is _B:
                    if hi:
                        add(msg(_RB, s, mb))
                    add(action)
                    if lo:
                        add(msg(_SB, s, mb))
                else:
                    add(action)
                continue
            recvs: list[Action] = []
            sends: list[Action] = []
            for a in subs:
                s, mb = a.stage, a.microbatch
                if a.kind is _F:
                    if s > 0 and s2r[s - 1] != rank:
                        recvs.append(msg(_RF, s, mb))
                    if s < last and s2r[s + 1] != rank:
                        sends.append(msg(_SF, s, mb))
                elif a.kind in (_I, _B):
                    if s < last and s2r[s + 1] != rank:
                        recvs.append(msg(_RB, s, mb))
                    if s > 0 and s2r[s - 1] != rank:
                        sends.append(msg(_SB, s, mb))
            lowered += recvs
            add(action)
            lowered += sends
        out.append(lowered)
    return out


def lower(schedule: Schedule) -> TaskGraph:
    """Check the schedule's work, add SEND/RECV and build the task graph.

    Raises ScheduleError for missing or duplicate work, misplaced stages and
    backward-before-forward. Deadlocks are found by :func:`schedules.validate`.
    """
    check_schedule(schedule)
    graph = graph_from_programs(schedule, insert_comms(schedule))
    _LOWERED.add(graph)
    return graph


def work_checked(graph: TaskGraph) -> bool:
    """True for a graph :func:`lower` returned: its compute work already passed :func:`check_schedule`."""
    return graph in _LOWERED


def graph_from_programs(schedule: Schedule, programs: Sequence[Iterable[Action]]) -> TaskGraph:
    """Build the task graph from per-rank programs that already include SEND/RECV.

    ``schedule`` gives the placement and the microbatch count; its own
    programs are not used. Unmatched or misplaced communication raises
    ScheduleError naming the rank and the action.
    """
    with paused_gc():
        return _GraphBuilder(schedule, programs).build()


class _GraphBuilder:
    def __init__(self, schedule: Schedule, programs: Sequence[Iterable[Action]]) -> None:
        if len(programs) != schedule.num_ranks:
            raise ScheduleError(
                f"schedule {schedule.name!r}: got programs for {len(programs)} ranks, "
                f"the schedule has {schedule.num_ranks}; give one program per rank"
            )
        self.schedule = schedule
        self.programs = [list(p) for p in programs]
        self.where: dict[tuple[Kind, int, int | None], tuple[int, int]] = {}  # work -> (task id, rank)

    def _err(self, rank: int, action: Action, why: str) -> ScheduleError:
        return ScheduleError(f"schedule {self.schedule.name!r}, rank {rank}, action {action}: {why}")

    def build(self) -> TaskGraph:
        """The graph; a fast path for well-formed programs, the checked path (same result, or its error) otherwise."""
        try:
            graph = self._build_fast()
        except Exception:  # whatever it was, the checked path below reports it exactly
            graph = None
        if graph is not None:
            return graph
        self.where = {}
        return self._build_checked()

    def _build_fast(self) -> TaskGraph | None:
        """:meth:`_build_checked` without its error reporting: None at the first thing it would reject.

        Handles only the kinds it knows (F, I, W, B, OVERLAP_F_B, SEND/RECV) with stages and microbatches in
        range; anything else goes to the checked path. Where each piece of work is (its task id) is kept in a
        table per kind indexed [stage][microbatch] instead of a dict of tuples. Builds exactly the same tasks,
        in the same order, with the same dependency tuples.
        """
        programs, schedule = self.programs, self.schedule
        s2r, n = schedule.stage_to_rank, schedule.num_stages
        n_mb = schedule.num_microbatches
        table = {k: [[-1] * n_mb for _ in range(n)] for k in _KNOWN}
        get = table.get
        tid = 0
        for prog in programs:
            for action in prog:
                subs = action.sub_actions
                if subs is None:
                    rows, st, mb = get(action.kind), action.stage, action.microbatch
                    if rows is None or type(mb) is not int or not (0 <= st < n and 0 <= mb < n_mb):
                        return None
                    row = rows[st]
                    if row[mb] >= 0:
                        return None
                    row[mb] = tid
                elif action.kind is not _OV:  # only an overlapped pair has sub-actions; the checked path says so
                    return None
                else:
                    for a in subs:
                        rows, st, mb = get(a.kind), a.stage, a.microbatch
                        if rows is None or type(mb) is not int or not (0 <= st < n and 0 <= mb < n_mb):
                            return None
                        row = rows[st]
                        if row[mb] >= 0:
                            return None
                        row[mb] = tid
                tid += 1
        f_at, i_at, b_at = table[_F], table[_I], table[_B]
        rf_at, rb_at, sf_at, sb_at = table[_RF], table[_RB], table[_SF], table[_SB]
        last = n - 1
        new, task_cls = _new, Task
        set_id, set_rank, set_stream, set_action, set_deps, set_peer = _T_SET
        tasks: list[Task] = []
        append = tasks.append
        rows_out: list[tuple[int, ...]] = []
        tid = 0
        for rank, prog in enumerate(programs):
            start = tid
            prev = -1
            for action in prog:
                kind = action.kind
                # Plain actions (no sub-actions) have one piece of work, so no dependency can be the task itself.
                if kind is _SF:
                    st, mb = action.stage, action.microbatch
                    nxt = st + 1
                    if s2r[st] != rank or nxt >= n or s2r[nxt] == rank:
                        return None
                    dep = f_at[st][mb]
                    if dep < 0 or dep > tid or rf_at[nxt][mb] < 0:
                        return None
                    stream, peer = _SEND, s2r[nxt]
                    deps = (dep,) if prev < 0 or prev == dep else (prev, dep)
                elif kind is _RF:
                    st, mb = action.stage, action.microbatch
                    nxt = st - 1
                    if s2r[st] != rank or nxt < 0 or s2r[nxt] == rank:
                        return None
                    dep = sf_at[nxt][mb]
                    if dep < 0:
                        return None
                    stream, peer = _RECV, s2r[nxt]
                    deps = (dep,) if prev < 0 or prev == dep else (prev, dep)
                elif kind is _SB:
                    st, mb = action.stage, action.microbatch
                    nxt = st - 1
                    if s2r[st] != rank or nxt < 0 or s2r[nxt] == rank:
                        return None
                    dep = i_at[st][mb]
                    if dep < 0:
                        dep = b_at[st][mb]
                    if dep < 0 or dep > tid or rb_at[nxt][mb] < 0:
                        return None
                    stream, peer = _SEND, s2r[nxt]
                    deps = (dep,) if prev < 0 or prev == dep else (prev, dep)
                elif kind is _RB:
                    st, mb = action.stage, action.microbatch
                    nxt = st + 1
                    if s2r[st] != rank or nxt >= n or s2r[nxt] == rank:
                        return None
                    dep = sb_at[nxt][mb]
                    if dep < 0:
                        return None
                    stream, peer = _RECV, s2r[nxt]
                    deps = (dep,) if prev < 0 or prev == dep else (prev, dep)
                elif action.sub_actions is None and (kind is _F or kind is _I or kind is _B or kind is _W):
                    st, mb = action.stage, action.microbatch
                    if kind is _F:
                        if st == 0:
                            deps = () if prev < 0 else (prev,)
                        else:
                            dep = f_at[st - 1][mb] if s2r[st - 1] == rank else rf_at[st][mb]
                            if dep < 0:
                                return None
                            deps = (dep,) if prev < 0 or prev == dep else (prev, dep)
                    elif kind is _W:
                        dep = i_at[st][mb]
                        if dep < 0:
                            return None
                        deps = (dep,) if prev < 0 or prev == dep else (prev, dep)
                    else:  # I or B: its forward, and the input gradient from the stage above
                        dep = f_at[st][mb]
                        if dep < 0:
                            return None
                        if st == last:
                            core: tuple[int, ...] = (dep,)
                        else:
                            if s2r[st + 1] == rank:
                                grad = i_at[st + 1][mb]
                                if grad < 0:
                                    grad = b_at[st + 1][mb]
                            else:
                                grad = rb_at[st][mb]
                            if grad < 0:
                                return None
                            core = (dep,) if grad == dep else (dep, grad)
                        deps = core if prev < 0 or prev in core else (prev, *core)
                    stream, peer = _COMPUTE, None
                    prev = tid
                elif kind is _OV:  # an overlapped pair (pass 1 let no other action with sub-actions through)
                    found_deps = self._fast_compute_deps(action, rank, tid, table)
                    if found_deps is None:
                        return None
                    deps = found_deps if prev < 0 or prev in found_deps else (prev, *found_deps)
                    stream, peer = _COMPUTE, None
                    prev = tid
                else:
                    return None
                t = new(task_cls)
                set_id(t, tid)
                set_rank(t, rank)
                set_stream(t, stream)
                set_action(t, action)
                set_deps(t, deps)
                set_peer(t, peer)
                append(t)
                tid += 1
            rows_out.append(tuple(range(start, tid)))
        return TaskGraph(schedule, tuple(tasks), tuple(rows_out))

    def _fast_compute_deps(self, action: Action, rank: int, tid: int,
                           table: dict[Kind, list[list[int]]]) -> tuple[int, ...] | None:
        """The data dependencies of a compute action with sub-actions (an overlapped pair), for :meth:`_build_fast`."""
        s2r, last = self.schedule.stage_to_rank, self.schedule.num_stages - 1
        f_at, i_at, b_at, rf_at, rb_at = table[_F], table[_I], table[_B], table[_RF], table[_RB]
        deps: list[int] = []
        for a in action.parts():
            k, st, mb = a.kind, a.stage, a.microbatch
            if k is _F:
                if st == 0:
                    continue
                found = f_at[st - 1][mb] if s2r[st - 1] == rank else rf_at[st][mb]
            elif k is _I or k is _B:
                found = f_at[st][mb]
                if found < 0:
                    return None
                if found != tid and found not in deps:
                    deps.append(found)
                if st == last:
                    continue
                if s2r[st + 1] == rank:
                    found = i_at[st + 1][mb]
                    if found < 0:
                        found = b_at[st + 1][mb]
                else:
                    found = rb_at[st][mb]
            elif k is _W:
                found = i_at[st][mb]
            else:
                return None
            if found < 0:
                return None
            if found != tid and found not in deps:
                deps.append(found)
        return tuple(deps)

    def _build_checked(self) -> TaskGraph:
        ids: list[list[int]] = []
        flat: list[tuple[int, int, Action]] = []  # (rank, position, action) in id order
        for rank, prog in enumerate(self.programs):
            row = []
            for pos, action in enumerate(prog):
                tid = len(flat)
                flat.append((rank, pos, action))
                row.append(tid)
                for a in action.parts():
                    key = (a.kind, a.stage, a.microbatch)
                    if key in self.where:
                        other = self.where[key][1]
                        raise self._err(rank, a, f"appears twice (also on rank {other}); each runs once")
                    self.where[key] = (tid, rank)
            ids.append(row)

        tasks: list[Task] = []
        for rank, prog in enumerate(self.programs):
            prev_compute: int | None = None
            for pos, action in enumerate(prog):
                tid = ids[rank][pos]
                if action.is_compute:
                    deps = self._compute_deps(rank, action, tid)
                    stream, peer = Stream.COMPUTE, None
                elif action.is_comm:
                    deps, peer = self._comm_deps(rank, action, tid, pos)
                    stream = STREAM_OF[action.kind]
                else:
                    raise self._err(rank, action, "is not a pipeline compute or send/recv action")
                if prev_compute is not None and prev_compute not in deps:
                    deps = (prev_compute, *deps)
                tasks.append(Task(tid, rank, stream, action, deps, peer))
                if action.is_compute:
                    prev_compute = tid
        return TaskGraph(self.schedule, tuple(tasks), tuple(tuple(r) for r in ids))

    def _lookup(self, kind: Kind, stage: int, mb: int | None) -> tuple[int, int] | None:
        return self.where.get((kind, stage, mb))

    def _producer(self, kinds: tuple[Kind, ...], stage: int, mb: int | None) -> tuple[int, int] | None:
        for k in kinds:
            hit = self._lookup(k, stage, mb)
            if hit is not None:
                return hit
        return None

    def _compute_deps(self, rank: int, action: Action, tid: int) -> tuple[int, ...]:
        s2r, last = self.schedule.stage_to_rank, self.schedule.num_stages - 1
        deps: list[int] = []

        def need(found: tuple[int, int] | None, what: str, a: Action) -> None:
            if found is None:
                raise self._err(rank, a, f"needs {what}, which no rank runs")
            if found[0] != tid and found[0] not in deps:
                deps.append(found[0])

        for a in action.parts():
            s, mb = a.stage, a.microbatch
            if a.kind is Kind.F and s > 0:
                if s2r[s - 1] == rank:
                    need(self._lookup(Kind.F, s - 1, mb), f"{s - 1}F{mb}", a)
                else:
                    need(self._lookup(Kind.RECV_F, s, mb), f"{s}RECV_F{mb} on rank {rank}", a)
            elif a.kind is Kind.R:
                need(self._lookup(Kind.F, s, mb), f"{s}F{mb}", a)  # recomputes from the input F kept
            elif a.kind in (Kind.I, Kind.B):
                need(self._lookup(Kind.F, s, mb), f"{s}F{mb}", a)
                recompute = self._lookup(Kind.R, s, mb)
                if recompute is not None:
                    need(recompute, f"{s}R{mb}", a)
                if s < last:
                    if s2r[s + 1] == rank:
                        need(self._producer((Kind.I, Kind.B), s + 1, mb), f"the backward of stage {s + 1}", a)
                    else:
                        need(self._lookup(Kind.RECV_B, s, mb), f"{s}RECV_B{mb} on rank {rank}", a)
            elif a.kind is Kind.W:
                need(self._lookup(Kind.I, s, mb), f"{s}I{mb}", a)
        return tuple(deps)

    def _comm_deps(self, rank: int, action: Action, tid: int, pos: int) -> tuple[tuple[int, ...], int]:
        s, mb, kind = action.stage, action.microbatch, action.kind
        s2r, n = self.schedule.stage_to_rank, self.schedule.num_stages
        if not 0 <= s < n:
            raise self._err(rank, action, f"names stage {s}; valid stages are 0..{n - 1}")
        if s2r[s] != rank:
            raise self._err(rank, action, f"stage {s} lives on rank {s2r[s]}, not on rank {rank}")
        nxt = {Kind.SEND_F: s + 1, Kind.RECV_F: s - 1, Kind.SEND_B: s - 1, Kind.RECV_B: s + 1}[kind]
        if not 0 <= nxt < n:
            side = "first" if nxt < 0 else "last"
            raise self._err(rank, action, f"has no peer: stage {s} is the {side} stage")
        if s2r[nxt] == rank:
            raise self._err(rank, action, f"has no peer: stage {nxt} is on the same rank, no message is needed")
        peer = s2r[nxt]
        if kind in (Kind.SEND_F, Kind.SEND_B):
            kinds = (Kind.F,) if kind is Kind.SEND_F else (Kind.I, Kind.B)
            prod = self._producer(kinds, s, mb)
            match = self._lookup(Kind.RECV_F if kind is Kind.SEND_F else Kind.RECV_B, nxt, mb)
            if prod is None:
                raise self._err(rank, action, "sends a value that no action on this rank produces")
            if prod[0] > tid:
                raise self._err(rank, action, "comes before the action that produces the value it sends")
            if match is None:
                counterpart = f"{nxt}{'RECV_F' if kind is Kind.SEND_F else 'RECV_B'}{mb}"
                raise self._err(rank, action, f"is unmatched: rank {peer} has no {counterpart}")
            return (prod[0],), peer
        send_kind = Kind.SEND_F if kind is Kind.RECV_F else Kind.SEND_B
        match = self._lookup(send_kind, nxt, mb)
        if match is None:
            raise self._err(rank, action, f"is unmatched: rank {peer} has no {nxt}{send_kind.value}{mb}")
        return (match[0],), peer
