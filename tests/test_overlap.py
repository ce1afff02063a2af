"""FSDP reshard-after-forward and prefetch, the embedding gradient all-reduce: hand arithmetic."""

from __future__ import annotations

import pytest

from analysis.cli.simulate import main
from common.errors import ConfigError
from schedules import Kind, Stream, build, lower
from schedules.dp.modes import add_data_parallel
from sim import simulate
from sim.costs.cluster import cluster_preset
from sim.costs.nccl import nccl_choice
from sim.costs.parallel import ParallelConfig
from sim.costs.transformer import model_preset
from sim.costs.transformer_costs import TransformerCosts
from sim.plan.study import Study, load_study, run_study

GPT6 = model_preset("gpt-6.2b")


TIMES = {Kind.F: 1.0, Kind.B: 2.0, Kind.ALL_GATHER: 0.5}


class KindCosts:
    """F 1 s, B 2 s, an all-gather 0.5 s, everything else free; no links (so no queueing)."""

    def duration(self, task, graph):
        return TIMES.get(task.action.kind, 0.0)

    def bytes(self, task, graph):
        return 0.0

    def activations(self, action, graph):
        return 0.0, 0.0

    def describe(self):
        return {"model": "kinds"}


def _fsdp(**options):
    # pp=1 1F1B over two microbatches: F0 B0 F1 B1, one bucket
    return add_data_parallel(lower(build("1f1b", pp=1, microbatches=2)), "fsdp", [1], **options)


def _gathered_passes(graph):
    """The compute passes (as text) that wait for an all-gather, in program order."""
    tasks = graph.tasks
    return [str(tasks[i].action) for i in graph.programs[0] if tasks[i].stream is Stream.COMPUTE
            and any(tasks[d].action.kind is Kind.ALL_GATHER for d in tasks[i].deps)]


@pytest.mark.parametrize(("reshard", "gathered"), [(True, ["0F0", "0B0", "0F1", "0B1"]), (False, ["0F0", "0F1"])])
def test_reshard_after_forward_off_keeps_the_parameters_for_the_backward(reshard, gathered):
    assert _gathered_passes(_fsdp(reshard_after_forward=reshard)) == gathered


@pytest.mark.parametrize(("reshard", "prefetch", "step"), [
    # one pass ahead: only the first gather (0.5) shows, 6 s of compute + 0.5
    (True, 1, 6.5), (False, 1, 6.5),
    # on demand: every gather after the pass before it ends: 4 x 0.5 with reshard, 2 x 0.5 without
    (True, 0, 8.0), (False, 0, 7.0),
])
def test_fsdp_prefetch_and_reshard_step_times(reshard, prefetch, step):
    r = simulate(_fsdp(reshard_after_forward=reshard, prefetch=prefetch), KindCosts())
    assert r.makespan == step


def test_prefetch_two_passes_ahead_issues_the_gathers_earlier():
    graph = _fsdp(prefetch=2)
    r = simulate(graph, KindCosts())
    starts = [r.start[t.id] for t in graph.tasks if t.action.kind is Kind.ALL_GATHER]
    # F0's and B0's gathers at 0 (nothing two passes before them); F1's when F0 starts (0.5); B1's when B0 starts
    assert starts == [0.0, 0.0, 0.5, 1.5] and r.makespan == 6.5


def test_bad_fsdp_options_are_refused_in_one_line():
    with pytest.raises(ConfigError, match=r"^parallel: fsdp_prefetch applies to dp_mode zero3 \(fsdp\), not 'ddp'; "):
        ParallelConfig(pp=2, dp=2, dp_mode="ddp", fsdp_prefetch=2)
    with pytest.raises(ConfigError, match=r"^parallel: fsdp_reshard_after_forward must be true or false"):
        ParallelConfig(pp=2, dp=2, dp_mode="fsdp", fsdp_reshard_after_forward="off")
    with pytest.raises(ConfigError, match=r"^parallel: fsdp_prefetch must be a whole number of passes >= 0"):
        ParallelConfig(pp=2, dp=2, dp_mode="fsdp", fsdp_prefetch=-1)


def _study(pp=4, dp=2, mode="fsdp", cluster="dgx-h100:1", model=GPT6, **parallel):
    return Study(schedule="1f1b", microbatches=4, costs=TransformerCosts(
        model=model, cluster=cluster_preset(cluster), parallel=ParallelConfig(pp=pp, dp=dp, dp_mode=mode, **parallel)))


def test_reshard_off_holds_every_stage_gathered_and_skips_the_backward_gathers():
    on, off = run_study(_study()), run_study(_study(fsdp_reshard_after_forward=False))
    costs = on.study.costs
    for a, b in zip(on.devices(), off.devices(), strict=True):
        assert a.gather_bytes == b.gather_bytes == 2 * costs.stage_params(a.rank, 4)  # one stage per rank
    gathers = [sum(t.action.kind is Kind.ALL_GATHER for t in r.sim.graph.tasks) for r in (on, off)]
    per_pass = sum(costs.buckets(4))  # every stage's buckets, once per pass that gathers
    assert gathers == [2 * 4 * per_pass, 4 * per_pass]  # F and B of 4 microbatches; F only


def _embedding_tasks(result):
    graph = result.sim.graph
    return [graph.tasks[i] for i in sorted(graph.plan.embedding)] if hasattr(graph, "plan") else []


def test_embedding_allreduce_between_the_first_and_last_stage():
    r = run_study(_study(pp=4, dp=1, mode="none", cluster="dgx-h100:2"))
    tasks = _embedding_tasks(r)
    assert [(t.rank, t.action.kind, t.action.stage) for t in tasks] == [(0, Kind.ALLREDUCE, 0), (3, Kind.ALLREDUCE, 3)]
    costs, sim = r.study.costs, r.sim
    n = 2 * GPT6.vocab * GPT6.hidden  # 16-bit gradient of V x h, tp=1
    assert costs.embedding_bytes() == n and sim.bytes_moved[tasks[0].id] == n
    # ranks 0 and 3 sit on node 0: NCCL's two-rank all-reduce over NVLink (sim.costs.nccl: NVLS, as NCCL picks it
    # for this size on NVSwitch: its 25 us hop + n / (480 GB/s x 2/2)); each side waits for both ranks' last backward
    h100 = cluster_preset("dgx-h100:2")
    one = nccl_choice("allreduce", float(n), 2, 1, h100.intra, h100.inter, nvls=True).time
    assert one == pytest.approx(25e-6 + n / 480e9, rel=1e-12)
    last_b = max(sim.end[i] for rank in (0, 3) for i in sim.graph.programs[rank]
                 if sim.graph.tasks[i].action.kind is Kind.B)
    for t in tasks:
        assert sim.start[t.id] == last_b and sim.end[t.id] == pytest.approx(last_b + one, rel=1e-12)
    # no OPTIM tasks in dp mode none: the optimizer step of ranks 0 and 3 follows the all-reduce, of 1 and 2
    # their last pass
    ready = [sim.end[tasks[0].id], sim.ranks[1].last_end, sim.ranks[2].last_end, sim.end[tasks[1].id]]
    assert r.step_time == max(ready[k] + costs.optim_time(k, 4) for k in range(4))
    assert r.step_time > sim.ranks[0].last_end + costs.optim_time(0, 4)


@pytest.mark.parametrize(("mode", "setting", "model", "expected"), [
    ("ddp", "auto", "gpt-6.2b", True), ("ddp", "off", "gpt-6.2b", False),
    ("ddp", "auto", "llama-8b", False), ("ddp", "on", "llama-8b", True), ("none", "auto", "gpt-6.2b", True)])
def test_embedding_allreduce_auto_follows_tied_embeddings(mode, setting, model, expected):
    r = run_study(_study(pp=4, dp=2 if mode != "none" else 1, mode=mode, cluster="dgx-h100:2",
                         model=model_preset(model), embedding_allreduce=setting))
    assert bool(_embedding_tasks(r)) is expected
    if expected and mode == "ddp":  # the stage's OPTIM waits for it
        graph = r.sim.graph
        optim0 = next(t for t in graph.tasks if t.action.kind is Kind.OPTIM and t.action.stage == 0)
        assert set(graph.plan.embedding) & set(optim0.deps)


def test_embedding_allreduce_skipped_when_one_rank_holds_both_ends():
    graph = lower(build("zb-v", pp=2, microbatches=4))  # V placement: stage 0 and the last stage on rank 0
    assert graph.schedule.stage_to_rank[0] == graph.schedule.stage_to_rank[-1]
    assert add_data_parallel(graph, "none", [1] * graph.schedule.num_stages, embedding=True) is graph


def test_options_from_a_study_file_and_flags(tmp_path, capsys):
    path = tmp_path / "s.toml"
    path.write_text('[model]\npreset = "gpt-6.2b"\n[cluster]\npreset = "dgx-h100:1"\n'
                    '[parallel]\npp = 4\ndp = 2\ndp_mode = "fsdp"\nfsdp_reshard_after_forward = false\n'
                    'fsdp_prefetch = 2\nlink_model = "fcfs"\nembedding_allreduce = "off"\n'
                    '[run]\nschedule = "1f1b"\nmicrobatches = 4\n')
    p = load_study(path).parallel
    assert (p.fsdp_reshard_after_forward, p.fsdp_prefetch, p.link_model, p.embedding_allreduce) == (
        False, 2, "fcfs", "off")
    flags = load_study(path, {"parallel": {"fsdp_reshard_after_forward": True, "link_model": "fair"}}).parallel
    assert (flags.fsdp_reshard_after_forward, flags.link_model) == (True, "fair")
    assert main(["--config", str(path), "--fsdp-reshard-after-forward", "on", "--json"]) == 0
    assert '"fsdp_reshard_after_forward": true' in capsys.readouterr().out
    path.write_text(path.read_text().replace("fsdp_prefetch = 2", "fsdp_prefetch = 1.5"))
    with pytest.raises(ConfigError, match=r"^config \[parallel\]: fsdp_prefetch must be a whole number >= 0, got 1.5$"):
        load_study(path)
