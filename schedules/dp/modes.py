"""Data parallelism as a pass: a pipeline TaskGraph -> a new TaskGraph with collectives.

The graph stays one pipeline replica (its pp ranks); the ranks that hold the
same stage in the other dp replicas run the same program at the same times,
so each collective is one task of the replica's rank and its cost (set by a
cost model) covers the whole dp group. Sizes stay abstract here: the caller
says how many buckets each stage's parameters make.

Modes (``fsdp`` is an alias of ``zero3``):

* ``sync``: after a rank's last compute, ALLREDUCE every bucket of its stages,
  then one OPTIM per stage on the compute stream;
* ``ddp``: a stage's buckets are all-reduced while its last gradient pass (the
  last B or W of the stage) runs: bucket k is ready (k+1)/K of the way
  through that pass (gradients appear from the last layer backwards), then
  OPTIM after the stage's buckets;
* ``zero1``: as ddp with REDUCE_SCATTER instead of ALLREDUCE, OPTIM on the
  shard, then ALL_GATHER of the updated parameters;
* ``zero2``: gradients are kept sharded, so every microbatch's gradient pass
  reduce-scatters its buckets (ready as in ddp); OPTIM, then ALL_GATHER;
* ``overlap_param_gather`` (zero1, zero2; Megatron-LM's ``--overlap-param-gather``):
  the all-gather of the updated parameters runs under the next step's forward
  instead of after OPTIM: the gathers are issued when the optimizer step ends
  and each layer's forward waits for its own bucket. One step of the steady
  state is simulated, so the gathers of the step before are issued at the
  step's start (no dependency); the stage's first F waits for its bucket 0
  (its first layers) and the rank's next compute task for the other buckets
  (gathered while that F runs; the F's end is not held back by its last
  bucket, an error of at most that bucket's layers' forward). OPTIM ends the
  step;
* ``zero3``: parameters are sharded too: before each pass of a stage (F, I,
  W, B or R: every one reads the parameters, W too, see below) its buckets are
  all-gathered (once per task, the microbatch of its pass of that stage on the
  gather), gradients reduce-scattered as in zero2, OPTIM on the shard.
  ``prefetch`` k >= 1 issues a pass's gathers when the compute k passes before
  it starts (1, the default: one pass ahead, as FSDP's forward/backward
  prefetch); 0 issues them when the compute before it ends (on demand,
  exposed). With ``one_buffer`` (the runtime, :mod:`real.dp.zero`: one flat
  buffer per stage, not FSDP's per-layer units) a gather is issued no earlier
  than the end of the last pass within its prefetch window that reads the
  same stage: it cannot land in a buffer that pass still reads (and the
  step's first gathers wait for their pass's own dependencies). With
  ``reshard_after_forward`` False the parameters a forward (F or R) gathered
  stay gathered until a backward of the stage has used them (FSDP's
  ``reshard_after_forward=False``): no gather before that backward, nor
  before a forward of the stage in between; a backward (I, W, B) always
  reshards (FSDP's ``reshard_after_backward``). W reads the parameters: the
  first stage's W is its whole backward (its input needs no gradient), and
  elsewhere autograd's weight-gradient nodes read them too (LayerNorm's
  backward reads its weight for any output; torch's pipelining runtime also
  unshards before a W);
* ``decentralized`` (decentralized SGD, Lian et al. 2017, "Can decentralized
  algorithms outperform centralized algorithms?", as Bagua's
  ``DecentralizedAlgorithm`` runs it): no gradient collective; each bucket's
  parameters are exchanged (EXCHANGE, a send and a receive with one peer
  replica) with each of ``peers`` neighbours, issued when the step starts
  (Bagua marks the weights ready in its forward pre-hook, so the exchange of
  x_t overlaps the forward and backward), and the stage's OPTIM waits for its
  exchanges (Bagua's post-backward hook waits and copies the averaged weights
  back, then the optimizer applies the local gradient: x_{t+1} = mean of the
  neighbourhood's x_t - lr g_i(x_t)). ``peers``: 2 for a ring of more than
  two replicas, 1 for a ring of two or a random peer per step
  (:func:`exchange_peers`);
* ``local-sgd`` (Stich 2019, "Local SGD converges fast and communicates
  little"; torch's ``PeriodicModelAverager``): replicas step alone; on an
  averaging step (``averaging`` True, one step in ``sync_every``) every bucket
  of a stage's parameters is all-reduced after its OPTIM; a local step has
  OPTIM only;
* ``ps``: each bucket is pushed to the parameter servers (REDUCE_SCATTER) when
  ready, as in ddp; the servers' update of a stage (OPTIM on the collective
  stream of the stage's rank: the servers' work, which the trainer only waits
  for) follows the last push of the stage's buckets and the update of the stage
  after it (a server folds the pushes and steps the stages one at a time, the
  last stage first: :meth:`real.dp.ps.ParamServer.step`), and each bucket's pull
  (ALL_GATHER) waits for its stage's update;
* ``async-ps``: the same tasks as ps (one trainer's step; :mod:`sim.costs.async_ps`
  runs it over many steps for every trainer under the staleness bound); the
  cost model times each push and pull as one trainer's alone at the servers
  (trainers do not wait for each other's pushes, so they do not arrive
  together), where ps shares the servers' links among all the trainers'
  simultaneous pushes.

With ``embedding`` True and the first and the last stage on different ranks,
the tied word embedding's gradient is all-reduced between those two ranks
(Megatron-LM's ``_allreduce_word_embedding_grads`` when
``share_embeddings_and_output_weights``): one ALLREDUCE task on each of the
two ranks, after both ranks' last gradient pass of that stage and its
data-parallel gradient collectives, before that stage's OPTIM (modes without
OPTIM: nothing waits for it). Its task ids are :attr:`DPPlan.embedding`.

Collectives go on the ``collective`` stream and do not wait for each other:
the cost model's links order them. Which compute task and how far into it
a collective becomes ready is recorded in :class:`DPPlan` (``ready``), for
the cost model to turn into a delay.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from common.errors import ScheduleError
from schedules.graph import Stream, Task, TaskGraph
from schedules.ir import Action, Kind
from schedules.util import paused_gc

__all__ = ["APPROXIMATE_MODES", "DP_MODES", "PEER_SELECTIONS", "ZERO3_READS", "DPPlan", "DataParallelGraph",
           "add_data_parallel", "exchange_peers", "random_peer", "ring_neighbours", "server_update"]

DP_MODES = ("none", "sync", "ddp", "zero1", "zero2", "zero3", "fsdp", "ps", "async-ps", "decentralized", "local-sgd")
# Modes that change the mathematics (each replica steps its own parameters): compared by time to a loss, not by
# step time alone (the planner leaves them out).
APPROXIMATE_MODES = ("decentralized", "local-sgd")
PEER_SELECTIONS = ("ring", "random")  # decentralized: both ring neighbours every step, or one random peer per step
_GRAD_KINDS = (Kind.B, Kind.W)
ZERO3_READS = (Kind.F, Kind.I, Kind.W, Kind.B, Kind.R)  # zero3: the passes that read the parameters (real.dp.zero too)
_PARAM_KINDS = ZERO3_READS
_FORWARDS = (Kind.F, Kind.R)


@dataclass(frozen=True, slots=True)
class DPPlan:
    """What the pass decided: the mode, buckets per stage, and each delayed collective's anchor.

    ``ready[c] = (a, f)``: collective task c becomes ready a fraction f of compute
    task a's duration after a starts (c's dependencies are a's, so both are
    released together).
    """

    mode: str
    buckets: tuple[int, ...]
    ready: Mapping[int, tuple[int, float]] = field(default_factory=dict)
    embedding: frozenset[int] = frozenset()  # the embedding gradient all-reduce's tasks


@dataclass(frozen=True, eq=False)
class DataParallelGraph(TaskGraph):
    """A TaskGraph plus the :class:`DPPlan` that made its collectives."""

    plan: DPPlan | None = None


def server_update(task: Task) -> bool:
    """True for ps's (and async-ps's) update of a stage on the parameter servers: an OPTIM on the collective
    stream. The servers do that work: it moves nothing on the trainer's links and slows none of its compute."""
    return task.stream is Stream.COLLECTIVE and task.action.kind is Kind.OPTIM


def exchange_peers(selection: str, dp: int) -> int:
    """Neighbours a decentralized replica exchanges its parameters with per step: a ring's two (one at dp 2),
    or one random peer."""
    if selection not in PEER_SELECTIONS:
        raise ScheduleError(f"unknown peer selection {selection!r}; valid: {', '.join(PEER_SELECTIONS)}")
    return min(2, dp - 1) if selection == "ring" else 1


def ring_neighbours(replica: int, dp: int) -> tuple[int, ...]:
    """The ring's next and previous replica of ``replica`` (one at dp 2, none at dp 1)."""
    return tuple(dict.fromkeys(r for r in ((replica + 1) % dp, (replica - 1) % dp) if r != replica))


def random_peer(replica: int, dp: int, seed: int, step: int) -> int:
    """``replica``'s peer at ``step``: the replicas paired by a shuffle drawn from (seed, step) (dp even)."""
    if dp % 2:
        raise ScheduleError(f"random peer selection pairs the replicas and needs an even dp, got dp {dp}; "
                            "use an even dp or peer selection ring")
    order = list(range(dp))
    random.Random(f"decentralized:{seed}:{step}").shuffle(order)
    at = order.index(replica)
    return order[at ^ 1]


def add_data_parallel(graph: TaskGraph, mode: str, buckets: Sequence[int], *, prefetch: int = 1,
                      reshard_after_forward: bool = True, embedding: bool = False, peers: int = 1,
                      averaging: bool = True, overlap_param_gather: bool = False,
                      one_buffer: bool = False) -> TaskGraph:
    """Return a new graph with ``mode``'s collectives and optimizer steps; ``buckets[s]`` per stage.

    ``prefetch``, ``reshard_after_forward`` and ``one_buffer`` apply to zero3, ``overlap_param_gather``
    to zero1 and zero2 (see the module docstring); ``embedding`` adds the embedding
    gradient all-reduce; ``peers`` (decentralized) is the neighbours each bucket is
    exchanged with, ``averaging`` (local-sgd) whether this step averages the parameters.
    """
    if mode not in DP_MODES:
        raise ScheduleError(f"unknown dp mode {mode!r}; valid modes: {', '.join(DP_MODES)}")
    if isinstance(peers, bool) or not isinstance(peers, int) or not 1 <= peers <= 2:
        raise ScheduleError(f"peers {peers!r} must be 1 or 2 (the neighbours of a decentralized replica)")
    mode = "zero3" if mode == "fsdp" else mode
    n_st = graph.schedule.num_stages
    if len(buckets) != n_st or any(not isinstance(b, int) or b < 1 for b in buckets):
        raise ScheduleError(f"buckets {list(buckets)} must give {n_st} stage(s) an integer count >= 1 each")
    if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 0:
        raise ScheduleError(f"prefetch {prefetch!r} must be a whole number of passes >= 0 (0: on demand)")
    if overlap_param_gather and mode not in ("zero1", "zero2"):
        raise ScheduleError(f"overlap_param_gather overlaps the all-gather of updated parameters (zero1, zero2) "
                            f"with the next forward; dp mode {mode!r} has none")
    s2r = graph.schedule.stage_to_rank
    embedding = embedding and s2r[0] != s2r[n_st - 1]
    if mode == "none" and not embedding:
        return graph
    with paused_gc():
        return _DPBuilder(graph, mode, tuple(buckets), prefetch, reshard_after_forward, embedding,
                          overlap_param_gather, peers=peers, averaging=averaging, one_buffer=one_buffer).build()


class _DPBuilder:
    def __init__(self, graph: TaskGraph, mode: str, buckets: tuple[int, ...], prefetch: int, reshard: bool,
                 embedding: bool, overlap_param_gather: bool = False, *, peers: int = 1,
                 averaging: bool = True, one_buffer: bool = False) -> None:
        self.graph, self.mode, self.buckets = graph, mode, buckets
        self.one_buffer = one_buffer  # zero3: a stage's gathers land in one buffer (real.dp.zero)
        self.prefetch, self.reshard, self.embedding = prefetch, reshard, embedding
        self.peers = peers  # decentralized: the neighbours each bucket is exchanged with
        self.averaging = averaging  # local-sgd: this step averages the parameters
        self.tasks: list[Task] = list(graph.tasks)
        self.programs = [list(p) for p in graph.programs]
        self.ready: dict[int, tuple[int, float]] = {}
        self.embedding_tasks: dict[int, int] = {}  # stage (the first or the last) -> its all-reduce task
        self.overlap_param_gather = overlap_param_gather  # zero1/zero2: the parameter gathers before the first F

    def _add(self, rank: int, stream: Stream, action: Action, deps: Sequence[int]) -> int:
        tid = len(self.tasks)
        self.tasks.append(Task(tid, rank, stream, action, tuple(deps)))
        self.programs[rank].append(tid)
        return tid

    def _bucketed(self, rank: int, kind: Kind, stage: int, mb: int | None, anchor: int | None,
                  deps: Sequence[int]) -> list[int]:
        """One collective per bucket of ``stage``; with an anchor, bucket k is ready (k+1)/K into it."""
        n = self.buckets[stage]
        out = []
        for k in range(n):
            tid = self._add(rank, Stream.COLLECTIVE, Action(kind, stage, mb, bucket=k), deps)
            if anchor is not None:
                self.ready[tid] = (anchor, (k + 1) / n)
            out.append(tid)
        return out

    def build(self) -> DataParallelGraph:
        ranks = range(self.graph.num_ranks)
        if self.mode in ("ps", "async-ps"):  # every push, then the servers' updates (last stage first), the pulls
            grads = [self._grads(rank) for rank in ranks]
            updates = self._server_updates(grads)
            for rank in ranks:
                self._pulls(rank, grads[rank], updates)
        elif self.embedding:  # both ends' gradients first, then the all-reduce, then the optimizer steps
            grads = [self._grads(rank) for rank in ranks]
            self._embedding_allreduce(grads)
            for rank in ranks:
                self._finish(rank, grads[rank])
        else:  # rank by rank (the task ids, and so the ties, of the graphs before the embedding all-reduce)
            for rank in ranks:
                self._finish(rank, self._grads(rank))
        plan = DPPlan(self.mode, self.buckets, MappingProxyType(self.ready), frozenset(self.embedding_tasks.values()))
        return DataParallelGraph(self.graph.schedule, tuple(self.tasks), tuple(tuple(p) for p in self.programs), plan)

    def _compute(self, rank: int) -> list[int]:
        return [i for i in self.graph.programs[rank] if self.tasks[i].stream is Stream.COMPUTE]

    def _producers(self, rank: int, stage: int) -> list[int]:
        """The rank's compute tasks that make gradients of ``stage`` (its B's or W's)."""
        return [i for i in self._compute(rank)
                if any(p.stage == stage and p.kind in _GRAD_KINDS for p in self.tasks[i].action.parts())]

    def _grads(self, rank: int) -> dict[int, list[int]]:
        """Stage -> its gradient collectives on ``rank`` (none in mode none)."""
        compute = self._compute(rank)
        if not compute:
            return {}
        stages = self.graph.schedule.stages_of(rank)
        grads: dict[int, list[int]] = {s: [] for s in stages}
        if self.mode == "zero3":
            self._gather_params(rank, compute)
        for s in stages:
            producers = self._producers(rank, s)
            if self.mode in ("none", "local-sgd"):
                continue
            if self.mode == "decentralized":  # issued as the step starts: the exchange of x_t overlaps the passes
                grads[s] = [t for j in range(self.peers) for t in self._bucketed(rank, Kind.EXCHANGE, s, j, None, ())]
            elif self.mode == "sync":
                grads[s] = self._bucketed(rank, Kind.ALLREDUCE, s, None, None, (compute[-1],))
            elif self.mode in ("zero2", "zero3"):
                for a in producers:
                    mb = next(p.microbatch for p in self.tasks[a].action.parts() if p.stage == s)
                    grads[s] += self._bucketed(rank, Kind.REDUCE_SCATTER, s, mb, a, self.tasks[a].deps)
            else:
                kind = Kind.ALLREDUCE if self.mode == "ddp" else Kind.REDUCE_SCATTER
                last = producers[-1]
                grads[s] = self._bucketed(rank, kind, s, None, last, self.tasks[last].deps)
        return grads

    def _embedding_allreduce(self, grads: list[dict[int, list[int]]]) -> None:
        """One ALLREDUCE on the first stage's rank and one on the last stage's, each waiting for both sides."""
        last = self.graph.schedule.num_stages - 1
        s2r = self.graph.schedule.stage_to_rank
        sides = [(s2r[s], s) for s in (0, last)]
        deps = [d for r, s in sides for d in (self._producers(r, s)[-1:] + grads[r].get(s, []))]
        for r, s in sides:
            self.embedding_tasks[s] = self._add(r, Stream.COLLECTIVE, Action(Kind.ALLREDUCE, s, None), deps)

    def _server_updates(self, grads: list[dict[int, list[int]]]) -> dict[int, int]:
        """ps: stage -> the servers' update of it, on the stage's rank: after the stage's pushes and the update of
        the stage after it (:meth:`real.dp.ps.ParamServer.step` folds and steps the stages one at a time, last first)."""
        s2r, out = self.graph.schedule.stage_to_rank, {}
        for s in range(self.graph.schedule.num_stages - 1, -1, -1):
            pushes = grads[s2r[s]].get(s, [])
            if not pushes:  # a stage of a rank without compute (not in a lowered schedule)
                continue
            after = (out[s + 1],) if s + 1 in out else ()
            out[s] = self._add(s2r[s], Stream.COLLECTIVE, Action(Kind.OPTIM, s), (*pushes, *after))
        return out

    def _pulls(self, rank: int, grads: dict[int, list[int]], updates: dict[int, int]) -> None:
        """ps: each bucket's pull after its stage's update on the servers."""
        for s in self.graph.schedule.stages_of(rank):
            for k in range(len(grads.get(s, []))):
                self._add(rank, Stream.COLLECTIVE, Action(Kind.ALL_GATHER, s, None, bucket=k), (updates[s],))

    def _finish(self, rank: int, grads: dict[int, list[int]]) -> None:
        """The optimizer steps (and the parameter all-gathers after them); ps and async-ps: :meth:`_pulls`."""
        compute = self._compute(rank)
        if not compute or self.mode == "none":
            return
        prev = compute[-1]
        for s in self.graph.schedule.stages_of(rank):
            emb = (self.embedding_tasks[s],) if s in self.embedding_tasks else ()
            prev = self._add(rank, Stream.COMPUTE, Action(Kind.OPTIM, s), (prev, *grads[s], *emb))
            if self.mode in ("zero1", "zero2") and self.overlap_param_gather:
                self._gather_before_forward(rank, s, compute)
            elif self.mode in ("zero1", "zero2"):
                self._bucketed(rank, Kind.ALL_GATHER, s, None, None, (prev,))
            elif self.mode == "local-sgd" and self.averaging:
                self._bucketed(rank, Kind.ALLREDUCE, s, None, None, (prev,))

    def _gather_before_forward(self, rank: int, stage: int, compute: list[int]) -> None:
        """overlap_param_gather: the stage's gathers (the previous step's) from the start. Bucket 0 (the first
        layers) before the stage's first F; the others, gathered while it runs, before the next compute task."""
        pos = next(k for k, i in enumerate(compute) if any(p.kind is Kind.F and p.stage == stage
                                                           for p in self.tasks[i].action.parts()))
        gathers = self._bucketed(rank, Kind.ALL_GATHER, stage, None, None, ())
        for i, deps in ((compute[pos], gathers[:1]), (compute[min(pos + 1, len(compute) - 1)], gathers[1:])):
            task = self.tasks[i]
            self.tasks[i] = Task(task.id, task.rank, task.stream, task.action, (*task.deps, *deps), task.peer)

    def _release(self, compute: list[int], pos: int, stage: int) -> tuple[int, ...]:
        """When the gathers of ``stage`` for the pass at ``pos`` are issued: ``prefetch`` passes ahead, or on
        demand; with ``one_buffer`` not before the last pass in that window that reads ``stage`` has ended, and
        the step's first pass's when that pass is ready (the runtime issues nothing before it)."""
        if self.one_buffer:
            if pos == 0:  # nothing runs before the step's first pass to issue its gathers: when it is ready
                return self.graph.tasks[compute[0]].deps
            for q in range(pos - 1, max(pos - max(self.prefetch, 1), 0) - 1, -1):
                if stage in self._param_stages(compute[q]):
                    return (compute[q],)
        if self.prefetch == 0:
            return (compute[pos - 1],) if pos > 0 else ()
        ahead = pos - self.prefetch
        return self.tasks[compute[ahead]].deps if ahead >= 0 else ()

    def _param_stages(self, tid: int) -> dict[int, list[Action]]:
        """Stage -> the task's passes that read that stage's parameters (in order)."""
        out: dict[int, list[Action]] = {}
        for p in self.tasks[tid].action.parts():
            if p.kind in _PARAM_KINDS:
                out.setdefault(p.stage, []).append(p)
        return out

    def _gather_params(self, rank: int, compute: list[int]) -> None:
        """ZeRO-3: all-gather a stage's parameters before each task that reads them and finds them sharded."""
        gathered: set[int] = set()  # stages whose parameters stay gathered after a forward (reshard off)
        for pos, i in enumerate(compute):
            task = self.tasks[i]
            gathers: list[int] = []
            for stage, passes in self._param_stages(i).items():
                if stage not in gathered:  # once per task, with its first pass of the stage's microbatch
                    release = self._release(compute, pos, stage)
                    gathers += self._bucketed(rank, Kind.ALL_GATHER, stage, passes[0].microbatch, None, release)
                if all(p.kind in _FORWARDS for p in passes) and not self.reshard:
                    gathered.add(stage)
                else:
                    gathered.discard(stage)
            if gathers:
                self.tasks[i] = Task(task.id, task.rank, task.stream, task.action, (*task.deps, *gathers), task.peer)
