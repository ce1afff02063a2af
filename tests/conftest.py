"""Shared helpers: which (pp, microbatches, chunks) each registered schedule accepts."""

from __future__ import annotations

import json
import os
import runpy
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

# One OpenMP thread per process, before anything imports torch: the in-process torch tests run tiny
# models, and on a small shared machine torch's default (a thread per core) makes them several times
# slower (several times, for the in-process test_real_* under load). real.launch does the same for torchrun.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import schedules

# Schedules that only accept a microbatch count that is a multiple of pp.
MB_MULTIPLE_OF_PP = {"interleaved-1f1b", "interleaved-zb", "combined-1f1b"}
# Schedules that need at least this many microbatches per pipeline rank.
MB_PER_RANK_AT_LEAST = {"dualpipe-v": 2}


def accepts(name: str, pp: int, microbatches: int) -> bool:
    """True if the schedule's generator accepts this shape (its documented constraints)."""
    if name in MB_MULTIPLE_OF_PP and microbatches % pp:
        return False
    return microbatches >= MB_PER_RANK_AT_LEAST.get(name, 0) * pp


def chunk_choices(name: str, multi: tuple[int, ...] = (2, 3)) -> tuple[int, ...]:
    """The chunks values to try: fixed for V schedules, ``multi`` for other multi-chunk ones (and for those that take
    any chunks: combined-1f1b, which needs v >= 2 when pp > 1), else 1."""
    sp = schedules.spec(name)
    if sp.fixed_chunks is not None:
        return (sp.fixed_chunks,)
    return multi if sp.takes_chunks else (1,)


# Every in-process gloo group a test made, kept alive until the worker exits. gloo completes futures on its
# own worker thread; a callback chain (torch's PowerSGD hook holds its state, which holds the group) can drop
# the group's last reference on that thread after wait() returned. The group's destructor then joins its own
# thread: "terminate called after throwing std::system_error: Resource deadlock avoided", which killed a
# pytest-xdist worker in CI (stop 31). A group referenced here is never destroyed on a gloo thread.
_GROUPS_KEPT: list = []


@pytest.fixture
def world_of_one():
    """A one-rank gloo group (HashStore) for in-process collective tests; destroyed as default, never freed."""
    from datetime import timedelta

    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1, timeout=timedelta(seconds=30))
    _GROUPS_KEPT.append(dist.group.WORLD)
    yield dist.group.WORLD
    dist.destroy_process_group()


def run_sim(capsys, *argv: str) -> tuple[int, str, str]:
    """``python -m sim ARGV`` in-process: (exit status, stdout, stderr)."""
    from analysis.cli.simulate import main

    return _run_main(main, capsys, argv)


def run_schedlab(capsys, *argv: str) -> tuple[int, str, str]:
    """``schedlab ARGV`` in-process: (exit status, stdout, stderr)."""
    from analysis.cli import main

    return _run_main(main, capsys, argv)


def _entry_points() -> dict[str, Any]:
    from analysis.cli import main as schedlab
    from analysis.cli.data import main as data
    from analysis.cli.profile import main as profile
    from analysis.cli.rounds import main as rounds
    from analysis.cli.simulate import main as sim
    from analysis.cli.train import main as real

    return {"sim": sim, "analysis": schedlab, "real": real, "real.data": data, "real.profile": profile,
            "real.rounds": rounds}


def run_case_in_process(argv: Sequence[str], capsys) -> tuple[int, str, str]:
    """A hostile case's command line (``PY -m MODULE ARGS`` or ``PY SCRIPT ARGS``) as its entry point runs it, in
    this process: (exit status, stdout, stderr)."""
    assert argv[0] == sys.executable, argv
    capsys.readouterr()
    if argv[1] == "-m":
        return _run_main(_entry_points()[argv[2]], capsys, argv[3:])
    old = sys.argv
    sys.argv = [argv[1], *argv[2:]]
    try:
        return _run_main(lambda _: runpy.run_path(argv[1], run_name="__main__") and 0, capsys, ())
    finally:
        sys.argv = old


def _run_main(main, capsys, argv) -> tuple[int, str, str]:
    try:
        code = main(list(argv))
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def launch_worker(script: str, nproc: int, payload: Any, tmp: Path, timeout: float) -> Any:
    """Run ``script`` (a test module's own ``__main__`` worker) under torchrun with ``payload`` as a JSON file and
    an output path; a hang or a failed launch fails the test with its stderr; returns what rank 0 ``torch.save``d."""
    import subprocess

    import torch

    from real.launch import torchrun

    cfg_file, out_file = tmp / f"runs{nproc}.json", tmp / f"out{nproc}.pt"
    cfg_file.write_text(json.dumps(payload))
    try:
        proc = torchrun(nproc, [script, str(cfg_file), str(out_file)], timeout=timeout, capture=True)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{nproc}-process launch hung (killed after {timeout}s); stderr:\n{(exc.stderr or '')[-4000:]}")
    if proc.returncode != 0:
        pytest.fail(f"{nproc}-process launch failed (exit {proc.returncode}); stderr:\n{proc.stderr[-6000:]}")
    return torch.load(out_file, weights_only=False)


def launch_self(script: str, nproc: int, out: Path, timeout: float) -> list[Any]:
    """Run ``script`` (a test module that is its own worker, given ``out``) under torchrun with one thread per
    process; a hang or a failed launch fails the test with its stderr; returns every rank's ``rank{r}.json`` from
    ``out``."""
    import subprocess

    from real.launch import torchrun

    try:
        proc = torchrun(nproc, [script, str(out)], timeout=timeout, capture=True, env={"OMP_NUM_THREADS": "1"})
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"launch hung; stderr:\n{(exc.stderr or '')[-4000:]}")
    assert proc.returncode == 0, proc.stderr[-6000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(nproc)]


@pytest.fixture
def tmp_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh temporary folder with a short name (``.../t<N>``), not pytest's ``.../<test name><N>``.

    Error messages quote a path cut at ``common.errors.MAX_QUOTE`` characters, and several tests compare
    such messages whole: under pytest-xdist (``make test`` runs two workers) the per-worker folder
    ``popen-gw<N>/`` makes pytest's own names longer, and these messages would be cut where they are not now.
    """
    return tmp_path_factory.mktemp("t")


RUN_CONFIGS_WORKER = Path(__file__).with_name("run_configs.py")


def launch_runs(runs: dict[str, Any], nproc: int, tmp: Path, timeout: float) -> dict[str, dict]:
    """Every labelled RunConfig of ``runs`` in one ``nproc``-process gloo launch (tests/run_configs.py): rank 0's
    ``{label: {"losses", "params", "start_step", "sha", "trace", "memory"}}``."""
    return launch_worker(str(RUN_CONFIGS_WORKER), nproc, {k: c.to_dict() for k, c in runs.items()}, tmp, timeout)


# The longest files first (their times in `make test` on 2 cores, 2026-12-02): with --dist loadfile a file runs on
# one worker, and a long file collected late runs alone at the end while the other worker idles.
LONGEST_FIRST = ("test_docs.py", "test_hostile_outputs.py", "test_real_fault.py", "test_real_equality.py",
                 "test_signals.py", "test_properties.py", "test_megatron.py", "test_dp_modes.py")


def pytest_collection_modifyitems(config, items) -> None:
    order = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: order.get(item.path.name, len(order)))  # stable: each file keeps its own order
