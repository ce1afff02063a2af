"""Links shared by concurrent transfers: max-min fair rates, the engine's flows, fcfs kept as it was."""

from __future__ import annotations

import dataclasses
import json

import pytest

from common.errors import ConfigError
from schedules import Action, Kind, Stream, Task, TaskGraph, build, lower
from schedules.dp.modes import add_data_parallel
from sim import simulate
from sim.costs.cluster import cluster_preset
from sim.costs.parallel import ParallelConfig
from sim.costs.transformer import model_preset
from sim.costs.transformer_costs import TransformerCosts
from sim.network import FairLinks, Network, max_min_rates

A, B = 0, 1  # two ports


class Flows:
    """A cost model of transfers only: each task's duration, ports, latency and ready delay given."""

    def __init__(self, dur, links, *, latency=None, lag=None, model="fair", queue=None, contention=0.0):
        self.dur, self.links, self.model, self.queue, self.contention = dur, links, model, queue, contention
        self.latency = latency or [0.0] * len(dur)
        self.lag = lag or [0.0] * len(dur)

    def duration(self, task, graph):
        return self.dur[task.id]

    def bytes(self, task, graph):
        return 0.0

    def activations(self, action, graph):
        return 0.0, 0.0

    def describe(self):
        return {"model": "flows"}

    def network(self, graph, dur):
        return Network(lag=self.lag, links=self.links, latency=self.latency, model=self.model, queue=self.queue,
                       contention=self.contention)


def _transfers(n: int) -> TaskGraph:
    """n independent collectives on rank 0 of a one-rank schedule (no compute)."""
    schedule = build("1f1b", pp=1, microbatches=1)
    tasks = tuple(Task(i, 0, Stream.COLLECTIVE, Action(Kind.ALLREDUCE, 0, None, bucket=i), ()) for i in range(n))
    return TaskGraph(schedule, tasks, (tuple(range(n)),))


def _ends(dur, links, **kw):
    r = simulate(_transfers(len(dur)), Flows(dur, links, **kw), check=False)
    return r.start, r.end


def test_max_min_rates_of_one_link_split_equally():
    assert max_min_rates({7: (A,), 3: (A,)}) == {3: 0.5, 7: 0.5}
    assert max_min_rates({0: (A,)}) == {0: 1.0}


def test_max_min_rates_with_a_bottleneck():
    # A (capacity 1) carries flows 1 and 2, B (capacity 2) flows 2 and 3: A is the bottleneck (share 1/2),
    # so flows 1 and 2 get 1/2 and flow 3 takes what B has left, 2 - 1/2 = 3/2.
    assert max_min_rates({1: (A,), 2: (A, B), 3: (B,)}, {A: 1.0, B: 2.0}) == {1: 0.5, 2: 0.5, 3: 1.5}
    # equal capacities: B carries three flows (1/3 each), A's other flow takes the rest, 2/3
    rates = max_min_rates({1: (A,), 2: (A, B), 3: (B,), 4: (B,)})
    assert rates == {1: 1 - 1 / 3, 2: 1 / 3, 3: 1 / 3, 4: 1 / 3}


@pytest.mark.parametrize(("model", "starts", "ends"), [("fair", [0.0, 0.0], [4.0, 4.0]),
                                                       ("fcfs", [0.0, 2.0], [2.0, 4.0])])
def test_two_equal_flows_on_one_link_finish_at_twice_one(model, starts, ends):
    assert _ends([2.0, 2.0], [(A,), (A,)], model=model) == (starts, ends)


def test_short_flow_finishes_then_the_long_one_speeds_up():
    # half speed each until the short one (1 s of bytes) is done at 2; the long one has 3 - 1 = 2 left, at full speed
    assert _ends([1.0, 3.0], [(A,), (A,)]) == ([0.0, 0.0], [2.0, 4.0])
    assert _ends([1.0, 3.0], [(A,), (A,)], model="fcfs") == ([0.0, 1.0], [1.0, 4.0])


def test_three_flows_over_two_links_with_a_bottleneck():
    # flows 1-3 cross B with rate 1/3 each (one crosses A too); flow 0 alone on A gets 2/3:
    # flow 0 (1 s of bytes) ends at 1.5; the others are held at 1/3 by B and end at 3
    _, end = _ends([1.0, 1.0, 1.0, 1.0], [(A,), (A, B), (B,), (B,)])
    assert end[1:] == [3.0, 3.0, 3.0]
    assert end[0] == 1 / (1 - 1 / 3) == pytest.approx(1.5, rel=1e-15)  # 2/3 rounded, once


def test_latency_is_paid_before_the_flow_joins():
    # 0.5 s of latency each, then 1 s of bytes each at half speed: 0.5 + 2
    assert _ends([1.5, 1.5], [(A,), (A,)], latency=[0.5, 0.5]) == ([0.0, 0.0], [2.5, 2.5])
    # the second is ready 0.5 s later (a lag) and joins at 1.0: flow 0 (joined at 0.5) has 0.5 left, at half
    # speed it ends at 2.0; flow 1 has moved 0.5 by then and moves its last 0.5 alone: 2.5
    assert _ends([1.5, 1.5], [(A,), (A,)], latency=[0.5, 0.5], lag=[0.0, 0.5]) == ([0.0, 0.5], [2.0, 2.5])


def test_a_flow_alone_ends_exactly_as_under_fcfs():
    # ready at 0.1 (a lag): 0.1 + 0.3 is not 0.1 + 0.05 + 0.25 in floating point, the flow still ends at 0.1 + 0.3
    start, end = _ends([0.3], [(A,)], latency=[0.05], lag=[0.1])
    assert (start, end) == _ends([0.3], [(A,)], lag=[0.1], model="fcfs") == ([0.1], [0.1 + 0.3])


def test_a_communicators_collectives_run_in_order_and_share_the_port_with_a_send():
    # two 2 s collectives of one communicator (queue 0) and a 2 s send, all ready at 0 on port A: the first
    # collective and the send share A at half speed (both end at 4), then the second collective runs alone
    start, end = _ends([2.0, 2.0, 2.0], [(A,), (A,), (A,)], queue=[0, 0, -1])
    assert (start, end) == ([0.0, 4.0, 0.0], [4.0, 6.0, 4.0])
    # fcfs: one at a time on the port, in ready order
    assert _ends([2.0, 2.0, 2.0], [(A,), (A,), (A,)], model="fcfs") == ([0.0, 2.0, 4.0], [2.0, 4.0, 6.0])
    # a queued task on no port still holds its queue: 1 s, then the next collective, shared with the send
    start, end = _ends([1.0, 2.0, 2.0], [(), (A,), (A,)], queue=[0, 0, -1])
    assert (start, end) == ([0.0, 1.0, 0.0], [1.0, 4.0, 3.0])


def test_transfers_on_no_port_or_of_latency_only_are_timed_alone():
    assert _ends([2.0, 2.0, 1.0], [(), (), (A,)], latency=[0.0, 0.0, 1.0]) == ([0.0] * 3, [2.0, 2.0, 1.0])


def test_bad_link_model_is_refused_in_one_line():
    with pytest.raises(ConfigError, match=r"^parallel: unknown link model 'fifo'; valid: fair, fcfs$"):
        ParallelConfig(pp=2, link_model="fifo")


GPT6 = model_preset("gpt-6.2b")


def _line_rate(cluster):
    """The cluster with its links at their full line rate (efficiency 1)."""
    return dataclasses.replace(cluster, intra=dataclasses.replace(cluster.intra, efficiency=1.0),
                               inter=dataclasses.replace(cluster.inter, efficiency=1.0))


def _run(pp, dp, mode, link_model, microbatches=4, embedding="auto", efficiency=None, contention=None):
    c = TransformerCosts(model=GPT6, cluster=cluster_preset("dgx-h100:2"), efficiency=efficiency, contention=contention,
                         parallel=ParallelConfig(pp=pp, dp=dp, dp_mode=mode, link_model=link_model,
                                                 embedding_allreduce=embedding))
    graph = add_data_parallel(lower(build("1f1b", pp=pp, microbatches=microbatches)), mode, c.buckets(pp))
    return simulate(graph, c)


def test_without_concurrent_transfers_fair_equals_fcfs_bit_for_bit():
    # pp=2, dp=1: rank 0's sends leave by its port 'out', rank 1's by its own; no two transfers share a port
    # (compute slowed while its rank communicates applies under fair only: left out, contention 0)
    fair, fcfs = _run(2, 1, "none", "fair", contention=0), _run(2, 1, "none", "fcfs")
    assert fair.start == fcfs.start and fair.end == fcfs.end


def test_fair_sharing_is_deterministic_and_differs_from_fcfs_under_contention():
    a, b = _run(4, 2, "ddp", "fair"), _run(4, 2, "ddp", "fair")
    assert a.start == b.start and a.end == b.end
    assert a.end != _run(4, 2, "ddp", "fcfs").end


@pytest.mark.parametrize(("mode", "cluster", "makespan"), [
    ("ddp", "dgx-h100:2", 0.13744090434102652), ("zero2", "dgx-h100:2", 0.1355778466730996),
    ("fsdp", "dgx-h100:2", 0.13557784667309944), ("ps", "dgx-h100:2+ps2", 0.6058125780431436)])
def test_fcfs_reproduces_the_engine_before_fair_sharing(mode, cluster, makespan):
    # the makespans of the FIFO-port engine of commit b81a9a7 (whose start and end times fcfs matches bit for
    # bit on these graphs); the embedding all-reduce, which that engine's graphs did not have, left out; the
    # H100 timed at the constant 0.6 of peak it had then (it has a device model now, sim.costs.devices), and its links
    # at their line rate as then (they run at NCCL's achieved fraction now, sim.costs.cluster), its collectives by
    # the alpha-beta formulas (collective 'hierarchical': a ring inside a node; NCCL's own choice came later)
    c = TransformerCosts(model=GPT6, cluster=_line_rate(cluster_preset(cluster)), efficiency=0.6, parallel=ParallelConfig(
        pp=8, dp=2, dp_mode=mode, link_model="fcfs", embedding_allreduce="off", collective="hierarchical"))
    graph = add_data_parallel(lower(build("1f1b", pp=8, microbatches=8)), mode, c.buckets(8))
    assert simulate(graph, c).makespan == makespan


def test_a_join_rebalances_only_the_flows_connected_to_it():
    fair = FairLinks([(A,), (B,), (A,)])
    assert fair.update(0.0, joins=[(0, 2.0, 2.0), (1, 2.0, 2.0)]) == [(0, 2.0, 0), (1, 2.0, 0)]
    # flow 2 joins on A at 1.0: flow 0 (1 s left) drops to half speed and ends at 3; flow 1 on B is not touched
    assert fair.update(1.0, joins=[(2, 2.0, 3.0)]) == [(0, 3.0, 1), (2, 5.0, 0)]
    assert fair.current(1, 0) and not fair.current(0, 0) and fair.current(0, 1)
    # flow 0 leaves at 3.0: flow 2 has moved 1 s of its 2 and runs the rest at full speed
    assert fair.update(3.0, leaves=[0]) == [(2, 4.0, 1)]


def test_a_network_of_the_wrong_length_is_refused():
    graph = _transfers(2)
    with pytest.raises(ValueError, match=r"^the cost model's network gives \{'lag': 2, 'links': 1, 'latency': 2, "
                                         r"'queue': 2\} entries for a graph of 2 tasks; give one per task$"):
        simulate(graph, Flows([1.0, 1.0], [(A,)], latency=[0.0, 0.0]), check=False)


@pytest.mark.parametrize(("argv", "message"), [
    (["--schedule", "1f1b", "--pp", "4", "--microbatches", "8", "--link-model", "fcfs"],
     "error: --link-model has no effect without physical units: add --model and --cluster (or --config)\n"),
    (["--model", "gpt-6.2b", "--cluster", "dgx-h100:2", "--pp", "8", "--schedule", "1f1b", "--microbatches", "8",
      "--link-model", "fifo"], "error: config [parallel]: unknown link model 'fifo'; valid: fair, fcfs (flag --link-model)\n"),
])
def test_link_model_flag_errors_are_one_line(capsys, argv, message):
    from analysis.cli.simulate import main

    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2 and capsys.readouterr().err == message


def test_link_model_flag_reaches_the_simulation(capsys):
    from analysis.cli.simulate import main

    argv = ["--model", "gpt-6.2b", "--cluster", "dgx-h100:2", "--pp", "8", "--dp", "2", "--dp-mode", "ddp",
            "--schedule", "1f1b", "--microbatches", "8", "--embedding-allreduce", "off", "--efficiency", "0.6", "--json"]
    spans = {}
    for model in ("fcfs", "fair"):
        assert main([*argv, "--link-model", model]) == 0
        d = json.loads(capsys.readouterr().out)
        assert d["costs"]["link_model"] == model
        spans[model] = d["makespan"]
    assert spans == {"fcfs": _run(8, 2, "ddp", "fcfs", 8, embedding="off", efficiency=0.6).makespan,
                     "fair": _run(8, 2, "ddp", "fair", 8, embedding="off", efficiency=0.6).makespan}


def _compute_and_transfer() -> TaskGraph:
    """Rank 0 computes F0 (task 0) while it runs a collective (task 1); neither waits for the other."""
    schedule = build("1f1b", pp=1, microbatches=1)
    tasks = (Task(0, 0, Stream.COMPUTE, Action(Kind.F, 0, 0), ()),
             Task(1, 0, Stream.COLLECTIVE, Action(Kind.ALLREDUCE, 0, None, bucket=0), ()))
    return TaskGraph(schedule, tasks, ((0, 1),))


@pytest.mark.parametrize(("lag", "model", "f_end"), [(0.0, "fair", 1 + 4 / 3), (1.0, "fair", 2 + 1 / 3),
                                                     (0.0, "fcfs", 2.0)])
def test_compute_runs_slower_while_its_rank_communicates(lag, model, f_end):
    # F0 of 2 s, a transfer of 1 s, contention 0.5 (rate 2/3 while it runs). At once: 2/3 of F0's work in the
    # first second, 4/3 s left at full speed. Transfer from 1 s to 2 s: 1 s at full speed, 2/3 s of work in the
    # next, 1/3 left. fcfs models no contention.
    costs = Flows([2.0, 1.0], [(), (A,)], lag=[0.0, lag], model=model, contention=0.5)
    r = simulate(_compute_and_transfer(), costs, check=False)
    assert r.end[0] == pytest.approx(f_end, rel=1e-12) and r.end[1] == pytest.approx(lag + 1.0, rel=1e-12)
    assert r.ranks[0].busy == pytest.approx(f_end, rel=1e-12)


def test_a_negative_contention_is_refused():
    with pytest.raises(ConfigError) as exc:
        Network(lag=[0.0], links=[()], latency=[0.0], contention=-0.1)
    assert str(exc.value) == "network: contention must be a finite slowdown >= 0, got -0.1"
    with pytest.raises(ConfigError) as exc:
        TransformerCosts(model=GPT6, cluster=cluster_preset("dgx-h100:1"), parallel=ParallelConfig(pp=1),
                         contention="much")
    assert str(exc.value) == "costs: contention must be a finite slowdown >= 0 (0: none), got 'much'"


def test_the_calibrated_devices_slow_compute_by_the_measured_mean_and_a_constant_efficiency_does_not():
    h100 = cluster_preset("dgx-h100:1")
    assert TransformerCosts(model=GPT6, cluster=h100, parallel=ParallelConfig(pp=1)).compute_contention == 0.189
    assert TransformerCosts(model=GPT6, cluster=h100, parallel=ParallelConfig(pp=1), efficiency=0.6).compute_contention == 0.0
    assert TransformerCosts(model=GPT6, cluster=h100, parallel=ParallelConfig(pp=1), contention=0.3).compute_contention == 0.3


def test_contention_and_overlap_param_gather_flags_reach_the_costs(capsys):
    from analysis.cli.simulate import main

    argv = ["--model", "gpt-6.2b", "--cluster", "dgx-h100:2", "--pp", "2", "--dp", "2", "--dp-mode", "zero1",
            "--schedule", "1f1b", "--microbatches", "2", "--json"]
    got = {}
    for extra in ([], ["--contention", "0", "--overlap-param-gather"]):
        assert main([*argv, *extra]) == 0
        costs = json.loads(capsys.readouterr().out)["costs"]
        got[len(extra)] = (costs["contention"], costs["overlap_param_gather"])
    assert got == {0: (0.189, False), 3: (0.0, True)}


@pytest.mark.parametrize(("extra", "message"), [
    (["--contention", "-1"], "error: config [run]: contention must be a finite slowdown >= 0 (0: none), got -1.0 "
                             "(flag --contention)\n"),
    (["--dp-mode", "ddp", "--overlap-param-gather"],
     "error: parallel: overlap_param_gather applies to dp_mode zero1 or zero2 (Megatron-LM's overlap_param_gather), "
     "not 'ddp'; use one of them or leave it out (flag --overlap-param-gather)\n"),
])
def test_contention_and_overlap_param_gather_flag_errors_are_one_line(capsys, extra, message):
    from analysis.cli.simulate import main

    with pytest.raises(SystemExit) as exc:
        main(["--model", "gpt-6.2b", "--cluster", "dgx-h100:2", "--pp", "2", "--dp", "2", "--schedule", "1f1b",
              "--microbatches", "2", *extra])
    assert exc.value.code == 2 and capsys.readouterr().err == message
