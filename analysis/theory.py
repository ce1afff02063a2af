"""Closed-form bubble figures from the literature, to check the simulator against.

All for uniform pass times (t_f, t_b, t_w per microbatch through a rank's
whole share; a full backward costs t_b + t_w) and no communication delay.
"""

from __future__ import annotations

__all__ = ["bubble_ratio", "bubble_time"]


def bubble_time(name: str, pp: int, microbatches: int, chunks: int, tf: float, tb: float, tw: float) -> float | None:
    """Idle time per rank of a schedule, or None where no closed form is known for these parameters."""
    p, m, v = pp, microbatches, chunks
    t = tf + tb + tw
    if name in ("gpipe", "1f1b"):
        # GPipe (Huang et al. 2019) and 1F1B (Narayanan et al. 2021, sec. 2.2): (p-1)(t_f+t_b).
        return (p - 1) * t
    if name == "interleaved-1f1b" and m % p == 0:
        # Megatron-LM interleaved schedule (Narayanan et al. 2021, sec. 2.2): (p-1)(t_f+t_b)/v.
        return (p - 1) * t / v
    if name == "looped-bfs" and m >= p:
        # Breadth-first (Lamy-Poirier 2023): with m >= p no chunk waits for the loop back.
        return (p - 1) * t / v
    return None


def bubble_ratio(name: str, pp: int, microbatches: int, chunks: int, tf: float, tb: float, tw: float) -> float | None:
    """bubble / (busy + bubble) per rank, each rank being busy m (t_f + t_b + t_w)."""
    bt = bubble_time(name, pp, microbatches, chunks, tf, tb, tw)
    if bt is None:
        return None
    busy = microbatches * (tf + tb + tw)
    return bt / (busy + bt) if busy + bt > 0 else 0.0
