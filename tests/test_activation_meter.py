"""What the runtime's ActivationMeter counts: every tensor autograd saves, from its forward until its B or W."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from real.measure import ActivationMeter  # noqa: E402


def test_a_saved_tensor_stays_counted_until_release_and_a_freed_address_counts_afresh():
    """x * w saves x (4 float32, 16 bytes); w is a parameter, never counted. Dropping the graph before the release
    keeps x counted (the runtime's I lets go of nodes above a stage's last weight op; W releases them), but x's
    address is known no more: a tensor there saved under another key (on a real run, another microbatch's tensor
    the allocator put where x was) is counted on its own instead of being taken for x."""
    w = torch.ones(4, requires_grad=True)
    x = torch.randn(4)
    meter = ActivationMeter([w])
    meter.begin(True)
    with meter.saving("a"):
        y = x * w
    assert (meter.current, meter.first_bytes) == (16, {"a": 16})
    del y  # autograd frees what it saved
    assert meter.current == 16
    with meter.saving("b"):
        z = x * w
    assert (meter.current, meter.peak, meter.first_bytes) == (32, 32, {"a": 16, "b": 16})
    meter.release("a")
    meter.release("b")
    assert meter.current == 0
    del z


def test_one_tensor_saved_under_two_keys_is_counted_once_until_both_release():
    w = torch.ones(4, requires_grad=True)
    x = torch.randn(4)
    meter = ActivationMeter([w])
    meter.begin(True)
    with meter.saving("a"):
        y = x * w
    with meter.saving("b"):
        z = x * w
    assert (meter.current, meter.first_bytes) == (16, {"a": 16})
    meter.release("a")
    assert meter.current == 16
    meter.release("b")
    assert meter.current == 0
    del y, z
