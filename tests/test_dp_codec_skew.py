"""The validation grid's bf16 and PowerSGD rows, and the skew between the replicas (analysis.validation.dp_modes,
analysis.validation.dp_skew): closed forms from given costs."""

from __future__ import annotations

import json
import math

import pytest

from analysis.validation.calibration import dp_graph
from analysis.validation.dp_modes import (
    HOOK_COLLECTIVES,
    codec_costs,
    hook_time,
    predict_mode,
    single_all_reduce,
)
from analysis.validation.dp_skew import busy_skew, skew_fraction, waits_each_step
from analysis.validation.dp_transfer import predicted_parts
from tests.test_dp_grid_modes import ALPHA, BETA, OPTIM, STEP_OVERHEAD, B, F, _costs
from tests.test_dp_transfer import _two_steps

# 3000 elements (the costs' 12000 bytes): a 100 x 20 matrix that PowerSGD:4 sends as factors of (100 + 20) x 4
# (960 x 2 < 2000: torch's rule), and a vector of 1000 sent whole: 4 x (480 + 1000) bytes
SHAPES = ((100, 20), (1000,))
PAYLOAD = 4 * (480 + 1000)
NS, SINGLE_ALPHA, SINGLE_BETA = 100.0, 0.002, 1e6


def _profile(tmp_path, single: bool = True):
    burst = {"alpha": ALPHA, "beta": BETA}
    path = tmp_path / "dp.json"
    path.write_text(json.dumps({
        "codecs": {"powersgd:4": NS, "bf16": 40.0},
        "collectives": {"all_reduce": {**burst, **({"single": {"alpha": SINGLE_ALPHA, "beta": SINGLE_BETA}}
                                                   if single else {})}}}))
    return path


def test_busy_skew_and_the_runs_skew_fraction():
    """Step 1: rank 0 busy 10 + 20 + 5 = 35 ms, rank 1 12 + 24 + 5 = 41 ms: mean 38, skew 3; step 2: both 30 ms,
    skew 0. The fraction is 3 / (38 + 30)."""
    assert busy_skew([(0, "F", 0.010), (0, "B", 0.020), (0, "OPTIM", 0.005), (0, "ALLREDUCE", 0.5),
                      (1, "F", 0.012), (1, "B", 0.024), (1, "OPTIM", 0.005)]) == (
        pytest.approx(0.003, rel=1e-9), pytest.approx(0.038, rel=1e-9))
    assert busy_skew([]) == (0.0, 0.0)
    assert skew_fraction([_two_steps()]) == pytest.approx(3 / 68, rel=1e-9)


def test_the_skew_applies_where_the_replicas_wait_for_each_other():
    assert [waits_each_step(m) for m in ("ddp", "zero3", "ps", "decentralized", "ddp+powersgd:4", "async-ps")] == [
        True, True, True, True, True, False]
    assert (waits_each_step("local-sgd"), waits_each_step("local-sgd", averaging=False)) == (True, False)


def test_the_skew_is_a_fraction_of_the_simulated_busy_time():
    """ddp, gpipe m=2: busy 2 F + 2 B + OPTIM; the skew adds 5% of it. local-sgd: only its averaging step, so the
    amortized step over K = 2 gets half of it; async-ps none (its time per update is analysis.validation.async_grid's)."""
    busy = 2 * (F + B) + OPTIM
    graph = dp_graph("gpipe", "ddp", 2, 3)
    plain = predict_mode("ddp", graph, _costs(BETA), None)["step"]
    assert predict_mode("ddp", graph, _costs(BETA), None, skew=0.05)["step"] == pytest.approx(plain + 0.05 * busy,
                                                                                               rel=1e-12)
    parts = predicted_parts("ddp", graph, _costs(BETA), None, skew=0.05)
    assert parts["skew"] == pytest.approx(0.05 * busy, rel=1e-12)
    assert parts["step"] == pytest.approx(plain + 0.05 * busy, rel=1e-12)
    ls = dp_graph("gpipe", "local-sgd", 2, 3)
    base, got = (predict_mode("local-sgd", ls, _costs(), None, 2, skew=k) for k in (0.0, 0.05))
    assert got["local"] == base["local"]
    assert got["averaging"] == pytest.approx(base["averaging"] + 0.05 * busy, rel=1e-12)
    assert got["step"] == pytest.approx(base["step"] + 0.05 * busy / 2, rel=1e-12)
    assert predicted_parts("local-sgd", ls, _costs(), None, 2, skew=0.05)["skew"] == pytest.approx(0.05 * busy / 2,
                                                                                                   rel=1e-12)


def test_a_bf16_row_is_ddp_with_half_the_bytes_and_the_profiles_codec_time(tmp_path):
    """As fp16: each all-reduce moves 2 of the 4 bytes per element (beta x 2) and takes 1000 x 40 ns more."""
    path = _profile(tmp_path)
    graph = dp_graph("gpipe", "ddp+bf16", 2, 3)
    want = predict_mode("ddp", graph, codec_costs(_costs(BETA), "bf16", 40.0, 3), None)["step"]
    assert predict_mode("ddp+bf16", graph, _costs(BETA), path)["step"] == pytest.approx(want, rel=1e-12)
    assert codec_costs(_costs(BETA), "bf16", 40.0, 3).collectives[0] == (
        "all_reduce", pytest.approx(ALPHA + 40e-6, rel=1e-12), BETA / 0.5)


def test_a_powersgd_row_holds_the_trainers_thread_for_its_hooks(tmp_path):
    """The hooks: 3000 elements x 100 ns of codec compute, per bucket 3 all-reduces waited for alone (2 ms
    each, 3 buckets) and the 5920 bytes of factors and whole tensors at 1 MB/s; on the last backward, so the
    step is the passes, the optimizer and the overhead with no collective left, plus the hooks."""
    path = _profile(tmp_path)
    hooks = NS * 3000 * 1e-9 + HOOK_COLLECTIVES * 3 * SINGLE_ALPHA + PAYLOAD / SINGLE_BETA
    assert hook_time(NS, 3000, 3, PAYLOAD, SINGLE_ALPHA, SINGLE_BETA) == pytest.approx(hooks, rel=1e-12)
    assert HOOK_COLLECTIVES == 3
    graph = dp_graph("gpipe", "ddp+powersgd:4", 2, 3)
    got = predict_mode("ddp+powersgd:4", graph, _costs(BETA), path, shapes=SHAPES)["step"]
    assert got == pytest.approx(2 * (F + B) + OPTIM + STEP_OVERHEAD + hooks, rel=1e-12)
    parts = predicted_parts("ddp+powersgd:4", graph, _costs(BETA), path, skew=0.1, shapes=SHAPES)
    skew = 0.1 * (2 * (F + B) + OPTIM)  # of the passes' busy time: the first hook's all-reduce waits for both
    assert parts == pytest.approx({"forward": 2 * F, "backward": 2 * B + hooks, "optimizer": OPTIM, "skew": skew,
                                   "exposed": 0.0, "overhead": STEP_OVERHEAD, "step": got + skew}, rel=1e-12)
    assert predict_mode("ddp+powersgd:4", graph, _costs(BETA), path, skew=0.1, shapes=SHAPES)["step"] == \
        pytest.approx(got + skew, rel=1e-12)
    assert single_all_reduce(_profile(tmp_path, single=False)) == (ALPHA, BETA)
    with pytest.raises(ValueError, match=r"^a powersgd:4 row needs the data-parallel profile and the model's "
                                         r"parameter shapes \(Calibration.of\(..., dp_shapes=\)\); give both$"):
        predict_mode("ddp+powersgd:4", graph, _costs(BETA), path)
    assert math.isfinite(got)


def _measured_profile(tmp_path, walls=(0.004, 0.006, 0.005)):
    """The profile above with PowerSGD's hooks measured per bucket (real.profile.powersgd) and a small fit."""
    path = _profile(tmp_path)
    data = json.loads(path.read_text())
    data["collectives"]["all_reduce"]["small"] = {"alpha": 0.0003, "beta": 2e8}
    data["powersgd"] = {"powersgd:4": {"buckets": [{"wall": {"median": w}, "compute": {"median": w / 4}}
                                                   for w in walls]}}
    path.write_text(json.dumps(data))
    return path


def test_a_powersgd_row_charges_the_hooks_the_profile_measured(tmp_path):
    """The profile's hooks, each bucket's median on the data-parallel group (4 + 6 + 5 ms), replace the build-up
    from the codec's ns and the all-reduce fit: the step is the passes, the optimizer, the overhead and 15 ms.
    A graph of 2 buckets (the profile has 3) gets their mean, 5 ms, per bucket; a profile without the section the
    build-up, with the small all-reduce fit (0.3 ms, 200 MB/s) in place of the single one."""
    from analysis.validation.dp_modes import measured_hooks

    path = _measured_profile(tmp_path)
    graph = dp_graph("gpipe", "ddp+powersgd:4", 2, 3)
    assert measured_hooks(path, "powersgd:4", 3) == pytest.approx(0.015, rel=1e-12)
    assert measured_hooks(path, "powersgd:4", 2) == pytest.approx(0.010, rel=1e-12)
    (tmp_path / "plain").mkdir()
    assert measured_hooks(path, "powersgd:1", 3) is None
    assert measured_hooks(_profile(tmp_path / "plain"), "powersgd:4", 3) is None
    got = predict_mode("ddp+powersgd:4", graph, _costs(BETA), path, shapes=SHAPES)["step"]
    assert got == pytest.approx(2 * (F + B) + OPTIM + STEP_OVERHEAD + 0.015, rel=1e-12)
    two = predict_mode("ddp+powersgd:4", dp_graph("gpipe", "ddp+powersgd:4", 2, 2), _costs(BETA), path,
                       shapes=SHAPES)["step"]
    assert two == pytest.approx(2 * (F + B) + OPTIM + STEP_OVERHEAD + 0.010, rel=1e-12)
    data = json.loads(path.read_text())
    del data["powersgd"]
    path.write_text(json.dumps(data))
    assert single_all_reduce(path) == (0.0003, 2e8)
    built = NS * 3000 * 1e-9 + HOOK_COLLECTIVES * 3 * 0.0003 + PAYLOAD / 2e8
    assert predict_mode("ddp+powersgd:4", graph, _costs(BETA), path, shapes=SHAPES)["step"] == pytest.approx(
        2 * (F + B) + OPTIM + STEP_OVERHEAD + built, rel=1e-12)


def test_a_powersgd_row_charges_the_hooks_timed_inside_a_backward(tmp_path):
    """A profile with the hooks timed inside a real backward (``in_backward``: 42 ms for its 3 buckets) is charged
    that, not the back-to-back walls (15 ms); a graph of 2 buckets gets 2/3 of it, 28 ms. The same file with
    ``in_backward`` removed (an older profile) still gives today's 15 ms."""
    from analysis.validation.dp_modes import measured_hooks

    path = _measured_profile(tmp_path)
    data = json.loads(path.read_text())
    data["powersgd"]["powersgd:4"]["in_backward"] = {"buckets": 3, "hooks": {"median": 0.042},
                                                     "extra": {"median": 0.045}}
    path.write_text(json.dumps(data))
    assert measured_hooks(path, "powersgd:4", 3) == 0.042
    assert measured_hooks(path, "powersgd:4", 2) == pytest.approx(0.028, rel=1e-12)
    graph = dp_graph("gpipe", "ddp+powersgd:4", 2, 3)
    got = predict_mode("ddp+powersgd:4", graph, _costs(BETA), path, shapes=SHAPES)["step"]
    assert got == pytest.approx(2 * (F + B) + OPTIM + STEP_OVERHEAD + 0.042, rel=1e-12)
    del data["powersgd"]["powersgd:4"]["in_backward"]
    path.write_text(json.dumps(data))
    assert measured_hooks(path, "powersgd:4", 3) == pytest.approx(0.015, rel=1e-12)


def test_powersgds_three_messages_per_bucket_are_torchs():
    """A 100 x 20 matrix at rank 4: P of 100 x 4, Q of 20 x 4 (960 x 2 < 2000); the vector of 1000 sent whole; at
    rank 8 the matrix is not worth it ((100 + 20) x 8 x 2 = 1920 < 2000 still is; rank 9: 2160, sent whole)."""
    from schedules.dp.codecs import powersgd_messages as messages
    from schedules.dp.codecs import powersgd_split

    assert messages(SHAPES, 4) == (1000, 400, 80)
    assert messages(SHAPES, 8) == (1000, 800, 160)
    assert messages(SHAPES, 9) == (3000, 0, 0)
    for r in (1, 4, 8, 9):
        whole, p, q = messages(SHAPES, r)
        assert powersgd_split(SHAPES, r) == (p + q, whole)
