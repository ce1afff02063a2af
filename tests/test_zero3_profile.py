"""ZeRO-3's gathers and the passes after them: the profile section (``real.profile.zero3``, measured on 2 gloo
processes) and how a zero3 row's costs take it (``analysis.validation.dp_transfer.zero3_costs``: each gather its bucket's
share of the measured burst, the passes the measured factors). This file is also the worker of the 2-process
test."""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from analysis.validation.dp_transfer import zero3_costs  # noqa: E402
from sim.costs.profiled import ProfiledCosts, StageCosts  # noqa: E402

LAUNCH_TIMEOUT = 90  # seconds: a hang guard, with room for a loaded 2-core CI machine
COSTS = ProfiledCosts(stages=(StageCosts(f=0.01, b=0.02, i=0.012, w=0.011, optim=0.003, param_bytes=3e6),),
                      collectives=(("all_reduce", 2e-4, 1e9), ("reduce_scatter", 3e-4, 1e9), ("all_gather", 1e-3, 2e9)))
SECTION = {"buckets": 4, "bytes": [1, 1, 1, 1], "burst": {"median": 0.006}, "factor": {"F": 1.25, "B": 1.5}}


def test_a_zero3_row_takes_the_burst_per_bucket_and_the_passes_factors():
    costs = zero3_costs(COSTS, SECTION)
    st = costs.stages[0]
    assert (st.f, st.b, st.i, st.w, st.optim) == pytest.approx((0.0125, 0.03, 0.018, 0.0165, 0.003))
    assert costs.collectives == (("all_reduce", 2e-4, 1e9), ("reduce_scatter", 3e-4, 1e9),
                                 ("all_gather", 0.0015, math.inf))  # 6 ms over 4 buckets, whatever the bytes


def test_a_profile_without_the_section_leaves_the_costs_alone():
    assert zero3_costs(COSTS, None) is COSTS and zero3_costs(COSTS, {}) is COSTS


@pytest.mark.slow
@pytest.mark.timeout(LAUNCH_TIMEOUT + 15)
def test_the_section_gathers_every_bucket_and_gives_the_parameters_back(tmp_path):
    from tests.conftest import launch_self

    reports = launch_self(__file__, 2, tmp_path, LAUNCH_TIMEOUT)
    for r in reports:
        assert r["restored"]  # every parameter its own storage and values again, bit for bit
        s = r["section"]
        assert s["buckets"] == r["buckets"] >= 2 and len(s["bytes"]) == s["buckets"]
        assert all(b % (4 * 2) == 0 for b in s["bytes"])  # float32, padded to a multiple of the group
        assert s["burst"]["median"] > 0 and s["burst"]["n"] == 2 * 2 * 3  # 2 bursts a repetition, 2 ranks
        assert s["gathered"]["F"]["n"] == s["alone"]["F"]["n"] == 2 * 3
        assert all(v > 0 for v in s["factor"].values())
    assert reports[0]["section"] == reports[1]["section"]  # every rank's samples, gathered alike


def _worker(out: Path) -> None:
    import torch.distributed as dist

    from real import ModelConfig
    from real.dp.sync import make_buckets
    from real.profile.comm import _gathered
    from real.profile.machine import _StageBench
    from real.profile.zero3 import zero3_section

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = ModelConfig(kind="gpt", layers=2, dim=16, heads=2, vocab=32, seq=8)
    bench = _StageBench(model, range(0, 2), 2, torch.device("cpu"), 0)
    before = [(p.data_ptr(), p.detach().clone()) for p in bench.params]
    bucket_mb = 4096 / 2**20  # a few buckets of the tiny stage
    section = zero3_section(bench, dist.group.WORLD, bucket_mb, 3, _gathered)
    restored = all(p.data_ptr() == ptr and torch.equal(p.detach(), v) for p, (ptr, v) in zip(bench.params, before, strict=True))
    buckets = len(make_buckets(bench.params, bucket_mb * 2**20))
    dist.destroy_process_group()
    (out / f"rank{rank}.json").write_text(json.dumps({"section": section, "restored": restored, "buckets": buckets}))


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    _worker(Path(sys.argv[1]))
