"""What a validation or plan check reports: undefined tau_b, in-sample rows apart, row kinds, the noise verdict."""

from __future__ import annotations

import math

import pytest

from analysis.results_page import json_ready
from analysis.validation.scores import (
    TOO_NOISY_EXIT,
    decomposition,
    describe_verdict,
    exit_status,
    format_tau,
    kendall_tau,
    noise_verdict,
    plan_goal,
    score_grid,
    score_plan,
    validation_summary,
    verdict_line,
)


@pytest.mark.parametrize(("xs", "ys", "spread"), [
    ([], [], None),
    ([1.0], [2.0], None),  # fewer than two rows
    ([1.0, 1.0, 1.0], [1.0, 2.0, 3.0], None),  # every prediction tied
    ([1.0, 2.0, 3.0], [5.0, 5.0, 5.0], None),  # every measurement tied
    ([1.0, 2.0, 3.0], [10.0, 11.0, 12.0], [(9.0, 13.0)] * 3),  # every spread overlaps: all tied in y
])
def test_kendall_tau_is_nan_where_tau_b_is_undefined(xs, ys, spread):
    tau = kendall_tau(xs, ys, spread)
    assert math.isnan(tau)
    assert format_tau(tau) == "undefined"


def test_format_tau_and_a_one_row_summary():
    assert (format_tau(1 / 3), format_tau(-1.0)) == ("0.33", "-1.00")
    row = {"schedule": "1f1b", "predicted_step_time": 1.0, "measured_step_time": 1.1, "error": -1 / 11}
    assert math.isnan(validation_summary([row])["kendall_tau"])


def test_an_undefined_tau_does_not_meet_the_plan_goal():
    assert plan_goal(math.nan, 0.0) == {"tau_b": "undefined", "gap": True, "met": False}
    assert plan_goal(0.8, 0.05) == {"tau_b": True, "gap": True, "met": True}
    assert plan_goal(0.79, 0.0) == {"tau_b": False, "gap": True, "met": False}
    assert plan_goal(0.9, 0.06) == {"tau_b": True, "gap": False, "met": False}


def _plan_row(predicted, measured, spread):
    return {"predicted_samples_per_s": predicted, "measured_samples_per_s": measured, "measured_spread": spread}


def test_plan_rows_whose_spreads_all_overlap_give_no_ranking():
    """Every measured spread overlaps every other: no pair is ordered, tau_b is undefined, the goal not met
    (it was 1.0 and met before)."""
    rows = [_plan_row(200.0, 190.0, [180.0, 200.0]), _plan_row(150.0, 185.0, [175.0, 195.0]),
            _plan_row(100.0, 188.0, [178.0, 198.0])]
    s = score_plan(rows)
    assert math.isnan(s["kendall_tau_b"]) and s["goal"] == {"tau_b": "undefined", "gap": True, "met": False}
    assert s["goal_met"] is False and s["predicted_best_gap"] == 0.0
    ordered = score_plan([_plan_row(200.0, 190.0, [189.0, 191.0]), _plan_row(150.0, 150.0, [149.0, 151.0])])
    assert (ordered["kendall_tau_b"], ordered["goal_met"]) == (1.0, True)


def _row(schedule, m, kind, in_sample, pred, meas, spread, prof, self_error, replay, without_send, half):
    return {"schedule": schedule, "microbatches": m, "kind": kind, "in_sample": in_sample,
            "predicted_step_time": pred, "measured_step_time": meas, "measured_spread": spread,
            "error": (pred - meas) / meas, "profile_predicted_step_time": prof, "profile_error": (prof - meas) / meas,
            "self_error": self_error, "replay_error": replay, "without": {"send_cpu": without_send},
            "half_difference": half, "foreign_cores": 0.0}


GRID = [
    _row("1f1b", 8, "pipeline", True, 0.100, 0.100, [0.0995, 0.1005], 0.090, 0.0, 0.001, 0.095, 0.02),
    _row("gpipe", 8, "pipeline", False, 0.110, 0.100, [0.099, 0.101], 0.095, 0.02, -0.01, 0.100, 0.02),
    _row("zb-h1", 8, "pipeline", False, 0.090, 0.120, [0.119, 0.121], 0.108, -0.04, 0.005, 0.084, -0.04),
    _row("dp2-ddp", 4, "data-parallel", False, 0.140, 0.200, [0.199, 0.201], 0.160, None, None, 0.140, 0.06),
]


def test_score_grid_scores_the_out_of_sample_rows_and_labels_the_kinds():
    """The calibration row (1f1b m=8, error 0) is scored apart; the headline is over gpipe (+10%), zb-h1 (-25%)
    and the ddp row (-30%); the mechanisms and the decomposition over the two out-of-sample pipeline rows."""
    s = score_grid(GRID)
    assert s["out_of_sample"] == ["gpipe m=8", "zb-h1 m=8", "dp2-ddp m=4"]
    assert s["mean_abs_error"] == pytest.approx((0.1 + 0.25 + 0.3) / 3)
    assert s["max_abs_error"] == pytest.approx(0.3)
    # gpipe-zb-h1 discordant, the other two pairs concordant: (2 - 1) / 3
    assert s["kendall_tau_b"] == pytest.approx(1 / 3)
    assert s["profile_mean_abs_error"] == pytest.approx((0.05 + 0.1 + 0.2) / 3)
    assert s["profile_kendall_tau_b"] == pytest.approx(1.0)
    assert s["by_kind"]["pipeline"]["rows"] == ["gpipe m=8", "zb-h1 m=8"]
    assert s["by_kind"]["pipeline"]["mean_abs_error"] == pytest.approx(0.175)
    assert s["by_kind"]["pipeline"]["kendall_tau_b"] == pytest.approx(-1.0)
    dp = s["by_kind"]["data-parallel"]
    assert (dp["rows"], dp["mean_abs_error"], math.isnan(dp["kendall_tau_b"])) == (["dp2-ddp m=4"], pytest.approx(0.3),
                                                                                   True)
    ins = s["in_sample"]
    assert (ins["rows"], ins["mean_abs_error"], ins["max_abs_error"]) == (["1f1b m=8"], 0.0, 0.0)
    assert s["mechanisms"] == pytest.approx({"all": 0.175, "without send_cpu": (0.0 + 0.3) / 2})
    assert s["decomposition"] == pytest.approx({"replay": 0.0075, "self_calibrated": 0.03, "transferred": 0.175,
                                                "noise": (0.02 + 0.02 + 0.04 + 0.06) / 4 / 2})
    assert s["max_abs_replay_error"] == pytest.approx(0.01)


def test_data_parallel_rows_are_taken_apart_on_their_own():
    """zero2 (+5%, self -2%, replay +1%) and zero3 (-15%, self -10%, no replay: its collectives are not the
    graph's); the comm_slowdown ablation turns zero3's -15% into -20%. The pipeline decomposition is unchanged."""
    dp = [{**_row("dp2-zero2", 4, "data-parallel", False, 0.210, 0.200, [0.199, 0.201], 0.19, -0.02, 0.01, 0.21,
                  0.02), "without": {"send_cpu": 0.21, "comm_slowdown": 0.2}},
          {**_row("dp2-zero3", 4, "data-parallel", False, 0.170, 0.200, [0.199, 0.201], 0.19, -0.10, None, 0.17,
                  0.02), "without": {"send_cpu": 0.17, "comm_slowdown": 0.16}}]
    s = score_grid(GRID[:3] + dp)
    assert s["dp_decomposition"] == pytest.approx({"replay": 0.01, "self_calibrated": 0.06, "transferred": 0.10,
                                                   "noise": (0.02 + 0.02 + 0.04 + 0.02 + 0.02) / 5 / 2})
    assert s["dp_mechanisms"] == pytest.approx({"all": 0.10, "without send_cpu": 0.10,
                                                "without comm_slowdown": (0.0 + 0.2) / 2})
    assert s["decomposition"] == score_grid(GRID[:3])["decomposition"] | {"noise": s["decomposition"]["noise"]}
    assert s["mechanisms"] == score_grid(GRID[:3])["mechanisms"]


def test_decomposition_leaves_out_the_in_sample_row():
    rows = [{"error": 0.0, "self_error": 0.0, "replay_error": 0.0, "half_difference": 0.02, "in_sample": True},
            {"error": 0.1, "self_error": 0.02, "replay_error": 0.01, "half_difference": 0.02}]
    assert decomposition(rows) == pytest.approx({"replay": 0.01, "self_calibrated": 0.02, "transferred": 0.1,
                                                 "noise": 0.01})


def test_a_busy_machine_is_too_noisy_to_judge():
    """Halves 26% apart (the 12-14% noise seen on a busy machine): the verdict says so and the exit status is 3."""
    rows = [{**r, "half_difference": h} for r, h in zip(GRID, (0.26, -0.26, 0.26, -0.26), strict=True)]
    noise = score_grid(rows)["decomposition"]["noise"]
    assert noise == pytest.approx(0.13)
    v = noise_verdict(noise, (3.14159, 2.0, 1.5), (3.4, 2.25, 1.6), 0.05, 1.25)
    assert v == {"verdict": "too noisy to judge", "judged": False, "noise": pytest.approx(0.13), "limit": 0.05,
                 "load_before": [3.14, 2.0, 1.5], "load_after": [3.4, 2.25, 1.6], "cores": v["cores"],
                 "max_foreign_cores": 1.25}
    assert exit_status(v) == TOO_NOISY_EXIT == 3
    assert describe_verdict(v) == (
        f"too noisy to judge: measured noise 13.0% (limit 5.0%); load average (1, 5, 15 min) 3.14, 2.00, 1.50 "
        f"before, 3.40, 2.25, 1.60 after, on {v['cores']} cores; other processes used up to 1.25 cores during a run")


def test_noise_below_the_limit_is_judged_and_no_noise_is_undefined():
    quiet = noise_verdict(0.03, (0.1, 0.1, 0.1), (0.2, 0.1, 0.1), 0.05)
    assert (quiet["verdict"], quiet["judged"], exit_status(quiet)) == ("judged", True, 0)
    assert noise_verdict(0.06, (0, 0, 0), (0, 0, 0), 0.1)["verdict"] == "judged"  # the limit is a flag
    one_round = noise_verdict(math.nan, (0.1, 0.1, 0.1), (0.2, 0.1, 0.1))
    assert (one_round["verdict"], one_round["judged"], exit_status(one_round)) == ("noise undefined", False, 3)


def test_json_ready_writes_nan_as_null():
    assert json_ready({"a": math.nan, "b": [1.0, math.nan, {"c": math.nan}], "d": "x"}) == \
        {"a": None, "b": [1.0, None, {"c": None}], "d": "x"}


def test_the_verdict_line_heads_a_page():
    noisy = noise_verdict(0.13, (3.0, 2.0, 1.0), (3.0, 2.0, 1.0), 0.05, 1.0)
    assert verdict_line(noisy) == (f"**Noise verdict: {describe_verdict(noisy)}.** The errors below are the "
                                   "measurement's as much as the model's.")
    quiet = noise_verdict(0.01, (0.1, 0.1, 0.1), (0.1, 0.1, 0.1), 0.05, 0.0)
    assert verdict_line(quiet) == f"**Noise verdict: {describe_verdict(quiet)}.**"
