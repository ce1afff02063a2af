"""The data-parallel section of ``schedlab compare`` and ``schedlab report``: exact figures of a closed-form case.

A 2-layer GPT (h 64, V 256, s 32) on one pipeline rank, dp 2, one microbatch, one bucket: each mode's step is
a sum of the cost model's own pieces, and each category of memory a multiple of the parameter count
Psi = 2 (12 h^2 + 13 h) + V h + s h + 2 h = 118,528.
"""

from __future__ import annotations

import json

import pytest

from analysis.cli.compare import compare_main, report_main
from analysis.dp_compare import (
    DPModeRow,
    StateBytes,
    format_dp_modes,
    load_measured,
    parse_dp_modes,
    predict_dp_modes,
    rows_from_json,
)
from common.errors import ConfigError
from schedules import Kind
from schedules.dp.modes import DP_MODES
from sim.costs.cluster import cluster_preset
from sim.costs.parallel import ParallelConfig
from sim.costs.transformer import TransformerConfig
from sim.costs.transformer_costs import TransformerCosts

MODEL = TransformerConfig(name="t2", layers=2, hidden=64, heads=4, vocab=256, seq_len=32)
PSI = 2 * (12 * 64**2 + 13 * 64) + 256 * 64 + 32 * 64 + 2 * 64
MODES = ("none", "sync", "ddp", "zero1", "zero2", "fsdp", "ps")


def _costs(mode: str = "none") -> TransformerCosts:
    """contention 0: the closed forms below add transfers to passes; test_links has compute slowed by them."""
    return TransformerCosts(model=MODEL, cluster=cluster_preset("dgx-h100:1+ps1"), contention=0.0,
                            parallel=ParallelConfig(pp=1, dp=2, dp_mode=mode, bucket_mb=1000))


def _closed_form_step(mode: str) -> float:
    c = _costs(mode)
    g, bucket = c.group(0), 2.0 * PSI  # one bucket of the 16-bit gradients
    f, b = c.pass_time(Kind.F, 0, 1), c.pass_time(Kind.I, 0, 1) + c.pass_time(Kind.W, 0, 1)
    opt = c.optim_time(0, 1)  # on the shard (opt / dp) for the ZeRO modes
    return {
        "none": f + b + opt,  # no OPTIM task: StudyResult.step_time adds the step after the last pass
        "sync": f + b + g.allreduce(bucket) + opt,
        "ddp": f + b + g.allreduce(bucket) + opt,  # one bucket: ready when the backward ends, as sync's
        "zero1": f + b + g.gather(bucket) + opt + g.gather(bucket),  # reduce-scatter, step, all-gather
        "zero2": f + b + g.gather(bucket) + opt + g.gather(bucket),
        "fsdp": g.gather(bucket) + f + b + g.gather(bucket) + opt,  # the backward's gather hides under F
        # push, the server's update (28 B per parameter at its memory bandwidth, one server), then pull
        "ps": f + b + g.ps(bucket) + 28 * PSI / c.cluster.pserver_spec.memory_bw + g.ps(bucket),
    }[mode]


def test_every_mode_closed_form():
    rows = predict_dp_modes(MODES, schedule="1f1b", microbatches=1, costs=_costs())
    assert [(r.mode, r.rank) for r in rows] == [(m, 0) for m in MODES]
    for r in rows:
        assert r.step_time == pytest.approx(_closed_form_step(r.mode), rel=1e-12), r.mode
    act = _costs().activations_of(2, True)  # one microbatch in flight, the logits included
    whole, half = float(PSI), PSI / 2
    assert {r.mode: r.memory for r in rows} == {
        "none": {"params": 2 * whole, "grads": 2 * whole, "optimizer": 12 * whole, "gathered": 0.0, "activations": act},
        "sync": {"params": 2 * whole, "grads": 2 * whole, "optimizer": 12 * whole, "gathered": 0.0, "activations": act},
        "ddp": {"params": 2 * whole, "grads": 2 * whole, "optimizer": 12 * whole, "gathered": 0.0, "activations": act},
        "zero1": {"params": 2 * whole, "grads": 2 * whole, "optimizer": 12 * half, "gathered": 0.0, "activations": act},
        "zero2": {"params": 2 * whole, "grads": 2 * half, "optimizer": 12 * half, "gathered": 0.0, "activations": act},
        "fsdp": {"params": 2 * half, "grads": 2 * half, "optimizer": 12 * half, "gathered": 2 * whole,
                 "activations": act},
        "ps": {"params": 2 * whole, "grads": 2 * whole, "optimizer": 0.0, "gathered": 0.0, "activations": act},
    }
    assert all(r.measured is None and r.measured_step_time is None for r in rows)


def test_state_bytes_of_fp32_adamw():
    (row,) = predict_dp_modes(["zero2"], schedule="1f1b", microbatches=1, costs=_costs(),
                              state=StateBytes(weight=4, grad=4, optimizer=8))
    assert (row.memory["params"], row.memory["grads"], row.memory["optimizer"]) == (4.0 * PSI, 2.0 * PSI, 4.0 * PSI)


def _run(mode: str, pp: int = 1, dp: int = 2) -> dict:
    """A run as ``schedlab run --json`` prints it (the fields the comparison reads, and others)."""
    return {"schedule": "1f1b", "pp": pp, "dp": dp, "dp_mode": mode, "backend": "gloo", "steps": 3,
            "losses": [3.5, 3.4, 3.3], "step_times": [0.5, 0.004, 0.006],
            "memory": [{"rank": r, "pp_rank": 0, "param_bytes": 1000 + r, "grad_bytes": 500, "optimizer_bytes": 2000,
                        "gathered_param_bytes": 0, "peak_activation_bytes": 300} for r in range(dp)]}


def test_measured_runs_beside_the_prediction(tmp_path):
    path = tmp_path / "runs.json"
    path.write_text(json.dumps({"runs": [_run("zero2"), _run("ps", pp=2, dp=1)]}))
    measured = load_measured(path)
    rows = predict_dp_modes(["ddp", "zero2"], schedule="1f1b", microbatches=1, costs=_costs(), measured=measured)
    ddp, zero2 = rows
    assert ddp.measured is None and ddp.measured_step_time is None  # no run of ddp: empty
    # the median after the warm-up step; per category the larger of the two dp ranks
    assert zero2.measured_step_time == 0.005
    assert zero2.measured == {"params": 1001.0, "grads": 500.0, "optimizer": 2000.0, "gathered": 0.0,
                              "activations": 300.0}
    assert zero2.measured_total == 3801.0
    assert rows_from_json(json.loads(json.dumps({"dp_modes": [r.to_dict() for r in rows]}))) == rows


def test_measured_errors(tmp_path):
    path = tmp_path / "runs.json"
    path.write_text(json.dumps([_run("ddp", pp=2, dp=1)]))
    with pytest.raises(ConfigError, match=r"^compare: the measured ddp run has pp=2 dp=1, the prediction pp=1 dp=2; "
                                          r"give runs of the predicted layout$"):
        predict_dp_modes(["ddp"], schedule="1f1b", microbatches=1, costs=_costs(), measured=load_measured(path))
    path.write_text(json.dumps([_run("fsdp"), _run("zero3")]))
    with pytest.raises(ConfigError, match=r"two runs of mode 'zero3'; give one per mode$"):
        load_measured(path)
    path.write_text(json.dumps({"runs": [{"dp_mode": "ddp"}]}))
    with pytest.raises(ConfigError, match=r"run #1 has no pp, dp, step_times, memory; give the JSON"):
        load_measured(path)


def test_mode_names():
    assert parse_dp_modes(["DDP", "fsdp", "zero3", "ps"]) == ("ddp", "fsdp", "ps")  # zero3 is fsdp's other name
    with pytest.raises(ConfigError) as exc:
        parse_dp_modes(["ddp", "zero4"])
    assert str(exc.value) == f"compare: unknown dp mode 'zero4'; valid: {', '.join(DP_MODES)}"
    assert DP_MODES[:8] == ("none", "sync", "ddp", "zero1", "zero2", "zero3", "fsdp", "ps")


def test_text_table():
    row = DPModeRow("zero1", 0, 0.25, {"params": 2048.0, "grads": 2048.0, "optimizer": 3 * 2**20, "gathered": 0.0,
                                        "activations": 512.0}, 0.3, None)
    assert format_dp_modes([row]).splitlines() == [
        "mode   rank  step s  measured  params  measured  grads  measured  optimizer  measured  gathered  measured  "
        "activations  measured      total  measured",
        "-" * 149,
        "zero1  0       0.25       0.3   2 KiB            2 KiB                3 MiB                 0 B           "
        "       512 B            3.004 MiB          ",
    ]


def _cli(tmp_path, *extra: str) -> list[str]:
    return ["--model", "gpt-tiny", "--cluster", "dgx-h100:1", "--pp", "2", "--dp", "4", "--microbatches", "2",
            "--schedules", "1f1b", "--out", str(tmp_path / "out"), *extra]


def test_compare_cli_writes_the_files(tmp_path, capsys):
    assert compare_main(_cli(tmp_path, "--dp-modes", "ddp,zero1", "--json")) == 0
    printed = json.loads(capsys.readouterr().out)
    written = json.loads((tmp_path / "out" / "dp_modes.json").read_text())
    assert [(d["mode"], d["rank"]) for d in printed["dp_modes"]] == [("ddp", 0), ("ddp", 1), ("zero1", 0), ("zero1", 1)]
    assert written["dp_modes"] == printed["dp_modes"]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["dp_modes.csv", "dp_modes.json", "dp_modes.png"]
    csv = (tmp_path / "out" / "dp_modes.csv").read_text().splitlines()
    assert csv[0] == ("mode,rank,step_time,measured_step_time,params,grads,optimizer,gathered,activations,total,"
                      "measured_params,measured_grads,measured_optimizer,measured_gathered,measured_activations,"
                      "measured_total")
    assert len(csv) == 5


def test_report_section(tmp_path):
    from analysis.report import write_report
    from sim.plan.sweep import SweepConfig, run_sweep

    rows = [DPModeRow("ddp", 0, 0.25, {"params": 2048.0, "grads": 2048.0, "optimizer": 12288.0, "gathered": 0.0,
                                       "activations": 512.0}, 0.3, {"params": 2000.0, "grads": 2048.0,
                                                                    "optimizer": 12000.0, "gathered": 0.0,
                                                                    "activations": 600.0}),
            DPModeRow("zero1", 0, 0.2, {"params": 2048.0, "grads": 2048.0, "optimizer": 6144.0, "gathered": 0.0,
                                        "activations": 512.0})]
    sweep = run_sweep(SweepConfig(pp=2, microbatches=2, schedules=("1f1b",), sweep=(2,), recompute_limits=()))
    md = write_report(tmp_path / "rep", sweep, dp_modes=rows).read_text()
    section = md[md.index("## Data-parallel modes"):].splitlines()
    assert section[4:9] == [
        "![step time and memory per rank per data-parallel mode](dp-modes.png)",
        "",
        "| mode | rank | step s | measured | params | measured | grads | measured | optimizer | measured | gathered | "
        "measured | activations | measured | total | measured |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        "| ddp | 0 | 0.25 | 0.3 | 2 KiB | 1.953 KiB | 2 KiB | 2 KiB | 12 KiB | 11.72 KiB | 0 B | 0 B | 512 B | 600 B | "
        "16.5 KiB | 16.26 KiB |",
    ]
    assert section[9] == ("| zero1 | 0 | 0.2 | - | 2 KiB | - | 2 KiB | - | 6 KiB | - | 0 B | - | 512 B | - | "
                          "10.5 KiB | - |")
    assert (tmp_path / "rep" / "dp-modes.png").is_file()


def test_report_cli_reads_the_comparison(tmp_path, capsys):
    bad = tmp_path / "dp.json"
    bad.write_text(json.dumps({"schedules": []}))
    with pytest.raises(SystemExit):
        report_main(["--out", str(tmp_path / "rep"), "--dp-compare", str(bad)])
    assert capsys.readouterr().err.strip() == ("error: data-parallel comparison: no 'dp_modes' list; give the "
                                               "dp_modes.json of a data-parallel comparison (DPModeRow.to_dict rows) "
                                               "(flag --dp-compare)")
    assert not (tmp_path / "rep").exists()


@pytest.mark.parametrize(("extra", "message"), [
    (("--dp-modes", "ddp,zero4"), f"error: compare: unknown dp mode 'zero4'; valid: {', '.join(DP_MODES)} "
                                  "(flag --dp-modes)"),
    (("--dp-modes", "ddp", "--dp-mode", "ddp"), "error: --dp-mode has no effect with --dp-modes: the modes compared "
                                                "are --dp-modes"),
    (("--measured", "x.json"), "error: --measured has no effect without --dp-modes"),
    (("--dp-modes", "ddp", "--state-bytes", "4,4"), "error: schedlab compare: argument --state-bytes: invalid value "
                                                    "'4,4': give three numbers >= 0 separated by commas (weights, "
                                                    "gradients, optimizer state), e.g. 2,2,12 (see --help)"),
])
def test_compare_cli_errors(tmp_path, capsys, extra, message):
    with pytest.raises(SystemExit) as exc:
        compare_main(_cli(tmp_path, *extra))
    assert exc.value.code == 2
    assert capsys.readouterr().err.strip() == message
    assert not (tmp_path / "out").exists()


def test_compare_cli_needs_one_schedule_and_replicas(tmp_path, capsys):
    argv = [a for a in _cli(tmp_path, "--dp-modes", "ddp") if a not in ("--schedules", "1f1b")]
    with pytest.raises(SystemExit):
        compare_main(argv)
    assert capsys.readouterr().err.strip() == ("error: schedlab compare: --dp-modes compares the modes on one "
                                               "schedule; give --schedules NAME (e.g. 1f1b), got 'all'")
    with pytest.raises(SystemExit):
        compare_main([a if a != "4" else "1" for a in _cli(tmp_path, "--dp-modes", "ddp")])
    assert capsys.readouterr().err.strip() == ("error: schedlab compare: --dp-modes ddp: the modes differ only "
                                               "between replicas; give --dp 2 or more, got --dp 1")
