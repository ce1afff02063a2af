"""The training stack that carries out a step: how its pipeline sends behave, what its host work costs.

The same schedule runs differently under Megatron-LM, DeepSpeed's pipeline engine and torchtitan
(torch.distributed.pipelining). A :class:`Stack` names the differences the simulator charges
(``--stack``; ``none`` keeps the simulator's idealised step: asynchronous sends, no host costs):

* **p2p**: ``blocking`` sends hold the sender's compute stream until the transfer is done (the next pass
  of the sending rank depends on the SEND's end, :func:`block_sends`), then the host synchronizes and
  launches the next pass (``launch_s`` before it is ready); ``async`` sends overlap the sender's compute.
  Megatron-LM: blocking without virtual stages (``overlap_p2p_comm`` is forced off there and
  ``batch_p2p_comm`` on, and ``_communicate`` waits on its requests and calls ``torch.cuda.synchronize()``
  with ``batch_p2p_sync``, the default: megatron/training/arguments.py and argument_utils.py,
  megatron/core/pipeline_parallel/p2p_communication.py at d98e8a64dd), asynchronous with them
  (``--overlap-p2p-communication`` on by default). DeepSpeed: blocking (``deepspeed.runtime.pipe.p2p.send``
  calls ``dist.send``; its ``async_op`` is not supported). torchtitan: asynchronous
  (``torch.distributed.pipelining`` posts ``batch_isend_irecv`` and waits on a send only at the step's end).
  ``megatron-legacy``, Megatron-LM before p2p overlap (NVIDIA/Megatron-LM f9283c5a8a, 31 May 2023, "Add option
  to overlap p2p communication"; the runs of Narayanan et al. 2021 and Korthikanti et al. 2022): blocking with
  virtual stages too, and without sequence parallelism each tensor rank sends 1/tp of the boundary tensor and
  the receiver all-gathers it over the tensor-parallel group (``scatter_gather_tensors_in_pipeline``, on by
  default since 72e4230bb5, Feb 2021) before its pass (``p2p_gather``: charged as the NCCL all-gather's time
  before the pass after a receive).
* **launch_s**: the host time to issue one kernel from eager PyTorch, "usually between 5-20 microseconds" on
  the CPU side (Meta's Holistic Trace Analysis, docs/source/features/cuda_kernel_launch_stats.rst): 5 us,
  the low end (the hosts of training clusters are fast). A pass is host-bound when its kernels take less
  GPU time than their launches: it lasts at least ``kernels x launch_s`` (:func:`pass_kernels`: one kernel
  per operation of the layer in the forward and in the input gradient, one per weight GEMM in the weight
  gradient). The stacks all run eager; ``none`` charges nothing.
* **fsdp_copies** (torchtitan, FSDP2): PyTorch's fully_shard copies on the compute stream around its
  collectives (torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py, torch 2.13): after each
  all-gather, ``foreach_all_gather_copy_out`` copies the gathered parameters out of the all-gather buffer
  (``split_with_sizes_copy``: each 16-bit element read and written) before the pass that needs them; before
  each reduce-scatter, ``foreach_reduce_scatter_copy_in`` copies the unsharded gradients into the
  reduce-scatter input in the reduce dtype (a 16-bit read, a 2- or 4-byte write). Both at HBM bandwidth, as
  delays before the pass and before the reduce-scatter. Megatron's distributed optimizer keeps parameters and
  gradients as views of its contiguous buffers, and copies nothing.
* **optimizer_sync**: the optimizer step waits for a global gradient norm (gradient clipping: Megatron-LM's
  ``--clip-grad`` 1.0, torchtitan's ``max_norm`` 1.0; DeepSpeed's ``gradient_clipping`` is 0 by default): an
  all-reduce of one value over the rank's model-parallel group and a host synchronize before each rank's
  step (:meth:`sim.costs.transformer_costs.TransformerCosts.optimizer_fixed`). The zero-bubble paper's implementation replaces it by a
  post-validation that lets the step go ahead (Qi et al. 2024, sec. 4; ``post_validation``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from common.errors import ConfigError, check_choice
from schedules import Kind, Stream, TaskGraph
from schedules.ir import COMPUTE_KINDS

__all__ = ["LAUNCH_S", "STACKS", "Stack", "after_p2p", "block_sends", "blocking_p2p", "check_stack", "pass_kernels",
           "stack_of"]

STACKS = ("none", "megatron", "megatron-legacy", "deepspeed", "torchtitan")
LAUNCH_S = 5e-6  # module docstring (HTA: 5-20 us per launch on the CPU side)


@dataclass(frozen=True, slots=True)
class Stack:
    name: str
    p2p: str  # "async", "blocking", or "megatron" (blocking without virtual stages, async with them)
    launch_s: float  # host seconds per kernel launch (0: not charged)
    optimizer_sync: bool  # the step waits for a global gradient norm (clipping)
    p2p_gather: bool = False  # without SP, the receiver all-gathers the boundary tensor over the TP group
    fsdp_copies: bool = False  # FSDP2's copy-out after an all-gather, copy-in before a reduce-scatter

    def blocking(self, graph: TaskGraph) -> bool:
        """Whether this stack's sends block the sender on ``graph``'s schedule."""
        if self.p2p == "megatron":
            return graph.schedule.num_stages == graph.num_ranks  # no virtual stages: overlap_p2p_comm is off
        return self.p2p == "blocking"


_STACKS = {
    "none": Stack("none", "async", 0.0, False),
    "megatron": Stack("megatron", "megatron", LAUNCH_S, True),
    "megatron-legacy": Stack("megatron-legacy", "blocking", LAUNCH_S, True, p2p_gather=True),
    "deepspeed": Stack("deepspeed", "blocking", LAUNCH_S, False),
    "torchtitan": Stack("torchtitan", "async", LAUNCH_S, True, fsdp_copies=True),
}


def check_stack(owner: str, value: object) -> None:
    check_choice(owner, "stack", value, STACKS, ConfigError)


def stack_of(name: str) -> Stack:
    check_stack("costs", name)
    return _STACKS[name]


def blocking_p2p(name: str, graph: TaskGraph) -> bool:
    return stack_of(name).blocking(graph)


def block_sends(graph: TaskGraph) -> TaskGraph:
    """The graph with blocking sends: each rank's compute task after a SEND in its program also waits for that
    SEND's end (the sender's stream holds until its transfer is done)."""
    tasks = list(graph.tasks)
    changed = False
    for prog in graph.programs:
        pending: list[int] = []
        for i in prog:
            t = tasks[i]
            if t.stream is Stream.SEND and t.action.kind in (Kind.SEND_F, Kind.SEND_B):
                pending.append(i)
            elif t.action.kind in COMPUTE_KINDS and pending:
                extra = tuple(p for p in pending if p not in t.deps)
                if extra:
                    tasks[i] = dataclasses.replace(t, deps=t.deps + extra)
                    changed = True
                pending = []
    return dataclasses.replace(graph, tasks=tuple(tasks)) if changed else graph


def after_p2p(graph: TaskGraph) -> list[tuple[int, bool]]:
    """The compute tasks whose previous task in their rank's program is a send or a receive, each with whether
    a receive came since the rank's last compute task."""
    out = []
    for prog in graph.programs:
        prev, received = None, False
        for i in prog:
            t = graph.tasks[i]
            if t.action.kind in COMPUTE_KINDS:
                if prev is not None and prev.stream in (Stream.SEND, Stream.RECV):
                    out.append((i, received))
                received = False
            elif t.stream is Stream.RECV:
                received = True
            prev = t
    return out


def pass_kernels(ops: int, weight_ops: int, kind: Kind) -> int:
    """Kernels one layer launches in a pass: F and R one per operation, I one per operation (its input
    gradient), W one per weight operation (its dW GEMM), B both."""
    if kind is Kind.W:
        return weight_ops
    if kind is Kind.B:
        return ops + weight_ops
    return ops
