"""Lowering: a Schedule becomes a TaskGraph with communication and dependencies.

The TaskGraph is the one object both the simulator and the real runtime
consume. Every task has a rank, a stream and the tasks it waits for:

* compute tasks (F, I, W, B, OVERLAP_F_B) run on the rank's ``compute``
  stream in program order: each waits for the previous compute task;
* data dependencies: F(s, mb) needs F(s-1, mb); a backward (I or B) of
  (s, mb) needs F(s, mb), its recompute R(s, mb) where one runs, and the
  input gradient of stage s+1 (from its I or B); R(s, mb) needs F(s, mb);
  W(s, mb) needs I(s, mb). Across ranks the value travels as a
  SEND task on the producer's ``send`` stream and a RECV task on the
  consumer's ``recv`` stream. These rules are one table, :data:`RULES`,
  that both graph builders read: the fast one (well-formed programs) and the
  checked one (the same graph, or an error naming the rank and the action);
* a SEND or RECV is posted when its rank's program reaches it, so it also
  waits for the compute task before it in program order. A RECV placed after
  its consumer thus shows up as a cycle, as it would hang a real run.

Communication tasks are asynchronous (isend/irecv): they do not wait for
each other. The simulator puts a message's flight time on the SEND.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from common.errors import ScheduleError
from schedules.check import check_schedule
from schedules.graph import STREAM_OF, Stream, Task, TaskGraph
from schedules.ir import Action, Kind, Schedule
from schedules.util import paused_gc

__all__ = ["RULES", "Need", "Rule", "graph_from_programs", "insert_comms", "lower"]

# Graphs returned by lower(): their compute programs are the checked schedule's, so validate() need not check the
# work again. Identity only (TaskGraph compares by identity): a copy or a dataclasses.replace() is checked anew.
_LOWERED: weakref.WeakSet[TaskGraph] = weakref.WeakSet()

_F, _I, _W, _B, _OV = Kind.F, Kind.I, Kind.W, Kind.B, Kind.OVERLAP_F_B
_SF, _RF, _SB, _RB = Kind.SEND_F, Kind.RECV_F, Kind.SEND_B, Kind.RECV_B
_COMPUTE = Stream.COMPUTE


@dataclass(frozen=True, slots=True)
class Need:
    """One thing an action waits for: the first of ``kinds`` run for (its stage + ``offset``, its microbatch).

    ``via``: the value comes from the neighbouring stage (``offset`` is -1 or +1); where that stage lives on
    another rank the action waits instead for the message of this kind at its own stage, and at the first
    (last) stage there is no neighbour and nothing to wait for. ``optional``: waited for only where it runs
    (a recompute). ``what``: how an error names a producer of several kinds (``{stage}``: the producer's stage).
    """

    kinds: tuple[Kind, ...]
    offset: int = 0
    via: Kind | None = None
    optional: bool = False
    what: str = ""


@dataclass(frozen=True, slots=True)
class Rule:
    """What an action kind waits for besides program order; a message also names its other end.

    ``peer``: a message's other end is at its stage + ``peer``; ``pair``: a send needs that receive to exist
    there (a receive waits for its send, ``needs``). Compute kinds without a rule (OVERLAP_F_B) wait for what
    their parts wait for.
    """

    needs: tuple[Need, ...]
    peer: int = 0
    pair: Kind | None = None


_BACKWARD = Rule((Need((_F,)), Need((Kind.R,), optional=True),
                  Need((_I, _B), +1, via=_RB, what="the backward of stage {stage}")))
#: The one table of dependency rules; both graph builders below read it (see the module doc).
RULES: dict[Kind, Rule] = {
    _F: Rule((Need((_F,), -1, via=_RF),)),  # the activations of the stage below
    Kind.R: Rule((Need((_F,)),)),  # recomputes from the input its forward kept
    _I: _BACKWARD,  # its forward (and recompute), and the input gradient of the stage above
    _B: _BACKWARD,
    _W: Rule((Need((_I,)),)),  # the activation gradients its I left
    _SF: Rule((Need((_F,)),), peer=+1, pair=_RF),
    _RF: Rule((Need((_SF,), -1),), peer=-1),
    _SB: Rule((Need((_I, _B)),), peer=-1, pair=_RB),
    _RB: Rule((Need((_SB,), +1),), peer=+1),
}
_KNOWN = tuple(RULES)  # the kinds the fast path of _GraphBuilder handles (and OVERLAP_F_B of them)
_MESSAGES = frozenset(k for k, rule in RULES.items() if rule.peer)
# How the fast path reads a resolved rule (_GraphBuilder._plan); compared by identity.
_NO_ROW, _ONE_ROW, _TWO_ROWS, _SENT, _ROWS = "no row", "one row", "two rows", "sent", "rows"
_Entry = tuple[str, "list[int] | None", "list[int] | None", Stream, "int | None", tuple[tuple[list[int], bool], ...]]

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

    # ------------------------------------------------------------------------------------------ the fast path
    def _index(self) -> dict[Kind, list[list[int]]] | None:
        """Pass 1 of :meth:`_build_fast`: the task id of each piece of work, per kind [stage][microbatch] (-1: none);
        None at a kind it does not handle, a stage or microbatch out of range, or work that appears twice."""
        n, n_mb = self.schedule.num_stages, self.schedule.num_microbatches
        table = {k: [[-1] * n_mb for _ in range(n)] for k in _KNOWN}
        get = table.get
        tid = 0
        for prog in self.programs:
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
        return table

    def _plan(self, table: dict[Kind, list[list[int]]]) -> dict[Kind, list[_Entry | None]]:
        """:data:`RULES` resolved against the placement, once per kind and stage, for :meth:`_build_fast`.

        An entry is ``(shape, a, b, stream, peer, rows)`` for an action on its stage's rank: ``rows`` are the
        rows [microbatch] -> task id it waits for, in the rule's order, each with its ``optional`` flag (a row of
        several kinds merged, the first kind run winning; an optional row no microbatch has left out). ``shape``
        says how to read them: _NO_ROW, _ONE_ROW (row ``a``), _TWO_ROWS (rows ``a``, ``b``), _SENT (producer row
        ``a``, no later than the send; its receive's row ``b`` at the peer) or _ROWS (``rows``). None: a message
        at a stage without a peer on another rank.
        """
        s2r, n = self.schedule.stage_to_rank, self.schedule.num_stages
        merged: dict[tuple[tuple[Kind, ...], int], list[int]] = {}

        def row(kinds: tuple[Kind, ...], st: int) -> list[int]:
            if len(kinds) == 1:
                return table[kinds[0]][st]
            if (kinds, st) not in merged:
                first = table[kinds[0]][st]
                for k in kinds[1:]:
                    more = table[k][st]
                    if max(first) < 0:  # (a row is never empty: every schedule has a microbatch)
                        first = more
                    elif max(more) >= 0:
                        first = [x if x >= 0 else y for x, y in zip(first, more, strict=True)]
                merged[kinds, st] = first
            return merged[kinds, st]

        out: dict[Kind, list[_Entry | None]] = {}
        for kind, rule in RULES.items():
            entries: list[_Entry | None] = []
            for st in range(n):
                nxt = st + rule.peer
                if kind in _MESSAGES and not (0 <= nxt < n and s2r[nxt] != s2r[st]):
                    entries.append(None)
                    continue
                rows: list[tuple[list[int], bool]] = []
                for need in rule.needs:
                    at = st + need.offset
                    if need.via is not None and not 0 <= at < n:
                        continue
                    got = row(need.kinds, at) if need.via is None or s2r[at] == s2r[st] else table[need.via][st]
                    if not need.optional or max(got, default=-1) >= 0:
                        rows.append((got, need.optional))
                peer = s2r[nxt] if kind in _MESSAGES else None
                stream = STREAM_OF[kind] if kind in _MESSAGES else _COMPUTE
                if rule.pair is not None:
                    shape, a, b = _SENT, rows[0][0], table[rule.pair][nxt]
                elif any(opt for _, opt in rows) or len(rows) > 2:
                    shape, a, b = _ROWS, None, None
                else:
                    shape = (_NO_ROW, _ONE_ROW, _TWO_ROWS)[len(rows)]
                    a, b = (rows[0][0] if rows else None), (rows[1][0] if len(rows) > 1 else None)
                entries.append((shape, a, b, stream, peer, tuple(rows)))
            out[kind] = entries
        return out

    def _build_fast(self) -> TaskGraph | None:
        """:meth:`_build_checked` without its error reporting: None at the first thing it would reject.

        Handles the kinds of :data:`RULES` and their overlapped pairs, with stages and microbatches in range and
        every action on its stage's rank; anything else goes to the checked path. Where each piece of work is
        (its task id) is kept in a table per kind indexed [stage][microbatch], and each rule is resolved once per
        stage into the rows it reads (:meth:`_plan`). Builds exactly the same tasks, in the same order, with the
        same dependency tuples.
        """
        table = self._index()
        if table is None:
            return None
        plan = self._plan(table)
        s2r = self.schedule.stage_to_rank
        # Per rank, its stages' entries only (None elsewhere: an action off its stage's rank takes the checked
        # path), keyed by the kind's id: an Enum member's hash is a Python-level call, its id a builtin one.
        n = self.schedule.num_stages
        by_rank: list[dict[int, list[_Entry | None]]] = [{id(k): [None] * n for k in plan}
                                                         for _ in range(self.schedule.num_ranks)]
        for k, entries in plan.items():
            for st, entry in enumerate(entries):
                by_rank[s2r[st]][id(k)][st] = entry
        new, task_cls, compute = _new, Task, _COMPUTE
        set_id, set_rank, set_stream, set_action, set_deps, set_peer = _T_SET
        tasks: list[Task] = []
        append = tasks.append
        rows_out: list[tuple[int, ...]] = []
        tid = 0
        for rank, prog in enumerate(self.programs):
            start = tid
            prev = -1
            plan_get = by_rank[rank].get
            for action in prog:
                kind = action.kind
                entries = plan_get(id(kind))
                if entries is None:
                    if kind is not _OV:
                        return None
                    # an overlapped pair (pass 1 let no other action with sub-actions through)
                    found = self._fast_overlap_deps(action, rank, tid, plan)
                    if found is None:
                        return None
                    deps = found if prev < 0 or prev in found else (prev, *found)
                    stream, peer = compute, None
                else:
                    st, mb = action.stage, action.microbatch
                    entry = entries[st]
                    if entry is None:
                        return None
                    shape, a, b, stream, peer, rows = entry
                    # Plain actions (no sub-actions) have one piece of work, so no dependency can be the task itself.
                    if shape is _ONE_ROW:
                        dep = a[mb]
                        if dep < 0:
                            return None
                        deps = (dep,) if prev < 0 or prev == dep else (prev, dep)
                    elif shape is _SENT:
                        dep = a[mb]
                        if dep < 0 or dep > tid or b[mb] < 0:
                            return None
                        deps = (dep,) if prev < 0 or prev == dep else (prev, dep)
                    elif shape is _TWO_ROWS:
                        dep, grad = a[mb], b[mb]
                        if dep < 0 or grad < 0:
                            return None
                        core: tuple[int, ...] = (dep,) if grad == dep else (dep, grad)
                        deps = core if prev < 0 or prev in core else (prev, *core)
                    elif shape is _NO_ROW:
                        deps = () if prev < 0 else (prev,)
                    else:
                        found = _gather(rows, mb, tid, [])
                        if found is None:
                            return None
                        deps = found if prev < 0 or prev in found else (prev, *found)
                if stream is compute:
                    prev = tid
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
        return TaskGraph(self.schedule, tuple(tasks), tuple(rows_out))

    def _fast_overlap_deps(self, action: Action, rank: int, tid: int,
                           plan: dict[Kind, list[_Entry | None]]) -> tuple[int, ...] | None:
        """The data dependencies of an overlapped pair, its parts' in order, for :meth:`_build_fast`."""
        s2r = self.schedule.stage_to_rank
        deps: list[int] = []
        for a in action.parts():
            entries = plan.get(a.kind)
            if entries is None or a.kind in _MESSAGES or s2r[a.stage] != rank:
                return None
            if _gather(entries[a.stage][5], a.microbatch, tid, deps) is None:
                return None
        return tuple(deps)

    # --------------------------------------------------------------------------------------- the checked path
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
                    deps, peer = self._comm_deps(rank, action, tid)
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
        """What each part of a compute action waits for, by :data:`RULES`; an error names what no rank runs."""
        s2r, n = self.schedule.stage_to_rank, self.schedule.num_stages
        deps: list[int] = []
        for a in action.parts():
            rule = RULES.get(a.kind)
            s, mb = a.stage, a.microbatch
            for need in rule.needs if rule is not None else ():
                at = s + need.offset
                if need.via is not None and not 0 <= at < n:
                    continue  # the first (last) stage: no stage below (above)
                if need.via is not None and s2r[at] != rank:
                    found, what = self._lookup(need.via, s, mb), f"{s}{need.via.value}{mb} on rank {rank}"
                else:
                    found = self._producer(need.kinds, at, mb)
                    what = need.what.format(stage=at) if need.what else f"{at}{need.kinds[0].value}{mb}"
                if found is None:
                    if need.optional:
                        continue
                    raise self._err(rank, a, f"needs {what}, which no rank runs")
                if found[0] != tid and found[0] not in deps:
                    deps.append(found[0])
        return tuple(deps)

    def _comm_deps(self, rank: int, action: Action, tid: int) -> tuple[tuple[int, ...], int]:
        """A message's placement checks, then what it waits for by :data:`RULES` (a send: its producer, a receive:
        its send) and its peer rank."""
        s, mb, kind = action.stage, action.microbatch, action.kind
        s2r, n = self.schedule.stage_to_rank, self.schedule.num_stages
        if not 0 <= s < n:
            raise self._err(rank, action, f"names stage {s}; valid stages are 0..{n - 1}")
        if s2r[s] != rank:
            raise self._err(rank, action, f"stage {s} lives on rank {s2r[s]}, not on rank {rank}")
        rule = RULES[kind]
        nxt = s + rule.peer
        if not 0 <= nxt < n:
            side = "first" if nxt < 0 else "last"
            raise self._err(rank, action, f"has no peer: stage {s} is the {side} stage")
        if s2r[nxt] == rank:
            raise self._err(rank, action, f"has no peer: stage {nxt} is on the same rank, no message is needed")
        peer = s2r[nxt]
        (need,) = rule.needs
        found = self._producer(need.kinds, s + need.offset, mb)
        if rule.pair is not None:  # a send
            match = self._lookup(rule.pair, nxt, mb)
            if found is None:
                raise self._err(rank, action, "sends a value that no action on this rank produces")
            if found[0] > tid:
                raise self._err(rank, action, "comes before the action that produces the value it sends")
            if match is None:
                raise self._err(rank, action, f"is unmatched: rank {peer} has no {nxt}{rule.pair.value}{mb}")
            return (found[0],), peer
        if found is None:
            raise self._err(rank, action, f"is unmatched: rank {peer} has no {nxt}{need.kinds[0].value}{mb}")
        return (found[0],), peer


def _gather(srcs: tuple[tuple[list[int], bool], ...], mb: int, tid: int, deps: list[int]) -> tuple[int, ...] | None:
    """Append to ``deps`` the task ids ``srcs`` give for microbatch ``mb`` (not ``tid`` itself, no repeats), in order;
    None if a required one is missing."""
    for row, optional in srcs:
        found = row[mb]
        if found < 0:
            if optional:
                continue
            return None
        if found != tid and found not in deps:
            deps.append(found)
    return tuple(deps)
