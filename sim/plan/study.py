"""A real-units study: model x cluster x (pp, dp, tp) x schedule -> step time, throughput, MFU, memory.

    >>> from sim.plan.study import Study, run_study
    >>> from sim.costs.cluster import cluster_preset
    >>> from sim.costs.parallel import EMBEDDING_ALLREDUCE, ParallelConfig
    >>> from sim.costs.transformer import model_preset
    >>> from sim.costs.transformer_costs import TransformerCosts
    >>> costs = TransformerCosts(model=model_preset("gpt-6.2b"), cluster=cluster_preset("dgx-h100:2"),
    ...                          parallel=ParallelConfig(pp=8, dp=2, dp_mode="ddp"))
    >>> s = Study(schedule="1f1b", microbatches=32, costs=costs)
    >>> r = run_study(s)  # doctest: +SKIP

One pipeline replica is simulated (its pp ranks); the dp replicas are
symmetric, so each collective's cost covers its whole dp group (see
:mod:`schedules.dp.modes`). MFU counts model FLOPs: forward + backward of every
layer and the LM head, no recomputation (:meth:`TransformerConfig.model_flops_per_token`),
over all pp*dp*tp devices at dense peak.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.errors import ConfigError, check_positive_ints, quote
from schedules import Kind, PipelineParams, Stream, TaskGraph, ZBAutoOptions, load_graph, validate
from schedules.dp.modes import DP_MODES, PEER_SELECTIONS, add_data_parallel, exchange_peers
from schedules.registry import lookup
from sim.costs import collectives as coll
from sim.costs.async_ps import AsyncPSResult, cycle_of, simulate_async_ps
from sim.costs.cluster import (
    GB,
    Cluster,
    KeyCheck,
    check_table,
    cluster_from_dict,
    key_choice,
    key_flag,
    key_fraction,
    key_layer_counts,
    key_positive,
    key_positive_int,
    key_string,
    read_toml,
)
from sim.costs.moe import DISPATCHERS, max_load
from sim.costs.parallel import EMBEDDING_ALLREDUCE, ParallelConfig
from sim.costs.recompute_modes import key_recompute
from sim.costs.stacks import STACKS, block_sends, blocking_p2p
from sim.costs.transformer import TransformerConfig, model_from_dict
from sim.costs.transformer_costs import DTYPES, TransformerCosts
from sim.engine import SimResult, simulate
from sim.memory import DeviceMemory
from sim.network import LINK_MODELS
from sim.plan.budget import ActivationBudget, held_bytes, parse_bytes, zb_auto_options

__all__ = ["Study", "StudyResult", "dp_options", "exposed_comm", "load_study", "run_study", "study_from_dict"]

@dataclass(frozen=True, slots=True, kw_only=True)
class Study:
    """A schedule on a cluster: the pipeline's shape and the cost model it runs under.

    ``costs`` holds the model, the cluster and the parallel layout
    (``costs.parallel.pp`` is the pipeline's rank count); ``chunks`` None takes
    the schedule's default. An adaptive schedule (zb-auto) also takes
    ``mem_limit``, bytes per device (or text such as ``"60GB"``, ``"56GiB"``;
    None: its default of pp M_B), turned into its activation budget by
    :func:`sim.plan.budget.activation_budget`, and ``time_limit``, seconds of
    exact search (None: its default).
    """

    schedule: str
    microbatches: int
    costs: TransformerCosts
    chunks: int | None = None
    mem_limit: float | str | None = None
    time_limit: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.schedule, str):
            raise ConfigError(f"study: schedule must be a schedule name (a string), got {quote(self.schedule)}",
                              field="schedule")
        check_positive_ints("study", microbatches=self.microbatches)
        if self.chunks is not None:
            check_positive_ints("study", chunks=self.chunks)
        for key in ("mem_limit", "time_limit"):
            if getattr(self, key) is not None and not spec_adaptive(self.schedule):
                raise ConfigError(f"study: {key} applies only to adaptive schedules (zb-auto), not to "
                                  f"{self.schedule!r}", field=key)
        if self.mem_limit is not None:
            object.__setattr__(self, "mem_limit", parse_bytes(self.mem_limit))

    @property
    def model(self) -> TransformerConfig:
        return self.costs.model

    @property
    def cluster(self) -> Cluster:
        return self.costs.cluster

    @property
    def parallel(self) -> ParallelConfig:
        return self.costs.parallel

    def pipeline(self) -> PipelineParams:
        """The schedule's shape."""
        return PipelineParams(pp=self.parallel.pp, microbatches=self.microbatches, chunks=self.chunks)

    def schedule_options(self) -> ZBAutoOptions | None:
        """An adaptive schedule's options (zb-auto): this model's pass times, its activations and the memory limit
        as a budget in M_B (:func:`sim.plan.budget.zb_auto_options`); None for the others."""
        if not spec_adaptive(self.schedule):
            return None
        return zb_auto_options(self.costs, self.mem_limit, self.time_limit)[0]

    def activation_budget(self) -> ActivationBudget | None:
        """The memory limit as zb-auto's activation budget (what it used, in M_B and bytes); None without a limit."""
        if self.mem_limit is None:
            return None
        return zb_auto_options(self.costs, self.mem_limit, self.time_limit)[1]


def build_graph(study: Study) -> TaskGraph:
    """Build and validate the schedule, check the layer split, add the DP collectives."""
    costs = study.costs
    graph = validate(load_graph(study.schedule, study.pipeline(), study.schedule_options()))
    n_st = graph.schedule.num_stages
    costs.stage_layers(n_st)  # raises if the model cannot be split into this many stages
    graph = validate(add_data_parallel(graph, study.parallel.dp_mode, costs.buckets(n_st), **dp_options(costs)))
    return block_sends(graph) if blocking_p2p(costs.stack, graph) else graph  # the stack's sends (sim.costs.stacks)


def dp_options(costs: TransformerCosts) -> dict[str, Any]:
    """The data-parallel pass's options from the parallel layout (and whether the model ties its embeddings)."""
    p = costs.parallel
    return {"prefetch": p.fsdp_prefetch, "reshard_after_forward": p.fsdp_reshard_after_forward,
            "embedding": p.embedding_sync(costs.model.tied_embeddings), "overlap_param_gather": p.overlap_param_gather,
            "peers": exchange_peers(p.peer_selection, p.dp) if p.dp_mode == "decentralized" else 1}


def spec_adaptive(name: str) -> bool:
    found = lookup(name)
    return found is not None and found.adaptive


def _moe_assumption(costs: TransformerCosts) -> list[str]:
    m, p = costs.model.moe, costs.parallel
    if m is None:
        return []
    pairs = ("an overlapped F+B pair's all-to-alls on their own stream under the other pass's compute "
             "(sim.costs.moe.two_stream_time)" if not costs.pair_overlap else
             f"an overlapped pair hides {costs.pair_overlap:g} of its shorter pass (--pair-overlap)")
    return [f"MoE: {m.experts} experts, top-{m.top_k}, {m.shared_experts} shared, the first {m.dense_layers} layers "
            f"dense; ep={p.ep} (expert data parallelism {costs.expert_dp}); dispatch and combine all-to-alls of "
            f"{costs.all_to_all_time() * 1e3:.3g} ms each ({costs.moe_dispatcher}) in F and I, exposed in a plain pass; {pairs}; routing "
            f"{m.routing}, load x{max_load(m, p.ep):.3g} on the busiest expert rank"]


def exposed_comm(result: SimResult) -> list[float]:
    """Per rank: seconds its compute stream waits on collectives, plus collectives running past its last compute.

    A compute-stream task (passes and OPTIM) that depends on collectives waits
    max(0, last collective end - last other dependency end); collectives that
    end after the rank's last compute-stream task extend the step by the difference.
    """
    tasks, end = result.graph.tasks, result.end
    out = []
    for prog in result.graph.programs:
        wait, last_compute, last_coll = 0.0, 0.0, 0.0
        for i in prog:
            t = tasks[i]
            if t.stream is Stream.COLLECTIVE:
                last_coll = max(last_coll, end[i])
                continue
            if t.stream is not Stream.COMPUTE:
                continue
            last_compute = max(last_compute, end[i])
            coll = [end[d] for d in t.deps if tasks[d].stream is Stream.COLLECTIVE]
            if coll:
                other = max((end[d] for d in t.deps if tasks[d].stream is not Stream.COLLECTIVE), default=0.0)
                wait += max(0.0, max(coll) - other)
        out.append(wait + max(0.0, last_coll - last_compute))
    return out


@dataclass(frozen=True, eq=False)
class StudyResult:
    study: Study
    sim: SimResult

    @property
    def step_time(self) -> float:
        """The makespan; without data-parallel tasks (dp mode none) the graph has no OPTIM, so each rank's
        optimizer step (memory-bound, :meth:`TransformerCosts.optim_time`) follows its last compute and its
        last collective (the embedding gradient all-reduce, if any), as in training."""
        end = max(self.sim.end, default=0.0)
        graph = self.sim.graph
        if any(t.action.kind is Kind.OPTIM for t in graph.tasks):
            return end
        n_st, costs, tasks = graph.schedule.num_stages, self.study.costs, graph.tasks
        ready = [max([r.last_end] + [self.sim.end[i] for i in graph.programs[r.rank]
                                     if tasks[i].stream is Stream.COLLECTIVE]) for r in self.sim.ranks]
        return max([end] + [ready[r.rank] + sum(costs.optim_time(s, n_st) for s in graph.schedule.stages_of(r.rank))
                            for r in self.sim.ranks])

    @property
    def tokens_per_step(self) -> int:
        s = self.study
        return s.microbatches * s.costs.microbatch_size * s.model.seq_len * s.parallel.dp

    @property
    def model_flops_per_step(self) -> float:
        return self.study.model.model_flops_per_token() * self.tokens_per_step

    @property
    def mfu(self) -> float:
        s = self.study
        return self.model_flops_per_step / (s.parallel.world * s.cluster.spec.peak_flops * self.step_time)

    @property
    def hardware_flops_per_step(self) -> float:
        """Model FLOPs plus what recomputation adds (every layer's recomputed forward work, inside I or as R's)."""
        m, costs, schedule = self.study.model, self.study.costs, self.sim.graph.schedule
        extra = m.layers * m.recompute_flops(costs.recompute) * self.tokens_per_step
        layers = costs.stage_layers(schedule.num_stages)
        r_layers = sum(layers[a.stage] for prog in schedule.programs for x in prog for a in x.parts() if a.kind is Kind.R)
        tokens_per_mb = costs.microbatch_size * m.seq_len * self.study.parallel.dp
        return self.model_flops_per_step + extra + r_layers * m.layer_flops("F") * tokens_per_mb

    @property
    def hfu(self) -> float:
        """Hardware FLOPs utilisation: as MFU, recomputation included (Korthikanti et al. 2022)."""
        s = self.study
        return self.hardware_flops_per_step / (s.parallel.world * s.cluster.spec.peak_flops * self.step_time)

    @property
    def async_ps(self) -> AsyncPSResult | None:
        """async-ps: this step run by every trainer at its speed under the staleness bound (sim.costs.async_ps); else None."""
        s, p = self.study, self.study.parallel
        if p.dp_mode != "async-ps":
            return None
        n_st = self.sim.graph.schedule.num_stages
        update = sum(s.costs.server_update_time(st, n_st) for st in range(n_st))  # every stage's, as ps's OPTIMs
        return simulate_async_ps(cycle_of(self, update), p.trainer_speeds or (1.0,) * p.dp, p.staleness)

    def devices(self) -> list[DeviceMemory]:
        s, costs, graph = self.study, self.study.costs, self.sim.graph
        n_st, p = graph.schedule.num_stages, s.parallel
        out = []
        for stats in self.sim.ranks:
            states, gather = held_bytes(costs, graph.schedule.stages_of(stats.rank), n_st)  # fp32 gradients too
            dev = s.cluster.devices[p.device(stats.rank)]
            out.append(DeviceMemory(stats.rank, str(dev), states, stats.peak_activations, gather,
                                    s.cluster.spec.memory_bytes))
        return out

    def assumptions(self) -> list[str]:
        s, p = self.study, self.study.parallel
        group = s.costs.group(0)
        eff = s.costs.gemm_efficiency
        peak = f"{s.cluster.spec.peak_flops / 1e12:g} TFLOP/s per {s.cluster.spec.name}"
        if eff is None:
            why = "efficiency given" if s.costs.efficiency is not None else f"no calibration for {s.cluster.spec.name}"
            compute = (f"matmuls reach {s.costs.matmul_efficiency:.0%} of dense peak ({peak}; a constant: {why}), "
                       "other operations not timed")
        else:
            compute = (f"each operation max(FLOPs / (peak x e), bytes / HBM): GEMM e = {eff.peak_fraction:g} x F / "
                       f"(F + {eff.half_flops:.3g}) ({peak}, {s.cluster.spec.memory_bw / 1e12:g} TB/s; {eff.source})")
        sp = " + sequence parallelism" if p.sp else ""
        return [
            compute,
            f"FLOPs per Narayanan et al. 2021; recompute {s.costs.recompute}; MFU counts model FLOPs (F+I+W of all "
            "layers and LM head), HFU adds the recomputed FLOPs",
            f"activations per Korthikanti et al. 2022, 16-bit, tp={p.tp}{sp}, recompute {s.costs.recompute}; "
            "model states per ZeRO (16 bytes/param)",
            f"one pipeline replica simulated; dp={p.dp} replicas symmetric; collectives {group.algorithm} "
            f"(alpha-beta), {p.bucket_mb:g} MiB buckets; "
            + (f"tp={p.tp}: 2 collectives per layer in F and in the backward, on NVLink, not overlapped"
               if p.tp > 1 else "no tensor parallelism"),
            ("links: transfers on a port share its bandwidth, max-min fair (flows)" if p.link_model == "fair" else
             "links: FIFO per port, each transfer holds its ports (fcfs)")
            + f"; rank order {p.order}; network core non-blocking",
            ("optimizer step: 28 bytes per parameter at HBM bandwidth" if p.dp_mode not in ("ps", "async-ps") else
             "optimizer step: the parameter servers', 28 bytes per parameter of a server's shard at its memory "
             f"bandwidth ({s.cluster.pserver_spec.memory_bw / 1e12:g} TB/s)")
            + (", after each rank's last pass (dp mode none adds no OPTIM task)" if p.dp_mode == "none" else ""),
            *([f"local-sgd: the step simulated is one that averages (1 in {p.sync_every}); time per step amortized "
               "over the others: sim.plan.comm_modes.mode_step_time, schedlab compare --time-to-loss"]
              if p.dp_mode == "local-sgd" else []),
            *_ps_assumption(p.dp_mode, p.dp, len(s.cluster.pservers)),
            *_moe_assumption(s.costs),
        ]

    def to_dict(self) -> dict[str, Any]:
        exposed = exposed_comm(self.sim)
        return {
            **self.sim.to_dict(),
            "step_time": self.step_time,
            "tokens_per_step": self.tokens_per_step,
            "tokens_per_s": self.tokens_per_step / self.step_time,
            "model_flops_per_step": self.model_flops_per_step,
            "mfu": self.mfu,
            "hardware_flops_per_step": self.hardware_flops_per_step,
            "hfu": self.hfu,
            "exposed_comm": max(exposed, default=0.0),
            "exposed_comm_per_rank": exposed,
            "devices": [d.to_dict() for d in self.devices()],
            "layers_per_stage": list(self.study.costs.stage_layers(self.sim.graph.schedule.num_stages)),
            "cluster": self.study.cluster.describe(),
            "transformer": self.study.model.describe(),
            "assumptions": self.assumptions(),
            **({"async_ps": a.to_dict()} if (a := self.async_ps) is not None else {}),
            **({"zb_auto_memory": b.to_dict()} if (b := self.study.activation_budget()) is not None else {}),
        }

    def format(self) -> str:
        d, s = self.to_dict(), self.study
        p = s.parallel
        lines = [
            f"schedule {d['schedule']}: pp={p.pp} dp={p.dp} tp={p.tp} dp-mode={p.dp_mode}"
            f"{'' if p.grad_compression == 'none' else f' grad-compression={p.grad_compression}'} "
            f"microbatches={d['microbatches']} "
            f"x {s.costs.microbatch_size} seq, chunks={d['chunks']} ({d['stages']} stages)",
            f"model {s.model.name} ({s.model.params / 1e9:.2f}B params, layers per stage "
            f"{','.join(map(str, d['layers_per_stage']))}) on {s.cluster.name} ({s.cluster.num_devices} x {s.cluster.spec.name})",
            f"step time {d['step_time']:.4f} s   tokens/s {d['tokens_per_s']:,.0f}   MFU {d['mfu']:.1%}   HFU {d['hfu']:.1%}   "
            f"exposed comm {d['exposed_comm']:.4f} s   bubble {d['bubble_ratio']:.1%}",
            "",
            f"{'rank':>4}  {'device':<22} {'memory GB':>10} {'states GB':>10} {'act GB':>8} {'capacity GB':>11}  overflow",
        ]
        for dev in self.devices():
            lines.append(
                f"{dev.rank:>4}  {dev.device:<22} {dev.memory_bytes / GB:>10.2f} {dev.model_state_bytes / GB:>10.2f} "
                f"{dev.activation_bytes / GB:>8.2f} {dev.capacity_bytes / GB:>11.1f}  {'OVERFLOW' if dev.overflow else 'ok'}"
            )
        if (a := self.async_ps) is not None:
            lines += ["", *a.format()]
        if (b := s.activation_budget()) is not None:
            lines += ["", b.format()]
        lines += ["", "assumptions:"] + [f"  - {a}" for a in d["assumptions"]]
        return "\n".join(lines)


def _ps_assumption(mode: str, dp: int, servers: int) -> list[str]:
    """The parameter-server modes' transfer model, one line (none for the other modes)."""
    if mode == "ps":
        return [f"parameter servers: {servers}; a push or pull is every replica's at once, alpha + max(n / B, "
                f"{dp} n / ({servers} B)) (synchronous SGD); the servers update a stage once its pushes are in (the "
                "stages one at a time, the last first) and its pulls wait for that"]
    if mode == "async-ps":
        return [f"parameter servers: {servers}; a push or pull is one trainer's alone, alpha + n / B (async-ps: "
                "trainers do not wait for each other); the step above is one trainer's, run over many steps by every "
                "trainer at its speed under the staleness bound with the servers' updates in sim.costs.async_ps (time per "
                "update = dp / sum of the trainers' rates); what stale gradients do to the loss is not modelled"]
    return []


def run_study(study: Study) -> StudyResult:
    graph = build_graph(study)
    return StudyResult(study, simulate(graph, study.costs, check=False))


def key_whole(owner: str, key: str, value: Any, error: type[ConfigError] = ConfigError) -> None:
    """A whole number >= 0 (not 1.0, not a bool)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise error(f"{owner}: {key} must be a whole number >= 0, got {quote(value)}", field=key)


def _key_ns(owner: str, key: str, value: Any, error: type[ConfigError]) -> None:
    """A finite number of nanoseconds >= 0."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < math.inf:
        raise error(f"{owner}: {key} must be a finite number >= 0 (nanoseconds per gradient element), got "
                    f"{quote(value)}", field=key)


def _key_speeds(owner: str, key: str, value: Any, error: type[ConfigError]) -> None:
    """A list of finite numbers > 0 (the trainers' speeds; their count is checked against dp later)."""
    if not isinstance(value, list | tuple) or not value or any(
            isinstance(v, bool) or not isinstance(v, int | float) or not 0 < v < math.inf for v in value):
        raise error(f"{owner}: {key} must be a list of finite numbers > 0, one per replica (e.g. [1, 1.5]), got "
                    f"{quote(value)}", field=key)


def key_slowdown(owner: str, key: str, value: Any, error: type[ConfigError] = ConfigError) -> None:
    """A finite number >= 0 (a slowdown: 0 none, 0.189 compute 18.9% longer)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < float("inf"):
        raise error(f"{owner}: {key} must be a finite slowdown >= 0 (0: none), got {quote(value)}", field=key)


def _key_size(owner: str, key: str, value: Any, error: type[ConfigError] = ConfigError) -> None:
    """A size in bytes: a number, or text such as "60GB" (:func:`sim.plan.budget.parse_bytes`)."""
    try:
        parse_bytes(value, key)
    except ConfigError as e:
        raise error(f"{owner}: {e}", field=key) from None


def _key_seconds(owner: str, key: str, value: Any, error: type[ConfigError] = ConfigError) -> None:
    """A finite number of seconds >= 0 (zb-auto's time_limit; its upper bound is zb-auto's to check)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < math.inf:
        raise error(f"{owner}: {key} must be a finite number of seconds >= 0, got {quote(value)}", field=key)


_STUDY_KEYS = ("schedule", "microbatches", "chunks", "mem_limit", "time_limit")
_COST_KEYS = ("microbatch_size", "efficiency", "pair_overlap", "layers_per_stage", "recompute", "dtype",
              "reduce_dtype", "elementwise", "tp_overlap", "contention", "stack", "post_validation",
              "moe_dispatcher")
#: The [run] and [parallel] tables: their keys and their kinds ([model]: sim.costs.transformer.MODEL_TABLE,
#: [cluster]: sim.costs.cluster.cluster_from_dict).
RUN_TABLE: dict[str, KeyCheck] = {
    "schedule": key_string("a schedule name, torch:CLASS or csv:FILE"),
    "microbatches": key_positive_int, "chunks": key_positive_int, "microbatch_size": key_positive_int,
    "efficiency": key_fraction("a fraction of peak", open_low=True), "pair_overlap": key_fraction(),
    "layers_per_stage": key_layer_counts, "recompute": key_recompute, "dtype": key_choice(DTYPES),
    "reduce_dtype": key_choice(("bf16", "fp32")), "elementwise": key_choice(("fused", "eager")), "tp_overlap": key_flag,
    "contention": key_slowdown, "mem_limit": _key_size, "time_limit": _key_seconds, "stack": key_choice(STACKS),
    "post_validation": key_flag, "moe_dispatcher": key_choice(DISPATCHERS),
}
PARALLEL_TABLE: dict[str, KeyCheck] = {
    "pp": key_positive_int, "dp": key_positive_int, "tp": key_positive_int, "cp": key_positive_int,
    "ep": key_positive_int, "dp_mode": key_choice(DP_MODES), "order": key_choice(("dp-inner", "pp-inner")),
    "bucket_mb": key_positive(" MiB"), "collective": key_choice(coll.ALGORITHMS), "sp": key_flag,
    "link_model": key_choice(LINK_MODELS), "fsdp_reshard_after_forward": key_flag,
    "fsdp_prefetch": key_whole,
    "embedding_allreduce": key_choice(EMBEDDING_ALLREDUCE), "overlap_param_gather": key_flag,
    "grad_compression": key_string("a codec: none, fp16, bf16, int8 or powersgd:R"),
    "codec_ns_per_param": lambda owner, key, value, error=ConfigError: _key_ns(owner, key, value, error),
    "peer_selection": key_choice(PEER_SELECTIONS), "sync_every": key_positive_int,
    "staleness": key_whole, "trainer_speeds": lambda owner, key, value, error=ConfigError: _key_speeds(owner, key, value, error),
}
_TABLES = ("model", "cluster", "parallel", "run")


def _check_tables(data: Mapping[str, Any]) -> None:
    unknown = sorted(map(str, set(data) - set(_TABLES)))
    if unknown:
        raise ConfigError(f"config: unknown table(s) {quote(unknown)}; valid: {', '.join(_TABLES)} "
                          "(every key goes in one of them)")
    for table, value in data.items():
        if not isinstance(value, Mapping):
            raise ConfigError(f"config: {table} must be a table ([{table}] and its keys), got {quote(value)}")


def study_from_dict(data: Mapping[str, Any]) -> Study:
    """Tables ``model``, ``cluster``, ``parallel``, ``run`` (see the README); every key's kind is checked."""
    _check_tables(data)
    run, parallel = data.get("run", {}), data.get("parallel", {})
    check_table("run", run, RUN_TABLE)
    check_table("parallel", parallel, PARALLEL_TABLE)
    missing = [k for k, table in (("model", "model"), ("cluster", "cluster")) if not data.get(table)]
    missing += [k for k in ("schedule", "microbatches") if k not in run]
    if "pp" not in parallel:
        missing.append("pp")
    if missing:
        raise ConfigError(f"config: missing {', '.join(missing)}; give them in the TOML file or as options",
                          field=missing[0])
    costs = TransformerCosts(model=model_from_dict(data["model"]), cluster=cluster_from_dict(data["cluster"]),
                             parallel=ParallelConfig(**parallel), **{k: run[k] for k in _COST_KEYS if k in run})
    return Study(costs=costs, **{k: run[k] for k in _STUDY_KEYS if k in run})


def load_study(path: str | Path, overrides: Mapping[str, Mapping[str, Any]] | None = None) -> Study:
    """A TOML file's study, with ``overrides`` (table -> key -> value, e.g. from flags) on top."""
    data = read_toml(path) if path is not None else {}
    _check_tables(data)
    merged = {k: dict(v) for k, v in data.items()}
    for table, values in (overrides or {}).items():
        if values and (table == "cluster" or (table == "model" and "preset" in values)):
            merged[table] = dict(values)  # a new model or cluster; a model key alone (seq_len) goes on top
        else:
            merged.setdefault(table, {}).update(values)
    return study_from_dict(merged)
