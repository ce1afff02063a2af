"""real.dp.zero's flat gradient of a bucket (what each microbatch's reduce-scatter sends): exact contents."""

import torch
from torch import nn

from real.dp.sync import _Bucket
from real.dp.zero import _flatten_grads


def test_flatten_grads_orders_pads_zero_fills_and_drops_grads():
    a, b, c = nn.Parameter(torch.zeros(2, 2)), nn.Parameter(torch.zeros(3)), nn.Parameter(torch.zeros(2))
    a.grad = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    c.grad = torch.tensor([5.0, 6.0])  # b has no gradient: its slice is zeros
    data = torch.zeros(12)  # 9 elements padded to 12 (a multiple of dp 4)
    bucket = _Bucket(0, 0, [a, b, c], torch.empty(0), data=data, shard=torch.zeros(3))
    flat = _flatten_grads(bucket)
    assert flat.tolist() == [1.0, 2.0, 3.0, 4.0, 0.0, 0.0, 0.0, 5.0, 6.0, 0.0, 0.0, 0.0]
    assert flat.dtype == torch.float32
    assert a.grad is None and b.grad is None and c.grad is None


def test_flatten_grads_casts_to_the_shard_dtype():
    a = nn.Parameter(torch.zeros(2, dtype=torch.bfloat16))
    a.grad = torch.tensor([1.5, -2.0], dtype=torch.bfloat16)
    bucket = _Bucket(0, 0, [a], torch.empty(0), data=torch.zeros(2), shard=torch.zeros(1))
    flat = _flatten_grads(bucket)
    assert flat.dtype == torch.float32 and flat.tolist() == [1.5, -2.0]
