"""The pause of live elastic training (``--elastic live``, torchft) when a replica dies and when it rejoins.

    python experiments/live_pause.py [--steps 60] [--json out/live_pause.json] [--markdown docs/results/elastic.md]

A torchft lighthouse in this process and two replicas (pp 1, gloo), each
under its own torchrun with ``--max-restarts 1``; replica 1 SIGKILLs itself
at step 5 and torchrun starts it again; each step lasts at least 0.2 s, so
the new process joins while replica 0 trains. From the replicas' event logs
(:func:`real.faults.elastic.pause_report`): the detection, the new quorum, the
survivor's pause, the replacement's start and its state transfer (seconds and
bytes), and the rate of torchft's HTTPTransport on 128 MiB. ``--json`` writes them for ``experiments/goodput.py --pause``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from analysis.cli.common import OneLineParser, errors_to_exit, positive_int
from analysis.results_page import check_page, table, write_page
from common.outputs import atomic_write, check_output_file
from real.faults.elastic import pause_report
from real.launch import torchrun

MODEL = ["--layers", "2", "--dim", "64", "--heads", "4", "--vocab", "256", "--seq", "32"]
KILL_AT, MIN_STEP = 5, 0.2


def _replicas(lighthouse: str, tmp: Path, steps: int) -> list[list[dict]]:
    common = ["-m", "real", "--elastic", "live", "--lighthouse", lighthouse, "--wait-replicas", "2", "--steps",
              str(steps), "--batch-size", "8", *MODEL, "--timeout", "10", "--min-step-time", str(MIN_STEP), "--json"]
    done: dict[int, subprocess.CompletedProcess] = {}

    def go(i: int, extra: list[str]) -> None:
        done[i] = torchrun(1, [*common, "--replica-id", str(i), "--events", str(tmp / f"ev{i}.jsonl"), *extra],
                           timeout=steps * MIN_STEP + 120, capture=True,
                           launcher_args=["--max-restarts=1", "--monitor-interval=0.2"])

    threads = [threading.Thread(target=go, args=(0, [])),
               threading.Thread(target=go, args=(1, ["--fail-at-step", str(KILL_AT)]))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, proc in sorted(done.items()):
        if proc.returncode != 0:
            sys.exit(f"error: replica {i} failed (status {proc.returncode}): {proc.stderr[-2000:]}")
    return [[json.loads(line) for line in (tmp / f"ev{i}.jsonl").read_text().splitlines()] for i in (0, 1)]


def _transfer_rate(total_mb: int = 128, chunk_mb: int = 4) -> tuple[float, float]:
    """(bytes, seconds) of one state dict sent and received through torchft's HTTPTransport on this host
    (loopback), ``chunk_mb`` MiB tensors: the rate the state transfer is scaled by."""
    from datetime import timedelta

    import torch
    from torchft.checkpointing.http_transport import HTTPTransport

    transport = HTTPTransport(timedelta(seconds=120), num_chunks=0)
    state = {f"chunk{i}": torch.ones(chunk_mb * 2**20 // 4) for i in range(total_mb // chunk_mb)}
    nbytes = sum(t.numel() * 4 for t in state.values())
    try:
        start = time.perf_counter()
        transport.send_checkpoint(dst_ranks=[1], step=1, state_dict=state, timeout=timedelta(seconds=120))
        got = transport.recv_checkpoint(src_rank=0, metadata=transport.metadata(), step=1,
                                        timeout=timedelta(seconds=120))
        seconds = time.perf_counter() - start
    finally:
        transport.shutdown()
    if sorted(got) != sorted(state):
        sys.exit("error: the state received through HTTPTransport differs from the one sent")
    return float(nbytes), seconds


def main() -> None:
    ap = OneLineParser(prog="python experiments/live_pause.py", description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=positive_int, default=60)
    ap.add_argument("--json", metavar="FILE", help="write the measured costs (for experiments/goodput.py --pause)")
    ap.add_argument("--markdown", metavar="PAGE.md", help="also write the results page (docs/results/elastic.md)")
    args = ap.parse_args()
    with errors_to_exit(ap):
        if args.json:
            check_output_file(args.json, "JSON file")
        if args.markdown:
            check_page(args.markdown)
    from torchft.coordination import LighthouseServer

    lighthouse = LighthouseServer(bind="[::]:0", min_replicas=1, join_timeout_ms=100, quorum_tick_ms=10,
                                  heartbeat_timeout_ms=300)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            survivor, victim = _replicas(lighthouse.address(), Path(tmp), args.steps)
    finally:
        lighthouse.shutdown()
    bulk_bytes, bulk_s = _transfer_rate()
    report = {**pause_report(survivor, victim), "bulk_bytes": bulk_bytes, "bulk_s": bulk_s,
              "transfer_s_per_byte": bulk_s / bulk_bytes, "heartbeat_timeout_s": 0.3, "min_step_s": MIN_STEP}
    if args.json:
        atomic_write(args.json, lambda t: Path(t).write_text(json.dumps(report, indent=1)), "JSON file")
    if args.markdown:
        print(f"wrote {write_page(args.markdown, 'Live elastic training: the pause', _page(report))}", file=sys.stderr)
    for key, value in report.items():
        print(f"{key:>20} {value:.6g}")


def _page(r: dict) -> str:
    rows = [["detection: the kill to the survivor's failed all-reduce", f"{r['detection']:.3f} s"],
            ["the survivor's next quorum (without the dead replica)", f"{r['quorum']:.3f} s"],
            ["the survivor's pause (commit to commit, less a median step)", f"{r['pause']:.3f} s"],
            ["replacement: the kill to the new process's start (torchrun restart, imports)", f"{r['replacement']:.3f} s"],
            ["the joining replica's first quorum with the state transfer", f"{r['heal_s']:.3f} s"],
            ["state received (parameters, AdamW moments, losses, data position)", f"{r['heal_bytes']:,.0f} bytes"],
            [f"torchft's HTTPTransport alone, {r['bulk_bytes'] / 2**20:.0f} MiB on loopback",
             f"{r['bulk_s']:.3f} s ({r['bulk_bytes'] / r['bulk_s'] / 1e6:.0f} MB/s)"]]
    return f"""\
`experiments/live_pause.py`: two replicas (pp 1, gloo on CPU, a 2-layer gpt of dim 64) under torchft's
per-step quorum (lighthouse heartbeat timeout 0.3 s); replica 1 is SIGKILLed at step 5 and restarted by
torchrun (`--max-restarts 1`); each step lasts at least {r['min_step_s']:g} s. The survivor never stops: it
redoes step 5 alone with the whole batch and goes on; the new process joins at a step boundary and receives
the state from the survivor over HTTP (torchft's `HTTPTransport`).

{table(["what", "measured"], rows, right=[False, True])}

`experiments/goodput.py --pause FILE` scales these to a cluster: the detection and the quorum as measured,
the state transfer by bytes (HTTPTransport's seconds per byte here times one GPU's state in the simulated
replica).
"""


if __name__ == "__main__":
    main()
