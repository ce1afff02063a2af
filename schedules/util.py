"""Small helpers with no schedule knowledge."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["paused_gc"]


@contextmanager
def paused_gc() -> Iterator[None]:
    """Pause Python's cyclic garbage collector for an allocation-heavy pass.

    Building or simulating a graph allocates millions of small acyclic objects;
    each full collection would walk all of them. Reference counting still
    frees everything; the collector resumes after.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
