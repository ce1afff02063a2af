"""Chrome trace / Perfetto export of any trace (simulated or measured).

The Trace Event Format (the JSON the Perfetto UI and chrome://tracing open):
one process per rank, one thread per stream (compute, send, recv,
collective; a real MoE run with expert parallelism adds pair-forward,
pair-backward, all-to-all-forward and all-to-all-backward; any other stream
gets a thread of its own after those), a complete event ("ph": "X") per
task with microsecond timestamps, and a flow arrow ("ph": "s" then "f") from each SEND to the RECV
that takes its message.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from schedules.util import atomic_write, check_output_file

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["to_chrome_trace", "write_chrome_trace"]

_STREAMS = ("compute", "send", "recv", "collective", "pair-forward", "pair-backward", "all-to-all-forward",
            "all-to-all-backward")
_US = 1e6  # seconds -> microseconds (the format's unit)
# A SEND of stage s is received by stage s+1 (activations) or s-1 (gradients), same microbatch.
_PEER = {"SEND_F": ("RECV_F", 1), "SEND_B": ("RECV_B", -1)}


def to_chrome_trace(trace: pd.DataFrame, *, time_scale: float = _US) -> dict[str, Any]:
    """The trace as a Trace Event Format object; ``time_scale`` converts trace time to microseconds."""
    others = sorted(set(trace["stream"]) - set(_STREAMS))
    tids = {s: i for i, s in enumerate((*_STREAMS, *others))}
    events: list[dict[str, Any]] = []
    for rank in sorted(int(r) for r in trace["rank"].unique()):
        events.append({"ph": "M", "name": "process_name", "pid": rank, "tid": 0, "args": {"name": f"rank {rank}"}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": rank, "tid": 0, "args": {"sort_index": rank}})
        for stream in sorted(set(trace.loc[trace["rank"] == rank, "stream"]), key=tids.__getitem__):
            events.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": tids[stream], "args": {"name": stream}})
    recv_at: dict[tuple[str, int, int], tuple[int, int, float]] = {}
    for row in trace.itertuples(index=False):
        if row.kind in ("RECV_F", "RECV_B"):
            recv_at[(row.kind, int(row.stage), int(row.microbatch))] = (int(row.rank), tids[row.stream], float(row.end))
    flow = 0
    for row in trace.itertuples(index=False):
        ts, dur = float(row.start) * time_scale, max(0.0, float(row.end) - float(row.start)) * time_scale
        args = {"stage": int(row.stage), "microbatch": int(row.microbatch)}
        if row.bytes:
            args["bytes"] = float(row.bytes)
        events.append({"ph": "X", "name": str(row.action), "cat": str(row.kind), "pid": int(row.rank),
                       "tid": tids[row.stream], "ts": ts, "dur": dur, "args": args})
        peer = _PEER.get(row.kind)
        if peer is None:
            continue
        target = recv_at.get((peer[0], int(row.stage) + peer[1], int(row.microbatch)))
        if target is None:
            continue
        flow += 1
        events.append({"ph": "s", "id": flow, "name": "message", "cat": "p2p", "pid": int(row.rank),
                       "tid": tids[row.stream], "ts": ts})
        events.append({"ph": "f", "bp": "e", "id": flow, "name": "message", "cat": "p2p", "pid": target[0],
                       "tid": target[1], "ts": target[2] * time_scale})
    meta = {k: v for k, v in trace.attrs.items() if isinstance(v, (str, int, float, bool, dict, list))}
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": meta}


def write_chrome_trace(trace: pd.DataFrame, path: str | os.PathLike, *, time_scale: float = _US) -> Path:
    """Write the Chrome/Perfetto JSON (atomically); it opens in the Perfetto UI and in chrome://tracing."""
    path = check_output_file(path, "chrome trace file", (".json",))
    text = json.dumps(to_chrome_trace(trace, time_scale=time_scale), default=str)
    return atomic_write(path, lambda tmp: tmp.write_text(text), "chrome trace file")
