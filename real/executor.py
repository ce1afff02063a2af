"""The executor: one pipeline rank interprets its program of the lowered task graph, in order.

The graph is the one object the simulator also runs; nothing here re-derives
the schedule. Per task:

* F: run the stage on its input (the microbatch for stage 0, a received or
  in-memory value otherwise), keep the output for the backward; the last
  stage computes the loss, divided by the number of microbatches;
* B: full backward; I: input gradient only (handed on at once); W: the
  parameter gradients I left for later (:mod:`real.backward`);
* R: recomputation. An F whose (stage, microbatch) has an R later in the
  schedule runs under ``torch.no_grad``: it saves no autograd graph and keeps
  only its input (and the random-number state). R runs the stage's forward
  again on that input, with grad and the same random numbers, and rebuilds
  exactly the graph the backward (B, or I then W) needs;
* OVERLAP_F_B: its forward, then its backward; or, with ``overlap_timeout_s``
  (a MoE run with expert parallelism on the CPU, :mod:`real.trainer`), both at
  once: the forward in a thread of its own, the backward in this one, so that
  one microbatch's all-to-alls are in flight while the other computes (torch
  and gloo let go of the GIL in their heavy ops and waits). The two parts
  touch different microbatches' values and only the backward accumulates
  gradients; the forward's all-to-alls go over one ep group and the
  backward's over another (:mod:`real.moe`), so ep peers, running the same
  program, see the same sequence on each. The global CPU generator is the
  forward's alone (a backward draws no random numbers). An error in the
  thread is raised here, after the backward; a thread not done within the
  timeout is an error too. A traced step shows each part on a stream of its
  own (``pair-forward``, ``pair-backward``) under the pair's compute row;
* all-to-alls of expert parallelism, when traced (:meth:`Executor.exchanged`):
  a row each on ``all-to-all-forward`` or ``all-to-all-backward``, named by
  phase and by the part that ran it (``1DISPATCH3``, ``2COMBINE_GRAD1``);
* SEND/RECV: :class:`real.p2p.PipeComm`. Between neighbouring stages on the
  same rank the value passes in memory, as a message would (detached, so
  each stage has its own autograd graph).

Every stage boundary is a leaf that requires grad: a backward leaves the
gradient of its input in ``.grad``, exactly the value the previous stage's
backward needs.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field

import torch
from torch import nn

from real.backward import WeightWork, backward_full, backward_input, backward_weight
from real.measure import ActivationMeter, Recorder, Span
from real.models import loss_fn
from real.p2p import PipeComm
from schedules import Action, Kind, Task, TaskGraph
from schedules.timing import recomputed_keys

__all__ = ["Executor", "Stage"]

Key = tuple[int, int]  # (stage, microbatch)
_FORWARD_KINDS = frozenset({Kind.F, Kind.R})  # the parts of the forward stream; B, I and W: the backward's


class Stage(nn.Module):
    """Layers ``first .. first+len(layers)-1`` of the model: one pipeline stage."""

    def __init__(self, index: int, first: int, layers: Sequence[nn.Module], *, is_last: bool) -> None:
        super().__init__()
        self.index, self.first, self.is_last = index, first, is_last
        self.layers = nn.ModuleList(layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x

    def global_parameters(self) -> list[tuple[str, nn.Parameter]]:
        """(name, parameter) with names as in the whole model's ``nn.Sequential`` ("3.qkv.weight")."""
        return [(f"{self.first + i}.{n}", p) for i, layer in enumerate(self.layers) for n, p in layer.named_parameters()]


@dataclass(eq=False)
class _Slot:
    """One (stage, microbatch) between its forward and the end of its backward."""

    inp: torch.Tensor | None  # the stage-boundary leaf whose .grad the backward leaves (None on stage 0)
    out: torch.Tensor | None
    weight: WeightWork | None = None
    source: torch.Tensor | None = None  # a recomputed forward's input, until its R
    rng: tuple[torch.Tensor, torch.Tensor | None] | None = None  # (CPU, CUDA) generator states at that forward


@dataclass(eq=False)
class _Step:
    batches: Sequence[tuple[torch.Tensor, torch.Tensor]]
    inputs: dict[Key, torch.Tensor] = field(default_factory=dict)  # stage inputs waiting for their F
    grads: dict[Key, torch.Tensor] = field(default_factory=dict)  # output gradients waiting for their backward
    outbox: dict[tuple[Kind, int, int], torch.Tensor] = field(default_factory=dict)  # values waiting for their SEND
    slots: dict[Key, _Slot] = field(default_factory=dict)
    loss: torch.Tensor | None = None


class Executor:
    """Runs pipeline rank ``pp_rank``'s program of ``graph`` once per step."""

    def __init__(
        self,
        graph: TaskGraph,
        pp_rank: int,
        stages: dict[int, Stage],
        *,
        comm: PipeComm | None,
        meter: ActivationMeter,
        recorder: Recorder,
        poll: Callable[[], None] = lambda: None,
        loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = loss_fn,
        autocast: Callable[[], AbstractContextManager] = nullcontext,
        message_dtypes: dict[int, torch.dtype] | None = None,
        around: tuple[Callable[[int], None], Callable[[int], None]] | None = None,
        overlap_timeout_s: float | None = None,
    ) -> None:
        """``loss(output, targets)`` of the last stage; ``autocast()`` wraps every forward; the output of
        stage ``s`` is cast to ``message_dtypes[s]`` (inside the graph, so its gradient comes back in that dtype);
        ``around = (before, after)`` are called with each compute task's id around it (ZeRO-3's gathers);
        ``overlap_timeout_s``: run an overlapped pair's two parts at once, waiting at most that long for the
        forward's thread (None: one after the other; see the module doc)."""
        self.graph, self.pp_rank, self.stages = graph, pp_rank, stages
        self.comm, self.meter, self.recorder, self._poll = comm, meter, recorder, poll
        self._loss, self._autocast, self._message_dtypes = loss, autocast, message_dtypes or {}
        self._before, self._after = around or (lambda tid: None, lambda tid: None)
        self._overlap_timeout_s = overlap_timeout_s
        self._running: dict[str, Action] = {}  # "forward" / "backward": the part running (all-to-alls' labels)
        self.here = set(graph.schedule.stages_of(pp_rank))
        self.last = graph.schedule.num_stages - 1
        self.num_microbatches = graph.schedule.num_microbatches
        self._params = {s: [p for _, p in st.global_parameters()] for s, st in stages.items()}
        self.recomputed = recomputed_keys(graph.schedule.programs)
        self._compute: dict[Kind, Callable[[Action, _Step], None]] = {
            Kind.F: self._forward, Kind.B: self._backward, Kind.I: self._backward, Kind.W: self._weight,
            Kind.R: self._recompute,
        }
        if any(graph.tasks[t].action.is_comm for t in graph.programs[pp_rank]) and comm is None:
            raise ValueError(f"pipeline rank {pp_rank} has sends/receives in its program but no communicator")

    def run_step(self, batches: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor | None:
        """Run the program once; returns the sum of this rank's microbatch losses (last stage) or None."""
        step = _Step(batches)
        if self.comm is not None:
            self.comm.start_step()
        rec, tasks = self.recorder, self.graph.tasks
        for tid in self.graph.programs[self.pp_rank]:
            task = tasks[tid]
            kind = task.action.kind
            start = rec.stamp()
            if kind in (Kind.SEND_F, Kind.SEND_B):
                value = step.outbox.pop((kind, task.action.stage, task.action.microbatch))
                self.comm.send(task, value, rec.add(tid, start, None, value.numel() * value.element_size()))
                continue
            if kind in (Kind.RECV_F, Kind.RECV_B):
                nbytes = self._receive(task, step)
            else:
                self._before(tid)
                start = rec.stamp()  # a gather waited for is not the task's time
                if kind is Kind.OVERLAP_F_B and self._overlap_timeout_s is not None:
                    self._overlapped(task.action, step)
                else:
                    for part in task.action.parts():
                        self._run(part, step)
                self._after(tid)
                nbytes = 0
                self._poll()
                if self.comm is not None:
                    self.comm.sends.poll()
            rec.add(tid, start, rec.stamp(), nbytes)
        if self.comm is not None:
            self.comm.finish_step()
        self._check_done(step)
        return step.loss

    def _run(self, part: Action, step: _Step) -> None:
        self._running["forward" if part.kind in _FORWARD_KINDS else "backward"] = part
        self._compute[part.kind](part, step)

    def _timed(self, part: Action, step: _Step) -> None:
        """One part of an overlapped pair, with its row on its stream's track."""
        rec = self.recorder
        start = rec.stamp()
        self._run(part, step)
        stream = "pair-forward" if part.kind in _FORWARD_KINDS else "pair-backward"
        rec.add(Span(stream, str(part), part.kind.value, part.stage, part.microbatch), start, rec.stamp(), 0)

    def _overlapped(self, pair: Action, step: _Step) -> None:
        """OVERLAP_F_B with overlap: the forward in a thread, the backward here, at once (see the module doc)."""
        fwd, bwd = sorted(pair.parts(), key=lambda a: a.kind not in _FORWARD_KINDS)
        failed: list[BaseException] = []

        def forward() -> None:
            try:
                self._timed(fwd, step)
            except BaseException as exc:  # raised in the calling thread, below
                failed.append(exc)

        thread = threading.Thread(target=forward, name=f"pipeline rank {self.pp_rank} {fwd}", daemon=True)
        thread.start()
        try:
            self._timed(bwd, step)
        finally:
            thread.join(self._overlap_timeout_s)
        if thread.is_alive():
            raise RuntimeError(f"pipeline rank {self.pp_rank}: the forward {fwd} of {pair} did not end within "
                               f"{self._overlap_timeout_s:g} s of its backward; a peer may have died (raise "
                               "timeout_s if it is only slow)")
        if failed:
            raise failed[0]

    def exchanged(self, phase: str, start: object, end: object, nbytes: int) -> None:
        """An all-to-all of ``phase`` (:class:`real.moe.ExpertGroup`'s watch) ran: a row on its stream, named
        after the part of that stream running now."""
        if not self.recorder.enabled:
            return
        which = "backward" if phase.endswith("_grad") else "forward"
        part = self._running[which]
        name = f"{part.stage}{phase.upper()}{part.microbatch}"
        self.recorder.add(Span(f"all-to-all-{which}", name, "ALL_TO_ALL", part.stage, part.microbatch), start, end,
                          nbytes)

    def _receive(self, task: Task, step: _Step) -> int:
        value = self.comm.recv(task)
        key = (task.action.stage, task.action.microbatch)
        if task.action.kind is Kind.RECV_F:
            step.inputs[key] = value.requires_grad_()
        else:
            step.grads[key] = value
        return value.numel() * value.element_size()

    def _run_stage(self, s: int, mb: int, inp: torch.Tensor, step: _Step) -> torch.Tensor:
        """The stage's output (in its message dtype), or on the last stage its share of the loss; under autocast."""
        with self._autocast():
            out = self.stages[s](inp)
            if s == self.last:
                out = self._loss(out, step.batches[mb][1]) / self.num_microbatches
            elif s in self._message_dtypes and out.dtype != self._message_dtypes[s]:
                out = out.to(self._message_dtypes[s])
        return out

    def _forward(self, a: Action, step: _Step) -> None:
        s, mb = a.stage, a.microbatch
        inp = step.batches[mb][0] if s == 0 else step.inputs.pop((s, mb))
        if (s, mb) in self.recomputed:
            self.meter.hold((s, mb), inp)
            rng = (torch.get_rng_state(), torch.cuda.get_rng_state(inp.device) if inp.is_cuda else None)
            with torch.no_grad():
                out = self._run_stage(s, mb, inp, step)
            slot = _Slot(inp if s > 0 else None, None, source=inp, rng=rng)
        else:
            with self.meter.saving((s, mb)):
                out = self._run_stage(s, mb, inp, step)
            slot = _Slot(inp if s > 0 else None, out)
        if s == self.last:
            step.loss = out.detach() if step.loss is None else step.loss + out.detach()
        elif s + 1 in self.here:
            step.inputs[(s + 1, mb)] = out.detach().requires_grad_()
        else:
            step.outbox[(Kind.SEND_F, s, mb)] = out.detach()
        step.slots[(s, mb)] = slot

    def _recompute(self, a: Action, step: _Step) -> None:
        """R: the forward again, from the kept input and random state, with grad (what the backward needs)."""
        s, mb = a.stage, a.microbatch
        slot = step.slots[(s, mb)]
        cpu, cuda = slot.rng
        device = slot.source.device
        with torch.random.fork_rng(devices=[device] if cuda is not None else [], device_type=device.type):
            torch.set_rng_state(cpu)
            if cuda is not None:
                torch.cuda.set_rng_state(cuda, device)
            with torch.enable_grad(), self.meter.saving((s, mb)):
                slot.out = self._run_stage(s, mb, slot.source, step)
        slot.source = slot.rng = None

    def _backward(self, a: Action, step: _Step) -> None:
        """B or I: the input gradient goes on to stage s-1 (in memory or by a send)."""
        s, mb = a.stage, a.microbatch
        slot = step.slots[(s, mb)]
        grad = None if s == self.last else step.grads.pop((s, mb))
        if a.kind is Kind.B:
            backward_full(slot.out, grad)
            dinp = slot.inp.grad if slot.inp is not None else None
            self._release(step, s, mb)
        else:
            dinp, slot.weight = backward_input(slot.out, grad, slot.inp, self._params[s])
            slot.out = slot.inp = None  # W starts from the intermediates; the rest of the graph may go
        if s > 0:
            if s - 1 in self.here:
                step.grads[(s - 1, mb)] = dinp
            else:
                step.outbox[(Kind.SEND_B, s, mb)] = dinp

    def _weight(self, a: Action, step: _Step) -> None:
        slot = step.slots[(a.stage, a.microbatch)]
        backward_weight(slot.weight)
        self._release(step, a.stage, a.microbatch)

    def _release(self, step: _Step, s: int, mb: int) -> None:
        del step.slots[(s, mb)]
        self.meter.release((s, mb))

    def _check_done(self, step: _Step) -> None:
        left = {name: sorted(d) for name, d in (("inputs", step.inputs), ("gradients", step.grads),
                                                ("unsent values", step.outbox), ("unfinished passes", step.slots)) if d}
        if left:
            raise RuntimeError(f"pipeline rank {self.pp_rank}: the step ended with work left over: {left}")
