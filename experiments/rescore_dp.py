"""Re-predict a saved validation grid's data-parallel rows under today's simulator, running nothing.

    python experiments/rescore_dp.py DIR [--modes ps,async-ps]

DIR is a ``validate_sim.py --out`` directory: its ``validation.json`` (the rows' measurements and the traces
each calibration read), ``profile.json``, ``profile-dp2.json`` and ``traces/``, read where they lie now (the
paths the JSON recorded are taken relative to the ``--out`` it was written under). The calibration is rebuilt
as the grid built it (:meth:`analysis.validation.calibration.Calibration.of` on the same traces), and each row of the
modes is predicted as :func:`analysis.validation.calibration.dp_row` predicts it (its step and its parts). Prints per row
the measured step, the grid's prediction and error, today's, and both parts (ms). What a model change does to
rows already measured, without a new grid (docs/dp-modes.md, "What a ps step costs").
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from analysis.cli.common import OneLineParser
from real.profile.protocol import GRID_DP_MODES


def _args(argv: list[str] | None = None):
    p = OneLineParser(prog="python experiments/rescore_dp.py", description=__doc__.splitlines()[0])
    p.add_argument("dir", help="a validate_sim.py --out directory")
    p.add_argument("--modes", default="ps,async-ps", metavar="MODE,MODE",
                   help="the data-parallel rows to re-predict (default ps,async-ps)")
    a = p.parse_args(argv)
    a.modes = [m for m in a.modes.split(",") if m]
    bad = [m for m in a.modes if m not in GRID_DP_MODES]
    if bad or not a.modes:
        p.error(f"--modes {','.join(bad) or repr('')}: give comma-separated modes of {','.join(GRID_DP_MODES)}")
    a.dir = Path(a.dir)
    if not (a.dir / "validation.json").is_file():
        p.error(f"{str(a.dir)!r} has no validation.json; give a validate_sim.py --out directory")
    return a


def rescore(root: Path, modes: list[str]) -> list[dict[str, Any]]:
    """Each data-parallel row of ``modes`` in ``root``'s grid: measured, the grid's prediction, today's, and the
    parts (measured as the grid took them apart, predicted today)."""
    from analysis.validation.async_grid import predict_async
    from analysis.validation.async_grid import predicted_parts as async_parts
    from analysis.validation.calibration import Calibration, dp_graph
    from analysis.validation.dp_modes import split_mode
    from analysis.validation.dp_transfer import predicted_parts
    from real.config import ModelConfig
    from real.dp.zero import MAX_INFLIGHT
    from real.profile.protocol import STALENESS, SYNC_EVERY, dp_buckets, dp_shapes

    data = json.loads((root / "validation.json").read_text())
    out_dir = Path(data["profile"]).parent  # the --out the grid was written under

    def here(path: str) -> str:
        return str(root / Path(path).relative_to(out_dir))

    cf, model = data["calibrated_from"], ModelConfig(**data["grid"]["model"])
    dp_traces = [here(t) for t in (cf.get("data_parallel") or {}).get("traces", [])]
    cal = Calibration.of(root / "profile.json", [here(t) for t in cf["traces"]], root / "profile-dp2.json",
                         MAX_INFLIGHT, dp_traces=dp_traces, dp_shapes=dp_shapes(model))
    dp_run = cf.get("dp_run")  # the data-parallel calibration run's gap closed, as the grid does today
    cal_row = next((r for r in data["schedules"] if dp_run and [r["schedule"], r["microbatches"]] == dp_run), None)
    if cal_row is not None:
        cal = cal.closed_on(dp_graph("gpipe", "ddp", cal_row["microbatches"], dp_buckets(model)),
                            cal_row["measured_step_time"])
    rows = []
    for r in data["schedules"]:
        mode = r.get("dp_mode")
        if mode not in modes:
            continue
        m, measured = r["microbatches"], r["measured_step_time"]
        graph = dp_graph("gpipe", mode, m, dp_buckets(model))
        costs = cal.data_parallel(mode)
        if mode == "async-ps":
            step, parts = predict_async(graph, costs, STALENESS), async_parts(graph, costs, STALENESS)
        else:
            every = SYNC_EVERY if split_mode(mode)[0] == "local-sgd" else 1
            parts = predicted_parts(mode, graph, costs, cal.dp_profile, every, skew=cal.dp_skew, shapes=cal.dp_shapes)
            step = parts["step"]
        rows.append({"row": f"{r['schedule']} m={m}", "measured": measured, "grid_predicted": r["predicted_step_time"],
                     "grid_error": r["error"], "predicted": step, "error": (step - measured) / measured,
                     "measured_parts": r["parts"]["measured"], "predicted_parts": parts})
    return rows


def _ms(parts: dict[str, float]) -> str:
    return " ".join(f"{k} {v * 1e3:.1f}" for k, v in parts.items())


def main(argv: list[str] | None = None) -> int:
    a = _args(argv)
    for row in rescore(a.dir, a.modes):
        print(f"{row['row']}: measured {row['measured'] * 1e3:.1f} ms; the grid predicted "
              f"{row['grid_predicted'] * 1e3:.1f} ({row['grid_error']:+.1%}); today {row['predicted'] * 1e3:.1f} "
              f"({row['error']:+.1%})")
        print(f"    measured parts:  {_ms(row['measured_parts'])}")
        print(f"    predicted parts: {_ms(row['predicted_parts'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
