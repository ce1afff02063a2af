"""decentralized SGD's exchange rows on gloo end when the exchange completes (real.dp.peer_sync._Watcher).

gloo's send/recv works say ``is_completed()`` False until waited for, so the trainer's polling between tasks
stamped every exchange at the step's drain (after the last backward). The watcher thread waits for each
exchange's works in the order issued and stamps its row as soon as both are done; a failed wait is raised on
the trainer's thread by ``join``. Fake works stand in for gloo's (a real exchange: tests/test_peer_modes.py).
"""

from __future__ import annotations

import threading

import pytest

pytest.importorskip("torch")

from real.dp.peer_sync import _Watcher


class _Work:
    """A work whose wait returns once released, logging (name, 'wait') in order."""

    def __init__(self, name: str, log: list, error: Exception | None = None) -> None:
        self.name, self.log, self.error, self.done = name, log, error, threading.Event()

    def wait(self) -> bool:
        assert self.done.wait(5), f"{self.name} never released"
        self.log.append(self.name)
        if self.error is not None:
            raise self.error
        return True


def _stamps(log: list):
    count = iter(range(100, 200))

    def stamp() -> int:
        value = next(count)
        log.append(f"stamp {value}")
        return value
    return stamp


def test_each_row_ends_when_its_send_and_receive_have_completed_in_issue_order():
    log: list = []
    watcher = _Watcher(_stamps(log))
    works = [_Work(n, log) for n in ("send0", "recv0", "send1", "recv1")]
    rows = [["0EXCHANGE0_b0", 1, None], None, ["0EXCHANGE0_b1", 2, None]]  # a second bucket untraced (None)
    watcher.add((works[0], works[1]), rows[0])
    watcher.add((works[2], works[3]), rows[1])
    watcher.add((), rows[2])
    watcher.start()
    works[1].done.set()  # the receive first: the row waits for its send too
    works[0].done.set()
    for w in works[2:]:
        w.done.set()
    watcher.join()
    assert log == ["send0", "recv0", "stamp 100", "send1", "recv1", "stamp 101"]
    assert rows == [["0EXCHANGE0_b0", 1, 100], None, ["0EXCHANGE0_b1", 2, 101]]
    watcher.join()  # nothing in flight: returns at once


def test_a_failed_wait_is_raised_by_join_and_the_rest_left_unstamped():
    log: list = []
    watcher = _Watcher(_stamps(log))
    dead = RuntimeError("Connection closed by peer")
    works = [_Work("send0", log, dead), _Work("recv0", log)]
    row = ["0EXCHANGE0_b0", 1, None]
    watcher.add(tuple(works), row)
    watcher.start()
    for w in works:
        w.done.set()
    with pytest.raises(RuntimeError, match=r"^Connection closed by peer$"):
        watcher.join()
    assert log == ["send0"] and row == ["0EXCHANGE0_b0", 1, None]
    watcher.join()  # the error is raised once
