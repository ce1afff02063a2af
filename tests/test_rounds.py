"""``real.rounds``: every rank of a rounds launch takes the same decisions, and a desync is an error, not a hang.

The launches that hung (``docs/validation-protocol.md``, "A launch that fails") had
one rank go on to the next configuration while the others ran the same one again:
each rank divided the foreign CPU time by its own wall time, and rank 0's is longer
(it gathers and writes the results). One torchrun launch (gloo, 2 processes, pp=2)
provokes exactly that: rank 1 sleeps 1 s after each run (a longer wall time) and
rank 0's machine-wide busy time is made 20 cores' worth, with ``max_foreign`` 12
between what the two walls would give. Both ranks must compute the same figure
and run config 0 twice (both attempts); then rank 1 is given another config 1
than rank 0 (another learning rate: the same messages), and the guard before the
run stops both with one line naming the ranks' positions. A second launch makes
rank 1's probe of the machine's speed 4 times its fastest around the first run
only: both ranks must judge that run slowed, run it again, and keep the second.
This file is also the worker.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from real import ModelConfig, RunConfig  # noqa: E402

LAUNCH_TIMEOUT = 90  # seconds: a hang guard, with room for a loaded 2-core CI machine
BUSY_CORES = 20.0  # rank 0's fake machine-wide busy time per second of wall time
MAX_FOREIGN = 12.0  # rank 0's wall gives ~20 - (the group's own CPU) > 12; rank 1's (1 s longer) ~20 D / (D + 1) < 12
SLEEP_S = 1.0  # rank 1's extra wall time per run


def _config(lr: float) -> RunConfig:
    model = ModelConfig(kind="gpt", layers=2, dim=16, heads=2, vocab=32, seq=8)
    return RunConfig.of(schedule="1f1b", pp=2, microbatches=2, batch_size=4, steps=2, model=model, backend="gloo",
                        lr=lr, timeout_s=20)


def test_foreign_cores_is_rank_0s_busy_time_less_every_ranks_cpu_over_rank_0s_wall():
    from real.rounds.worker import foreign_cores

    rows = [[3, 0.5, 4.0, 2.0], [3, 0.25, 0.0, 8.0], [-1, 0.25, 0.0, 0.5]]  # (steps, cpu, busy, wall) per rank
    assert foreign_cores(rows) == (4.0 - 1.0) / 2.0  # rank 1's and 2's walls play no part
    assert foreign_cores([[3, 2.0, 1.0, 2.0], [3, 1.0, 0.0, 2.0]]) == 0.0  # never below 0


def test_the_guard_after_a_run_names_every_ranks_step_count():
    from real.rounds.worker import DesyncError, _same_steps

    _same_steps([[3, 0.1, 1.0, 1.0], [3, 0.1, 0.0, 1.0], [-1, 0.1, 0.0, 1.0]], "x")  # an async-ps server: -1
    with pytest.raises(DesyncError) as exc:
        _same_steps([[3, 0.1, 1.0, 1.0], [2, 0.1, 0.0, 1.0], [-1, 0.1, 0.0, 1.0]], "round 2, config 1 (ps), attempt 1")
    assert str(exc.value) == ("round 2, config 1 (ps), attempt 1: the ranks ran different numbers of steps "
                              "(rank 0: 3, rank 1: 2, rank 2: -1)")


def test_slowdown_is_the_slowest_probe_over_the_launchs_fastest():
    from real.rounds.worker import fastest_probe, slowdown

    # (steps, cpu, busy, wall, probe before, probe after) per rank; a parameter server's probes are 0.0
    rows = [[3, 0.5, 4.0, 2.0, 0.004, 0.005], [3, 0.25, 0.0, 8.0, 0.006, 0.004], [-1, 0.1, 0.0, 2.0, 0.0, 0.0]]
    assert fastest_probe(rows) == 0.004 and fastest_probe(rows, 0.003) == 0.003
    assert slowdown(rows, 0.004) == 0.006 / 0.004  # rank 1's probe before the run
    assert slowdown(rows, fastest_probe(rows, 0.002)) == 3.0
    assert slowdown([[3, 0.1, 0.0, 1.0, 0.0, 0.0]], 0.004) == 1.0  # no rank probes: not judged


def test_the_probe_times_a_fixed_piece_of_work():
    from real.profile.probe import probe_seconds, spell

    t = probe_seconds(iters=2, repeats=2)
    assert 0.0 < t < 1.0
    assert spell([0.004, 0.005, 0.0, 0.006]) == 0.006 / 0.004 and spell([]) == 1.0  # 0.0: a rank that did not probe


def test_the_probe_flag_is_a_fraction_or_off():
    from real.measure import measure_interleaved
    from schedules import ConfigError

    with pytest.raises(ConfigError, match=r"^measurement protocol: max_slow must be a fraction > 0 \(or None: not "
                                          r"checked\), got 0$"):
        measure_interleaved([_config(0.1)], max_slow=0)


@pytest.mark.slow
@pytest.mark.timeout(LAUNCH_TIMEOUT + 15)
def test_a_run_the_host_slowed_is_run_again_on_every_rank(tmp_path):
    from tests.conftest import launch_self

    (tmp_path / "mode").write_text("slow")
    reports = launch_self(__file__, 2, tmp_path, LAUNCH_TIMEOUT)
    assert [r["runs"] for r in reports] == [2, 2]  # the first run judged slowed on both ranks, run again once
    kept = reports[0]["result"]["runs"][0]["rounds"]
    assert [(x["attempts"], x["slowdown"]) for x in kept] == [(2, 1.0)]  # the second run kept, not slowed
    assert reports[1]["result"] is None  # rank 0 returns the results


@pytest.mark.slow
@pytest.mark.timeout(LAUNCH_TIMEOUT + 15)
def test_ranks_with_different_walls_take_the_same_decision_and_a_desync_is_an_error(tmp_path):
    from tests.conftest import launch_self

    reports = launch_self(__file__, 2, tmp_path, LAUNCH_TIMEOUT)
    assert [r["runs"] for r in reports] == [2, 2]  # config 0 ran twice on both ranks, config 1 never
    figures = [r["foreign"] for r in reports]
    assert figures[0] == figures[1] and len(figures[0]) == 2 and min(figures[0]) > MAX_FOREIGN  # the same bits
    digests = [r["digests"] for r in reports]
    assert digests[0][0] == digests[1][0] and digests[0][1] != digests[1][1]
    expected = ("round 1, config 1 (1f1b pp=2 m=2): the ranks are not in the same run (rank 0: round 1 config 1 "
                f"attempt 1 digest {digests[0][1]:08x}, rank 1: round 1 config 1 attempt 1 digest "
                f"{digests[1][1]:08x}); they took different decisions")
    assert [r["error"] for r in reports] == [expected, expected]


FAST_PROBE, SLOW_PROBE = 0.001, 0.004  # seconds: the second is 4 x the first, over any max_slow below 3


def _slow_worker(out: Path) -> None:
    import real.rounds.worker as rounds

    rank = int(os.environ["RANK"])
    runs, probes = [0], [0]
    real_run = rounds.run

    def run(*args, **kw):
        runs[0] += 1
        return real_run(*args, **kw)

    def probe() -> float:  # rank 1: the seed's probes, then the first run's two (before, after) slow
        probes[0] += 1
        first_run = rounds.SEED_PROBES < probes[0] <= rounds.SEED_PROBES + 2
        return SLOW_PROBE if rank == 1 and first_run else FAST_PROBE

    rounds.run, rounds.probe_seconds = run, probe
    spec = {"configs": [_config(0.1).to_dict()], "rounds": 1, "attempts": 3, "max_foreign": 1000.0, "max_slow": 0.5,
            "trace_dir": None, "result": str(out / "unused.json"), "progress": None}
    result = rounds.run_rounds(spec)
    (out / f"rank{rank}.json").write_text(json.dumps({"runs": runs[0], "result": result}))


def _worker(out: Path) -> None:
    import torch.distributed as dist

    import real.rounds.worker as rounds

    if (out / "mode").exists():
        _slow_worker(out)
        return
    rank = int(os.environ["RANK"])
    configs = [_config(0.1), _config(0.1 if rank == 0 else 0.2)]
    runs, foreign = [0], []
    real_run, real_foreign = rounds.run, rounds.foreign_cores

    def run(*args, **kw):
        runs[0] += 1
        result = real_run(*args, **kw)
        if rank == 1:
            time.sleep(SLEEP_S)
        return result

    def figure(rows):
        foreign.append(real_foreign(rows))
        return foreign[-1]

    rounds.run, rounds.foreign_cores = run, figure
    if rank == 0:
        rounds.machine_busy_seconds = lambda: BUSY_CORES * time.perf_counter()
    spec = {"configs": [c.to_dict() for c in configs], "rounds": 1, "attempts": 2, "max_foreign": MAX_FOREIGN,
            "trace_dir": None, "result": str(out / "unused.json"), "progress": None}
    error = None
    try:
        rounds.run_rounds(spec)
    except rounds.DesyncError as exc:
        error = str(exc)
    assert not dist.is_initialized()  # run_rounds closed the group, as after an error it must
    report = {"runs": runs[0], "foreign": foreign, "error": error, "digests": [rounds._digest(c) for c in configs]}
    (out / f"rank{rank}.json").write_text(json.dumps(report))


if __name__ == "__main__":
    _worker(Path(sys.argv[1]))


def test_a_profile_the_host_slowed_is_taken_again_and_the_least_slowed_kept(tmp_path, monkeypatch, caplog):
    import real.launch
    from real.profile.protocol import profile_machine

    spells = iter([1.4, 1.25, 1.3])  # every attempt over 1 + max_slow: the second, least slowed, is kept
    calls = []

    def torchrun(nproc, argv, **kw):
        out = Path(argv[argv.index("--out") + 1])
        calls.append(out.name)
        out.write_text(json.dumps({"machine_speed": {"spell": next(spells)}, "attempt": len(calls)}))
        return type("Done", (), {"returncode": 0, "stderr": ""})()

    monkeypatch.setattr(real.launch, "torchrun", torchrun)
    model = ModelConfig(kind="gpt", layers=2, dim=16, heads=2, vocab=32, seq=8)
    with caplog.at_level("WARNING", logger="real.profile.protocol"):
        path = profile_machine(model, 2, [2], 3, tmp_path / "profile.json", max_slow=0.1, attempts=3)
    assert calls == ["profile.json", "profile.attempt2.json", "profile.attempt3.json"]
    assert json.loads(path.read_text())["attempt"] == 2
    err = caplog.text
    assert err.count("profiling again") == 2 and "x1.30 slower at its slowest than at its fastest; keeping the least " \
        "slowed (x1.25)" in err
    calls.clear()
    spells = iter([1.05])
    profile_machine(model, 2, [2], 3, tmp_path / "quiet.json", max_slow=0.1, attempts=3)
    assert calls == ["quiet.json"]  # within the bound: one profile
