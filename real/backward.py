"""A stage's backward: full (B), or split into input gradient (I) and weight gradient (W).

I computes only the gradient of the stage input, which the previous stage is
waiting for, and W computes the parameter gradients later, from what I left
behind, without redoing I's work:

* the autograd graph from the stage output down to the stage input is the
  *input closure*: the nodes I must run. Where a path to a parameter leaves
  the closure, the closure node is an *intermediate* of that parameter;
* I runs ``torch.autograd.grad`` to the input with the graph kept, and a
  pre-hook on every intermediate captures the gradient arriving there;
* W runs ``torch.autograd.backward`` from those intermediates (as gradient
  edges) with ``inputs=`` the parameters, one call per group of parameters
  sharing intermediates. Parameters accumulate through their AccumulateGrad
  nodes, so ``register_post_accumulate_grad_hook`` fires as in a full backward.

This is the algorithm of torch.distributed.pipelining's ``stage_backward_input``
/ ``stage_backward_weight`` (groups merged with union-find here, so a
parameter is never in two groups). A stage whose input needs no gradient (the
first stage: token ids) has nothing for I to do; its W is the whole backward,
as in torch.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import torch
from torch.autograd.graph import GradientEdge, Node, get_gradient_edge

__all__ = ["WeightWork", "backward_full", "backward_input", "backward_weight"]


@dataclass(eq=False)
class _Group:
    """Parameters whose paths leave the input closure at the same intermediates."""

    intermediates: list[Node]
    params: list[torch.Tensor]
    grads: list[tuple[torch.Tensor | None, ...]] = field(default_factory=list)


@dataclass(eq=False)
class WeightWork:
    """What W needs after I: gradients at the intermediates per group, or the whole backward."""

    groups: list[_Group]
    full: tuple[torch.Tensor, torch.Tensor | None] | None = None  # (output, its gradient)


def backward_full(out: torch.Tensor, grad: torch.Tensor | None) -> None:
    """B: gradients of the input (a leaf: its ``.grad``) and of every parameter, in one pass."""
    torch.autograd.backward(out, grad)


def backward_input(
    out: torch.Tensor, grad: torch.Tensor | None, inp: torch.Tensor | None, params: Iterable[torch.Tensor]
) -> tuple[torch.Tensor | None, WeightWork]:
    """I: the gradient of ``inp`` only; returns it and the work W still has to do."""
    if inp is None or not inp.requires_grad or out.grad_fn is None:
        return None, WeightWork(groups=[], full=(out, grad))
    groups = _param_groups(out.grad_fn, get_gradient_edge(inp).node, params)
    if not groups:
        return torch.autograd.grad(out, inp, grad)[0], WeightWork(groups=[])
    captured: dict[Node, tuple[torch.Tensor | None, ...]] = {}
    handles = []
    for group in groups:
        for node in group.intermediates:
            handles.append(node.register_prehook(lambda grads, node=node: captured.__setitem__(node, grads)))
    try:
        (dinp,) = torch.autograd.grad(out, inp, grad, retain_graph=True)
    finally:
        for h in handles:
            h.remove()
    for group in groups:
        group.grads = [captured.get(n, ()) for n in group.intermediates]
    return dinp, WeightWork(groups=groups)


def backward_weight(work: WeightWork) -> None:
    """W: accumulate the parameter gradients that :func:`backward_input` left for later."""
    if work.full is not None:
        torch.autograd.backward(work.full[0], work.full[1])
        return
    for group in work.groups:
        edges, grads = [], []
        for node, node_grads in zip(group.intermediates, group.grads, strict=True):
            for i, g in enumerate(node_grads):
                if g is not None:
                    edges.append(GradientEdge(node, i))
                    grads.append(g)
        if not edges:
            continue
        # With several intermediates, one may lie below another: replace whatever flows into
        # each by the gradient I captured there, so nothing is counted twice.
        handles = []
        if len(group.intermediates) > 1:
            for node, node_grads in zip(group.intermediates, group.grads, strict=True):
                handles.append(node.register_prehook(lambda _g, saved=node_grads: saved))
        try:
            torch.autograd.backward(edges, grads, inputs=group.params, retain_graph=True)
        finally:
            for h in handles:
                h.remove()


def _children(node: Node) -> list[Node]:
    return [c for c, _ in node.next_functions if c is not None]


def _input_closure(root: Node, target: Node) -> dict[Node, None]:
    """Nodes from which ``target`` is reachable (ordered; dicts keep runs deterministic)."""
    reaches: dict[Node, bool] = {}
    stack: list[tuple[Node, bool]] = [(root, False)]
    while stack:
        node, expanded = stack.pop()
        if expanded:
            reaches[node] = node is target or any(reaches.get(c, False) for c in _children(node))
            continue
        if node in reaches:
            continue
        reaches[node] = False  # visiting; final value set on the way back
        stack.append((node, True))
        stack.extend((c, False) for c in reversed(_children(node)) if c not in reaches)
    return {n: None for n, r in reaches.items() if r}


def _params_below(start: Node, closure: dict[Node, None], wanted: dict[int, torch.Tensor],
                  memo: dict[Node, tuple[int, ...]]) -> tuple[int, ...]:
    """Ids of the parameters reachable from ``start`` (a node outside the closure), post-order DFS."""
    stack: list[tuple[Node, bool]] = [(start, False)]
    while stack:
        node, expanded = stack.pop()
        if expanded:
            found: dict[int, None] = {}
            var = getattr(node, "variable", None)
            if var is not None and id(var) in wanted:
                found[id(var)] = None
            for c in _children(node):
                found.update(dict.fromkeys(memo.get(c, ())))
            memo[node] = tuple(found)
        elif node not in memo:
            memo[node] = ()  # visiting; final value set on the way back
            stack.append((node, True))
            stack.extend((c, False) for c in reversed(_children(node)) if c not in closure and c not in memo)
    return memo[start]


def _param_groups(root: Node, input_node: Node, params: Iterable[torch.Tensor]) -> list[_Group]:
    """Parameter groups keyed by where their paths leave the input closure (union-find merge)."""
    closure = _input_closure(root, input_node)
    wanted = {id(p): p for p in params}
    memo: dict[Node, tuple[int, ...]] = {}
    parent: dict[int, int] = {}  # union-find over parameter ids

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    inter_params: dict[Node, list[int]] = {}
    for node in closure:
        hits: dict[int, None] = {}
        for c in _children(node):
            if c not in closure:
                hits.update(dict.fromkeys(_params_below(c, closure, wanted, memo)))
        if hits:
            ids = list(hits)
            inter_params[node] = ids
            for pid in ids:
                parent.setdefault(pid, pid)
            for pid in ids[1:]:
                parent[find(pid)] = find(ids[0])
    groups: dict[int, _Group] = {}
    for node, ids in inter_params.items():
        group = groups.setdefault(find(ids[0]), _Group(intermediates=[], params=[]))
        group.intermediates.append(node)
    for pid in parent:  # in discovery order
        group = groups[find(pid)]
        group.params.append(wanted[pid])
    return list(groups.values())
