"""The ``schedlab`` command, and the one home of every command-line flag.

    schedlab simulate --schedule 1f1b --pp 4 --microbatches 8 [--json] [--plot F.png]
    schedlab compare  --pp 4 --microbatches 8 --chunks 2 --out out/
    schedlab run      --schedule 1f1b --pp 2 --microbatches 8 [--dp 2] [--trace F.csv] [--json]
    schedlab report   --out out/report [--pp 4 --microbatches 8 --chunks 2] [--real TRACE.csv ...]
    schedlab perfetto TRACE.csv [OUT.json]
    schedlab plan     --model llama3-405b --cluster dgx-h100:64 --global-batch 2048 --seq-len 8192 [--json]
    schedlab list

Modules: :mod:`~analysis.cli.common` (parser, errors, shared flag groups),
:mod:`~analysis.cli.simulate` (``python -m sim``), :mod:`~analysis.cli.compare`
(compare, report, perfetto), :mod:`~analysis.cli.train` (``python -m real``,
``schedlab run``) and :mod:`~analysis.cli.profile` (``python -m real.profile``).
This package sits on top of all four libraries; none of them imports it.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from analysis.cli.common import fail, guarded

__all__ = ["main"]

_USAGE = """usage: schedlab COMMAND [flags]

commands:
  simulate   simulate one schedule (same flags as python -m sim)
  compare    simulate several schedules side by side; table + timeline PNGs
  run        train for real on torch.distributed (same flags as python -m real;
             starts torchrun with --nproc-per-node, default pp x dp)
  report     write a Markdown report with figures (and sim vs real if --real traces)
  perfetto   convert a trace (CSV/Parquet) to Chrome/Perfetto JSON
  plan       search tp/pp/dp/schedule/microbatches/dp mode/recomputation for the fastest step;
             exports for torchtitan and Megatron-LM
  list       list the registered schedules

schedlab COMMAND --help shows a command's flags."""


@guarded
def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        fail("schedlab: give a command: simulate, compare, run, report, perfetto, plan, list (see schedlab --help)")
    if argv[0] in ("-h", "--help"):
        print(_USAGE)
        return 0
    cmd, rest = argv[0], argv[1:]
    if cmd in ("simulate", "list"):
        from analysis.cli.simulate import main as sim_main

        return sim_main(rest if cmd == "simulate" else ["--list"], prog=f"schedlab {cmd}")
    if cmd in ("compare", "report", "perfetto"):
        from analysis.cli import compare

        return getattr(compare, f"{cmd}_main")(rest)
    if cmd == "plan":
        from analysis.cli.plan import plan_main

        return plan_main(rest)
    if cmd == "run":
        from analysis.cli.train import launch_main

        return launch_main(rest)
    fail(f"schedlab: unknown command {cmd!r}; valid: simulate, compare, run, report, perfetto, plan, list (see schedlab --help)")
