"""Interop with torch.distributed.pipelining: CSV both ways through torch's own loader, torch's own orders, the CLI.

Documented torch bug (2.13.0), not copied: ``Schedule1F1B._get_pipeline_order``
gives the last rank (no warm-up forwards) the forwards of microbatches 1..m
instead of 0..m-1 -- ``forward_mb`` starts at 0 and is incremented before its
first use -- so its order runs B0 before any F0 and F<m> does not exist. Every
other rank's order equals our ``1f1b``; ``test_torch_1f1b_order_is_invalid``
asserts the exact failures (ours and torch's own ``_validate_schedule``).
"""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import run_sim

import schedules
from schedules import (
    Action,
    Kind,
    OutputError,
    Schedule,
    ScheduleError,
    build,
    from_torch,
    load_graph,
    load_schedule,
    lower,
    read_torch_csv,
    read_torch_csv_graph,
    spec,
    torch_schedule_names,
    validate,
    write_torch_csv,
)
from sim import UniformCosts, simulate

ROOT = Path(__file__).resolve().parents[1]
_FIXTURE_NAME = "dualpipev_4rank_10mb.csv"
FIXTURE = next(
    (p for p in (ROOT / "tests" / "fixtures" / "torch" / _FIXTURE_NAME, ROOT.parent / "shared" / "fixtures" / "torch" /
                 _FIXTURE_NAME) if p.is_file()),
    None,
)
TORCH_CLASSES = ["1F1B", "DualPipeV", "GPipe", "Interleaved1F1B", "InterleavedZeroBubble", "LoopedBFS", "ZBVZeroBubble"]
OURS_TO_TORCH = {
    "gpipe": "GPipe",
    "1f1b": "1F1B",
    "interleaved-1f1b": "Interleaved1F1B",
    "looped-bfs": "LoopedBFS",
    "interleaved-zb": "InterleavedZeroBubble",
    "zb-v": "ZBVZeroBubble",
    "dualpipe-v": "DualPipeV",
}
ROUND_TRIP_SIZES = [(2, 4), (3, 6), (4, 8)]
ORDER_SIZES = [(1, 4), (2, 2), (2, 4), (2, 8), (3, 6), (3, 7), (4, 4), (4, 5), (4, 8), (4, 12), (8, 16)]


# ---------------------------------------------------------------- helpers


@pytest.fixture
def ts():
    """torch.distributed.pipelining.schedules; the test is skipped without torch."""
    pytest.importorskip("torch")
    from torch.distributed.pipelining import schedules as torch_schedules

    return torch_schedules


def _mock_stages(pp: int, chunks: int):
    from unittest import mock

    from torch.distributed.pipelining.stage import PipelineStage

    stage = mock.create_autospec(PipelineStage, instance=True)
    stage.group_rank, stage.group_size, stage.submod, stage.num_stages = 0, pp, None, pp * chunks
    return stage


def torch_runtime(ts, pp: int, chunks: int, microbatches: int):
    """A mock-staged _PipelineScheduleRuntime, as torch's _schedule_visualizer builds one."""
    return ts._PipelineScheduleRuntime([_mock_stages(pp, chunks)] * chunks, microbatches)


def torch_instance(ts, cls_name: str, pp: int, microbatches: int, chunks: int = 2):
    cls = ts.get_schedule_class(cls_name)
    if issubclass(cls, ts.PipelineScheduleSingle):
        return cls(_mock_stages(pp, 1), microbatches)
    return cls([_mock_stages(pp, chunks)] * chunks, microbatches)


def ours(order) -> list[list[Action]]:
    """torch actions (None padding dropped) as ours."""
    return [[Action.parse(str(a)) for a in row if a is not None] for row in order]


def registered_builds(name: str, sizes=ROUND_TRIP_SIZES) -> list[Schedule]:
    built = []
    for pp, m in sizes:
        try:
            v = spec(name).chunks_for(pp)
            built.append(build(name, pp=pp, microbatches=m, chunks=v))
        except ScheduleError:
            continue
    assert built, f"{name} builds at none of {sizes}"
    return built


def asap_makespan(s: Schedule, tf: float = 1, tb: float = 1, tw: float = 1) -> float:
    """Independent of lower()/simulate(): every compute action starts when its rank is free and its inputs exist.

    Each rank runs its program in order; F(s, mb) needs F(s-1, mb), I/B(s, mb) needs F(s, mb) and the
    backward of (s+1, mb), W(s, mb) needs I(s, mb); no message delay. A chunk's pass costs 1/v of the
    rank's; an overlapped pair costs the sum of its two passes.
    """
    cost = {Kind.F: tf, Kind.I: tb, Kind.W: tw, Kind.B: tb + tw}
    done: dict[tuple[str, int, int], float] = {}  # ("F" | "bwd" | "I", stage, mb) -> end time
    pos, free = [0] * s.num_ranks, [0.0] * s.num_ranks
    last = s.num_stages - 1
    while any(pos[r] < len(s.programs[r]) for r in range(s.num_ranks)):
        progressed = False
        for r, prog in enumerate(s.programs):
            if pos[r] == len(prog):
                continue
            needs = []
            for a in prog[pos[r]].parts():
                st, mb = a.stage, a.microbatch
                if a.kind is Kind.F and st > 0:
                    needs.append(("F", st - 1, mb))
                elif a.kind in (Kind.I, Kind.B):
                    needs += [("F", st, mb)] + ([("bwd", st + 1, mb)] if st < last else [])
                elif a.kind is Kind.W:
                    needs.append(("I", st, mb))
            if not all(n in done for n in needs):
                continue
            start = max([free[r], *(done[n] for n in needs)])
            free[r] = start + sum(cost[a.kind] for a in prog[pos[r]].parts()) / s.chunks
            for a in prog[pos[r]].parts():
                keys = {Kind.F: ["F"], Kind.I: ["I", "bwd"], Kind.B: ["bwd"], Kind.W: ["W"]}[a.kind]
                done.update({(k, a.stage, a.microbatch): free[r] for k in keys})
            pos[r] += 1
            progressed = True
        assert progressed, "deadlock"
    return max(free)


# ---------------------------------------------------------------- no torch needed


@pytest.mark.slow
@pytest.mark.timeout(60)  # a subprocess: a hang guard, with room for interpreter start-up on a loaded host
def test_schedules_import_and_csv_work_without_torch(tmp_path):
    code = f"""
import sys
sys.modules["torch"] = None  # any 'import torch' now fails
import schedules, sim
from schedules import ScheduleError, build, from_torch, read_torch_csv, write_torch_csv
s = build("1f1b", pp=2, microbatches=3)
assert read_torch_csv(write_torch_csv(s, {str(tmp_path / 'a.csv')!r})).programs == s.programs
for call in (lambda: from_torch("GPipe", 2, 4), lambda: schedules.load_schedule("torch:GPipe", pp=2, microbatches=4)):
    try:
        call()
    except ScheduleError as exc:
        print(exc)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=50).stdout
    lines = out.splitlines()
    assert len(lines) == 2
    assert all(ln.startswith("torch interop needs torch (pip install torch==2.13.0); import failed:") for ln in lines)


@pytest.mark.parametrize("name", schedules.names())
def test_csv_round_trip_without_torch(tmp_path, name):
    for s in registered_builds(name):
        path = write_torch_csv(s, tmp_path / "s.csv")
        assert path.read_text() == s.to_text()
        back = read_torch_csv(path)
        assert (back.programs, back.stage_to_rank, back.num_microbatches) == (s.programs, s.stage_to_rank,
                                                                              s.num_microbatches)
        graph = lower(s)
        comms = write_torch_csv(graph, tmp_path / "c.csv", comms=True)
        assert comms.read_text() == graph.to_text()
        assert read_torch_csv(comms).programs == s.programs  # the compute-only view drops SEND/RECV
        g2 = read_torch_csv_graph(comms)
        assert [g2.program_actions(r) for r in range(s.num_ranks)] == [graph.program_actions(r)
                                                                       for r in range(s.num_ranks)]


def test_write_is_atomic_and_checks_the_name_first(tmp_path):
    s = build("gpipe", pp=2, microbatches=2)
    target = tmp_path / "sub" / "s.csv"
    write_torch_csv(build("1f1b", pp=3, microbatches=3), target)
    write_torch_csv(s, target)  # replaces the whole file
    assert target.read_text() == "0F0,0F1,0B0,0B1\n1F0,1F1,1B0,1B1\n"
    assert sorted(p.name for p in target.parent.iterdir()) == ["s.csv"]  # no temp file left
    with pytest.raises(OutputError, match=r"^torch CSV file '.*s\.txt': use a name ending in \.csv$"):
        write_torch_csv(s, tmp_path / "s.txt")
    (tmp_path / "d.csv").mkdir()
    with pytest.raises(OutputError, match=r"'.*d\.csv' is a directory; give a file name ending in \.csv$"):
        write_torch_csv(s, tmp_path / "d.csv")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.csv", "sub"]


def test_graph_with_comms_written_compute_only(tmp_path):
    s = build("interleaved-1f1b", pp=2, microbatches=2)
    path = write_torch_csv(lower(s), tmp_path / "s.csv")  # comms=False: the graph's compute tasks only
    assert path.read_text() == s.to_text()
    assert write_torch_csv(s, tmp_path / "c.csv", comms=True).read_text() == lower(s).to_text()


def _bad(tmp_path, text: str) -> Path:
    path = tmp_path / "bad.csv"
    path.write_text(text)
    return path


@pytest.mark.parametrize(("text", "message"), [
    ("0F0,0X1,0B0\n", "row 1 (rank 0), cell 2 '0X1': invalid action '0X1': expected <stage><kind><microbatch> with "
                      "kind one of F, I, W, B, SEND_F, RECV_F, SEND_B, RECV_B, e.g. '2F0', '1I3', '0SEND_F1'; an "
                      "empty cell and UNSHARD/RESHARD/REDUCE_GRAD are skipped"),
    ("0F0,0B0\n1F0,1F\n", "row 2 (rank 1), cell 2 '1F': invalid action '1F': F needs a microbatch index, e.g. '1F0'"),
    ("0F0,0ALLREDUCE,0B0\n", "row 1 (rank 0), cell 2 '0ALLREDUCE': ALLREDUCE is not a pipeline action torch's CSV "
                             "holds; valid cells:"),
    ("(0F0;1F0)OVERLAP_F_B\n", "OVERLAP_F_B pairs one forward with one backward (B or I)"),
    ("0F0,0B0\n\n1F0,1B0\n", "row 2 (rank 1): no actions; every row is one rank's program (row i = rank i), "
                             "remove blank lines"),
    ("", "is empty; expected one row of actions per rank"),
    ("0F0,0B0\n0F1,0B1\n", "stage 0 appears on rank 0 and on rank 1 (0F1); a stage must live on exactly one rank"),
    ("0F0,0B0\n2F0,2B0\n", "no rank runs stage(s) [1]; stages must be numbered 0..2 without gaps"),
])
def test_malformed_csv_names_file_row_and_cell(tmp_path, text, message):
    path = _bad(tmp_path, text)
    with pytest.raises(ScheduleError) as info:
        read_torch_csv(path)
    assert str(info.value).startswith(f"torch CSV {str(path)!r}")
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_read_checks_flags_against_the_file(tmp_path):
    path = write_torch_csv(build("1f1b", pp=2, microbatches=3), tmp_path / "s.csv")
    assert read_torch_csv(path, pp=2, microbatches=3, name="x").name == "x"
    with pytest.raises(ScheduleError, match=r"has 2 rows \(ranks\) but pp=4 was given; use pp=2 or leave it out$"):
        read_torch_csv(path, pp=4)
    with pytest.raises(ScheduleError, match=r"runs microbatches 0..2 \(3\) but microbatches=8 was given; use 3"):
        read_torch_csv(path, microbatches=8)
    missing = tmp_path / "nope.csv"
    with pytest.raises(ScheduleError, match=rf"^torch CSV {str(missing)!r} not found; give an existing file"):
        read_torch_csv(missing)


def test_comm_cells_are_checked_in_the_graph_reader(tmp_path):
    path = _bad(tmp_path, "0F0,0SEND_F0,0RECV_B0,0B0\n1RECV_F0,1F0,1B0\n")  # rank 1 never sends 1SEND_B0
    assert read_torch_csv(path).programs == ((Action.parse("0F0"), Action.parse("0B0")),
                                             (Action.parse("1F0"), Action.parse("1B0")))
    with pytest.raises(ScheduleError, match=r"rank 0, action 0RECV_B0: is unmatched: rank 1 has no 1SEND_B0"):
        read_torch_csv_graph(path)


def test_load_schedule_resolves_names_and_files(tmp_path):
    assert load_schedule("gpipe", pp=2, microbatches=2).programs == build("gpipe", pp=2, microbatches=2).programs
    path = write_torch_csv(build("looped-bfs", pp=2, microbatches=3), tmp_path / "s.csv")
    s = load_schedule(f"csv:{path}")
    assert (s.name, s.num_ranks, s.num_microbatches, s.chunks) == (f"csv:{path}", 2, 3, 2)
    assert load_schedule(f"csv:{path}", pp=2, microbatches=3, chunks=2).programs == s.programs
    assert len(load_graph(f"csv:{path}").tasks) == len(lower(s).tasks)
    with pytest.raises(ScheduleError, match=r"has 2 stage\(s\) per rank \(4 stages on 2 ranks\) but chunks=3 was given"):
        load_schedule(f"csv:{path}", chunks=3)
    with pytest.raises(ScheduleError, match=r"^unknown schedule 'nope'; valid: .*, or your own as FILE.py:NAME; or torch:<ClassName>, csv:<FILE>$"):
        load_schedule("nope", pp=2, microbatches=2)
    with pytest.raises(ScheduleError, match=r"^schedule 'torch:GPipe' needs pp and microbatches; only csv: files"):
        load_schedule("torch:GPipe")
    with pytest.raises(ScheduleError, match=r"^schedule 'csv:': csv: needs a file, e.g. csv:run.csv$"):
        load_schedule("csv:")


# ---------------------------------------------------------------- through torch's own loader


@pytest.mark.parametrize("name", schedules.names())
def test_round_trip_through_torch_load_csv(ts, tmp_path, name):
    """ours -> CSV -> torch's _PipelineScheduleRuntime._load_csv -> ours: identical programs.

    Compute-only goes through torch's own validation and lowering (_validate_schedule,
    _add_send_recv); compute+comms must come back equal to lower(s).
    """
    for s in registered_builds(name):
        pp, m = s.num_ranks, s.num_microbatches
        runtime = torch_runtime(ts, pp, s.chunks, m)
        runtime._load_csv(str(write_torch_csv(s, tmp_path / "s.csv")))
        assert ours(runtime.pipeline_order[r] for r in range(pp)) == [list(p) for p in s.programs]
        assert [runtime.stage_index_to_group_rank[i] for i in range(s.num_stages)] == list(s.stage_to_rank)

        graph = lower(s)
        runtime = torch_runtime(ts, pp, s.chunks, m)
        runtime._load_csv(str(write_torch_csv(graph, tmp_path / "c.csv", comms=True)), format="compute_comms")
        assert ours(runtime.pipeline_order_with_comms[r] for r in range(pp)) == [graph.program_actions(r)
                                                                                 for r in range(pp)]


@pytest.mark.parametrize(("ours_name", "cls"), list(OURS_TO_TORCH.items()))
def test_our_order_equals_torchs(ts, ours_name, cls):
    if ours_name not in schedules.names():
        pytest.skip("not registered yet")
    compared = 0
    for pp, m in ORDER_SIZES:
        try:
            s = build(ours_name, pp=pp, microbatches=m, chunks=spec(ours_name).default_chunks)
            t = from_torch(cls, pp, m, s.chunks)
        except ScheduleError:
            continue  # one side does not take (pp, m)
        expected = [list(p) for p in s.programs]
        if cls == "1F1B":  # torch's documented last-rank bug (module docstring): F mb shifted by one
            expected[-1] = [Action(a.kind, a.stage, a.microbatch + (a.kind is Kind.F)) for a in expected[-1]]
        assert [list(p) for p in t.programs] == expected, (pp, m)
        assert t.stage_to_rank == s.stage_to_rank
        compared += 1
    assert compared >= 4


@pytest.mark.parametrize("pp", [1, 2, 4])
def test_torch_1f1b_order_is_invalid(ts, pp):
    m = 2 * pp
    s = from_torch("1F1B", pp, m)
    last = pp - 1
    assert [str(a) for a in s.programs[last]] == [f"{last}{k}{i + (k == 'F')}" for i in range(m) for k in "FB"]
    with pytest.raises(ScheduleError) as info:
        validate(s)
    assert str(info.value) == (f"schedule 'torch:1F1B', rank {last}, action {last}F{m}: microbatch {m} out of range, "
                               f"valid are 0..{m - 1}")
    with pytest.raises(AssertionError) as info:  # torch's own validator agrees
        ts._validate_schedule(torch_instance(ts, "1F1B", pp, m).pipeline_order, pp, pp, m)
    assert str(info.value).splitlines()[0] == (f"Rank {last}, step 1: Running Full Backward for stage {last}, "
                                               "microbatch 0 without first running Forward")


def test_torch_schedule_names_are_discovered(ts):
    assert torch_schedule_names() == TORCH_CLASSES


@pytest.mark.parametrize("cls", TORCH_CLASSES)
def test_every_torch_class_validates_and_simulates(ts, cls):
    """Each torch order at several sizes: valid, and simulated busy time is exactly the work (m(tf+tb+tw) a rank)."""
    single = cls in ("GPipe", "1F1B")
    sizes = [(pp, m, v) for pp, m in [(1, 4), (2, 4), (3, 6), (4, 8), (4, 16)]
             for v in ([1] if single else [2] if cls in ("ZBVZeroBubble", "DualPipeV") else [2, 3])]
    simulated = 0
    for pp, m, v in sizes:
        s = from_torch(cls, pp, m, v)
        assert (s.name, s.num_ranks, s.num_stages, s.num_microbatches) == (f"torch:{cls}", pp, pp * v, m)
        if cls == "1F1B":
            with pytest.raises(ScheduleError, match=rf"action {pp - 1}F{m}: microbatch {m} out of range"):
                validate(s)
            continue
        result = simulate(validate(s), UniformCosts())
        assert [r.busy for r in result.ranks] == pytest.approx([3.0 * m] * pp, abs=1e-9)
        assert result.makespan >= 3.0 * m - 1e-9
        assert result.makespan == pytest.approx(asap_makespan(s), abs=1e-9)
        simulated += 1
    assert simulated == (0 if cls == "1F1B" else len(sizes))


def test_torch_placements(ts):
    assert from_torch("ZBVZeroBubble", 4, 8).stage_to_rank == (0, 1, 2, 3, 3, 2, 1, 0)
    assert from_torch("DualPipeV", 3, 6).stage_to_rank == (0, 1, 2, 2, 1, 0)
    assert from_torch("LoopedBFS", 2, 2, chunks=3).stage_to_rank == (0, 1, 0, 1, 0, 1)
    assert from_torch("gpipe", 3, 2).stage_to_rank == (0, 1, 2)  # case-insensitive, as torch


@pytest.mark.parametrize(("args", "message"), [
    (("Nope", 2, 4), "unknown torch schedule class 'Nope'; valid: " + ", ".join(TORCH_CLASSES)),
    (("PipelineScheduleMulti", 2, 4), "torch class 'PipelineScheduleMulti' is a base class without a schedule of its "
                                      "own; valid: " + ", ".join(TORCH_CLASSES)),
    (("GPipe", 2, 4, 2), "torch:GPipe runs one stage per rank (chunks=1), got chunks=2"),
    (("LoopedBFS", 2, 4, 1), "torch:LoopedBFS is a multi-stage schedule, needs chunks (v) >= 2 stages per rank, got 1"),
    (("DualPipeV", 4, 4), "torch:DualPipeV rejects pp=4, microbatches=4, chunks=2: DualPipeV requires at least as "
                          "many microbatches as stages, but got 4 microbatches and 8 stages."),
    (("ZBVZeroBubble", 2, 4, 3), "torch:ZBVZeroBubble rejects pp=2, microbatches=4, chunks=3: ZBV requires exactly 2 "
                                 "stages per rank, but got 3."),
    (("GPipe", 0, 4), "pipeline: pp must be an integer >= 1, got 0"),
])
def test_from_torch_errors(ts, args, message):
    with pytest.raises(ScheduleError) as info:
        from_torch(*args)
    assert str(info.value) == message


@pytest.mark.parametrize("cls", ["Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV"])
def test_torch_dumps_read_back(ts, tmp_path, cls):
    """torch's own _dump_csv files: compute-only (None padding -> empty cells) equals from_torch; compute+comms
    (torch's SEND/RECV placement plus UNSHARD/RESHARD/REDUCE_GRAD) validates and simulates to the same step time
    as our lowering, with and without message delay."""
    instance = torch_instance(ts, cls, 4, 8)
    instance._dump_csv(str(tmp_path / "o.csv"), format="compute_only")
    instance._dump_csv(str(tmp_path / "c.csv"), format="compute_comms")
    s = from_torch(cls, 4, 8)
    assert read_torch_csv(tmp_path / "o.csv").programs == s.programs
    cells = (tmp_path / "c.csv").read_text()
    assert "REDUCE_GRAD" in cells and "UNSHARD" in cells and "RECV_F" in cells
    graph = validate(read_torch_csv_graph(tmp_path / "c.csv"))
    assert read_torch_csv(tmp_path / "c.csv").programs == s.programs
    for tcomm in (0.0, 0.25):
        costs = UniformCosts(tcomm=tcomm)
        assert simulate(graph, costs).makespan == pytest.approx(simulate(lower(s), costs).makespan, abs=1e-9)


def test_single_stage_torch_order_with_reduce_grad_reads(ts, tmp_path):
    """GPipe's pipeline_order carries REDUCE_GRAD; written the way torch's _dump_csv writes rows (csv.writer, \\r\\n)."""
    instance = torch_instance(ts, "GPipe", 3, 4)
    with open(tmp_path / "g.csv", "w", newline="") as fh:
        writer = csv.writer(fh)
        for rank in range(3):
            writer.writerow(instance.pipeline_order[rank])
    assert "REDUCE_GRAD" in (tmp_path / "g.csv").read_text()
    assert read_torch_csv(tmp_path / "g.csv").programs == build("gpipe", pp=3, microbatches=4).programs


# ---------------------------------------------------------------- the fixture torch's own tests wrote


@pytest.fixture
def fixture_csv() -> Path:
    if FIXTURE is None:
        pytest.skip(f"fixture {_FIXTURE_NAME} not found (tests/fixtures/torch/ or ../shared/fixtures/torch/)")
    return FIXTURE


def test_fixture_dualpipev_reads_validates_and_simulates(fixture_csv):
    """The DualPipeV file from torch's test artifacts: 4 ranks, 8 stages in a V, 10 microbatches.

    Expected figures at tf = tb = tw = 1, tcomm = 0 (v = 2, so a chunk's F, I, W cost 0.5 and B 1.0):
    busy time per rank = 2 stages x 10 microbatches x (0.5 + 1.0) = 30, by counting the work; the
    makespan, 33, is computed independently of lower()/simulate() by asap_makespan (every action
    starts when its rank is free and its inputs exist, in file order). Bubble = 1 - 4 x 30 / (4 x 33) = 1/11.
    """
    s = read_torch_csv(fixture_csv)
    assert (s.num_ranks, s.num_stages, s.num_microbatches, s.chunks) == (4, 8, 10, 2)
    assert s.stage_to_rank == (0, 1, 2, 3, 3, 2, 1, 0)
    work = {(p.kind, p.stage, p.microbatch) for prog in s.programs for a in prog for p in a.parts()}
    full = {(st, mb) for k, st, mb in work if k is Kind.B}
    split = {(st, mb) for k, st, mb in work if k is Kind.I}
    assert full and split and not full & split and len(full | split) == 80  # B for some work, I+W for the rest
    assert sum(a.kind is Kind.OVERLAP_F_B for prog in s.programs for a in prog) == 41  # grep -c OVERLAP_F_B: 41
    assert asap_makespan(s) == 33.0
    result = simulate(validate(s), UniformCosts())
    assert [r.busy for r in result.ranks] == [30.0] * 4
    assert result.makespan == 33.0
    assert result.bubble_ratio == pytest.approx(1 / 11, abs=1e-12)
    graph = validate(read_torch_csv_graph(fixture_csv))  # compute-only file: lowered
    assert simulate(graph, UniformCosts()).makespan == 33.0


def test_fixture_rewrites_byte_for_byte(fixture_csv, tmp_path):
    out = write_torch_csv(read_torch_csv(fixture_csv), tmp_path / "f.csv")
    assert out.read_bytes() == fixture_csv.read_bytes()


def test_fixture_is_torchs_dualpipev_and_its_loader_agrees(ts, fixture_csv):
    s = read_torch_csv(fixture_csv)
    assert s.programs == from_torch("DualPipeV", 4, 10).programs
    runtime = torch_runtime(ts, 4, 2, 10)
    runtime._load_csv(str(fixture_csv))
    assert ours(runtime.pipeline_order[r] for r in range(4)) == [list(p) for p in s.programs]


# ---------------------------------------------------------------- the command line


def test_cli_torch_schedule(ts, capsys):
    import json

    code, out, _ = run_sim(capsys, "--schedule", "torch:GPipe", "--pp", "4", "--microbatches", "8", "--json")
    d = json.loads(out)
    assert code == 0 and (d["schedule"], d["pp"], d["chunks"], d["makespan"]) == ("torch:GPipe", 4, 1, 33.0)
    code, out, _ = run_sim(capsys, "--schedule", "torch:ZBVZeroBubble", "--pp", "4", "--microbatches", "8", "--json")
    assert code == 0 and json.loads(out)["makespan"] == 25.5


def test_cli_torch_1f1b_is_rejected_before_writing(ts, capsys, tmp_path):
    code, out, err = run_sim(capsys, "--schedule", "torch:1F1B", "--pp", "4", "--microbatches", "8",
                             "--export-csv", str(tmp_path / "e.csv"), "--trace", str(tmp_path / "t.csv"))
    assert (code, out) == (2, "")
    assert err == "error: schedule 'torch:1F1B', rank 3, action 3F8: microbatch 8 out of range, valid are 0..7\n"
    assert list(tmp_path.iterdir()) == []


def test_cli_csv_schedule_infers_pp_and_microbatches(fixture_csv, capsys):
    import json

    code, out, _ = run_sim(capsys, "--schedule", f"csv:{fixture_csv}", "--json")
    d = json.loads(out)
    assert code == 0
    assert (d["pp"], d["microbatches"], d["chunks"], d["makespan"]) == (4, 10, 2, 33.0)
    assert d["bubble_ratio"] == pytest.approx(1 / 11, abs=1e-12)


def test_cli_export_csv(capsys, tmp_path):
    a, b = tmp_path / "a.csv", tmp_path / "sub" / "b.csv"
    code, out, _ = run_sim(capsys, "--schedule", "interleaved-1f1b", "--pp", "2", "--microbatches", "4",
                           "--export-csv", str(a), "--export-csv-comms", str(b))
    s = build("interleaved-1f1b", pp=2, microbatches=4)
    assert code == 0
    assert a.read_text() == s.to_text() and b.read_text() == lower(s).to_text()
    assert f"wrote torch CSV (compute only): {a}" in out and f"wrote torch CSV (compute+comms): {b}" in out
    for path in (a, b):  # both read back through csv: and simulate to the same step time
        code, out, _ = run_sim(capsys, "--schedule", f"csv:{path}", "--pp", "2", "--microbatches", "4", "--json")
        assert code == 0 and '"makespan": 13.5' in out


@pytest.mark.parametrize(("argv", "message"), [
    (["--schedule", "torch:Nope", "--pp", "2", "--microbatches", "4"],
     "error: unknown torch schedule class 'Nope'; valid: " + ", ".join(TORCH_CLASSES) + "\n"),
    (["--schedule", "torch:GPipe", "--microbatches", "4"],
     "error: python -m sim: the following arguments are required: --pp (see --help)\n"),
])
def test_cli_torch_errors(ts, capsys, tmp_path, argv, message):
    code, out, err = run_sim(capsys, *argv, "--export-csv", str(tmp_path / "e.csv"))
    assert (code, out, err) == (2, "", message)
    assert list(tmp_path.iterdir()) == []


def test_cli_csv_errors(capsys, tmp_path):
    good = write_torch_csv(build("1f1b", pp=2, microbatches=3), tmp_path / "in" / "good.csv")
    bad = _bad(tmp_path / "in", "0F0,0B0\n1F0,1Q0\n")
    out_dir = tmp_path / "out"
    cases = [
        ([f"csv:{tmp_path / 'missing.csv'}"], f"torch CSV {str(tmp_path / 'missing.csv')!r} not found; give an "
                                              "existing file (csv:PATH)"),
        ([f"csv:{bad}"], f"torch CSV {str(bad)!r}, row 2 (rank 1), cell 2 '1Q0': invalid action '1Q0'"),
        ([f"csv:{good}", "--pp", "4"], f"torch CSV {str(good)!r} has 2 rows (ranks) but pp=4 was given; use pp=2 or "
                                       "leave it out"),
        ([f"csv:{good}", "--microbatches", "4"], "runs microbatches 0..2 (3) but microbatches=4 was given"),
        ([f"csv:{good}", "--chunks", "2"], "has 1 stage(s) per rank (2 stages on 2 ranks) but chunks=2 was given"),
        (["gpipe", "--pp", "2", "--microbatches", "2", "--export-csv", str(out_dir / "x.txt")],
         "use a name ending in .csv"),
    ]
    for extra, message in cases:
        code, out, err = run_sim(capsys, "--schedule", *extra, "--export-csv-comms", str(out_dir / "e.csv"))
        assert (code, out) == (2, ""), extra
        assert err.startswith("error: ") and err.count("\n") == 1 and message in err, (extra, err)
    assert not out_dir.exists()
