"""Hostile hardening cases: data loss, runaway searches, the planner's answers, paths, the scripts' flags.

:func:`cases` makes, under ``d / "hard"``, the files the cases point at (a token file, a tokenizer sidecar that is
a directory, fifos, a symbolic link to ``/dev/null``, folders in the way of one file of a set) and returns the
cases (:class:`analysis.hostile.Case`) of the groups ``data loss``, ``runaway``, ``planner answers``, ``paths``
and ``scripts``; each gives its exact one-line message and the files it must leave as they were (a device stays a
device). ``experiments/hostile_inputs.py`` runs them as subprocesses, ``tests/test_hostile_outputs.py`` in-process
(but the scripts' cases, which it runs as a user does). The table lives in the library, beside
:mod:`analysis.hostile_paths`, :mod:`analysis.hostile_parse` and :mod:`analysis.hostile_procs`, so that the
experiment and the tests share it without one script importing another.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from analysis.hostile import Case

__all__ = ["EXPERIMENTS", "PROFILE", "PY", "REAL", "SCHEDLAB", "SHAPE", "SIM", "SMALL", "cases"]

PY = sys.executable
SIM = [PY, "-m", "sim"]
SCHEDLAB = [PY, "-m", "analysis"]
REAL = [PY, "-m", "real"]
PROFILE = [PY, "-m", "real.profile"]
SHAPE = ["--schedule", "1f1b", "--pp", "4", "--microbatches", "8"]
SMALL = ["--layers", "2", "--dim", "16", "--heads", "2", "--vocab", "32", "--seq", "8"]
#: The repository's experiments folder (the scripts' cases run its scripts).
EXPERIMENTS = Path(__file__).resolve().parents[1] / "experiments"
PLAN = [*SCHEDLAB, "plan", "--model", "gpt-tiny", "--cluster", "dgx-h100:1", "--workers", "1"]
UNITS = ["--model", "gpt-6.2b", "--pp", "8", "--schedule", "1f1b", "--microbatches", "8"]


def _hardening_files(h: Path) -> None:
    h.mkdir()
    (h / "corpus.txt").write_text("hello world\n")
    (h / "a.json").write_text('{"mine": 1}')
    (h / "tok").write_bytes(b"old tokens")
    (h / "tok.json").mkdir()  # a sidecar that cannot be written
    (h / "s.csv").write_text("0F0,0F1,0B0,0B1\n1F0,1F1,1B0,1B1\n")
    for name in ("fifo.json", "fifo.png"):
        os.mkfifo(h / name)
    (h / "null.csv").symlink_to("/dev/null")
    (h / "home").mkdir()
    (h / "home" / "notes.txt").write_text("mine")
    (h / "rep" / "traces").mkdir(parents=True)
    (h / "rep" / "traces" / "gpipe.csv").write_text("a trace")
    (h / "cmp" / "comparison.csv").mkdir(parents=True)  # a folder in the way of one file of a set
    (h / "pl" / "pareto.png").mkdir(parents=True)


def cases(d: Path) -> list[Case]:
    from common.errors import quote

    h = d / "hard"
    _hardening_files(h)
    cases: list[Case] = []

    def add(group: str, argv: list, message: str | None, keep: tuple = (), expect: str = "error") -> None:
        cases.append(Case(group, tuple(map(str, argv)), expect, None, message, tuple(map(str, keep))))

    def q(path: Path | str) -> str:
        return quote(str(path))

    def never(what: str, path: Path | str, kind: str) -> str:
        return f"{what} {q(path)} is {kind}, not a regular file; it is never replaced: give a file name"

    def same(a: str, b: str, path: Path) -> str:
        return f"{a} and {b} name the same file {q(path)}; one would overwrite the other: give each output its own name"

    def destroys(out: str, path: Path, source: str) -> str:
        return f"{out} {q(path)} is also an input ({source}); writing it would destroy the input: give the output " \
               "another name"

    def too_long(what: str, path: Path, name: str, size: int) -> str:
        return f"{what} {q(path)}: the name {q(name)} is {size} bytes; the file system allows 255: give a shorter name"

    prep, null, one = [PY, "-m", "real.data", "prepare", "--input"], "/dev/null", [
        *REAL, "--schedule", "gpipe", "--pp", "1", "--microbatches", "2", "--steps", "1", *SMALL]
    corpus, side, tok, sched, rep = h / "corpus.txt", h / "a.json", h / "tok", h / "s.csv", h / "rep"
    add("data loss", [*prep, corpus, "--out", corpus], destroys("token file", corpus, "input #1"), (corpus,))
    add("data loss", [*prep, side, "--out", h / "a"], destroys("token file sidecar", side, "input #1"), (side,))
    add("data loss", [*prep, corpus, "--out", null], never("token file", null, "a character device"), (null,))
    add("data loss", [*prep, corpus, "--out", tok], f"token file sidecar {q(h / 'tok.json')} is a directory; give a "
        "file name", (tok,))
    add("data loss", [*SIM, *SHAPE, "--trace", h / "null.csv"], never("trace file", h / "null.csv",
                                                                      "a character device"), (null,))
    add("data loss", [*SIM, *SHAPE, "--export-csv", h / "null.csv"], never("torch CSV file", h / "null.csv",
                                                                           "a character device"), (null,))
    add("data loss", [*SIM, *SHAPE, "--plot", h / "fifo.png"], never("figure file", h / "fifo.png", "a fifo"),
        (h / "fifo.png",))
    add("data loss", [*SCHEDLAB, "perfetto", sched, h / "fifo.json"], never("chrome trace file", h / "fifo.json",
                                                                            "a fifo"), (h / "fifo.json", sched))
    add("data loss", [*SIM, *SHAPE, "--trace", h / "t.csv", "--export-csv", h / "t.csv"],
        same("--trace", "--export-csv", h / "t.csv"))
    add("data loss", [*SIM, "--schedule", f"csv:{sched}", "--trace", sched], destroys("--trace", sched, "--schedule"),
        (sched,))
    add("data loss", [*one, "--trace", h / "p.csv", "--save-params", h / "p.csv"],
        same("--trace", "--save-params", h / "p.csv"))
    add("data loss", [*one, "--save-params", null], never("parameter file", null, "a character device"), (null,))
    add("data loss", [*SCHEDLAB, "report", "--schedules", "gpipe", "--out", h / "home"],
        f"report folder {q(h / 'home')} holds files this command does not write; it replaces the folder as a "
        "whole: give a new or empty folder", (h / "home" / "notes.txt",))
    add("data loss", [*SCHEDLAB, "report", "--schedules", "gpipe", "--out", rep, "--real", rep / "traces" / "gpipe.csv"],
        f"the input --real #1 {q(rep / 'traces' / 'gpipe.csv')} lies in --out {q(rep)}, which is replaced as a "
        "whole: move the input out, or give another folder", (rep / "traces" / "gpipe.csv",))
    for argv, target in (([*SCHEDLAB, "compare", "--pp", "2", "--microbatches", "2", "--out", h / "cmp"],
                          h / "cmp" / "comparison.csv"),
                         ([*PLAN, "--global-batch", "8", "--out", h / "pl"], h / "pl" / "pareto.png")):
        add("data loss", argv, f"output file {q(target)} is a directory; give a file name", (target,))

    fits = "raise memory_limit, add nodes or give smaller microbatch sizes (flag --memory-limit)"
    add("runaway", [*PLAN, "--global-batch", "100000000", "--out", h / "plan1"], None, expect="ok")
    add("runaway", [*PLAN, "--global-batch", "1000000000", "--out", h / "plan2"],
        "plan: no configuration fits in 85.5 GB per device: model states and one microbatch fit (16.39 GB at least), "
        f"the microbatches each schedule holds in flight do not; {fits}")
    add("runaway", [*PLAN, "--global-batch", str(2**40), "--out", h / "plan3"],
        "plan: no configuration fits in 85.5 GB per device: the smallest needs at least 1.759e+04 GB (model states and one "
        f"microbatch); {fits}")
    add("runaway", [*PLAN, "--global-batch", str(2**40 + 1), "--out", h / "plan4"],
        "plan: global_batch 1,099,511,627,777 is beyond 1,099,511,627,776 (2^40) sequences; give a smaller batch "
        "(flag --global-batch)")
    huge = "cluster 'dgx-h100:100000000' would hold 800,000,000 devices; at most 1,048,576 (2^20) are supported: " \
           "give fewer nodes (flag --cluster)"
    add("runaway", [*SIM, *UNITS, "--cluster", "dgx-h100:100000000"], huge)
    add("runaway", [*PLAN[:-6], "--model", "gpt-tiny", "--cluster", "dgx-h100:100000000", "--global-batch", "8",
                    "--out", h / "plan5"], huge)

    add("planner answers", [*PLAN, "--global-batch", "7", "--microbatch-sizes", "2", "--out", h / "plan6"],
        "plan: no microbatch size of [2] divides the batch per replica ([7]) (flag --microbatch-sizes)")
    # chunks [1] leave interleaved-1f1b no pp > 1 layout, but pp 1 runs no pipeline schedule: an answer at pp 1
    add("planner answers", [*PLAN, "--global-batch", "8", "--schedules", "interleaved-1f1b", "--chunks", "1", "--out",
                            h / "plan7"], None, expect="ok")
    for extra in (["--dp-modes", "DDP"], ["--schedules", "1f1b,1F1B", "--microbatch-sizes", "1,1", "--dp-modes",
                                          "ddp,DDP", "--json"]):
        add("planner answers", [*PLAN, "--global-batch", "8", *extra, "--out", h / "plan8"], None, expect="ok")
    add("planner answers", [*PLAN[:-6], "--model", "GPT-TINY", "--cluster", "DGX-H100:1", "--global-batch", "8",
                            "--workers", "1", "--out", h / "plan9"], None, expect="ok")
    add("planner answers", [*PROFILE, *SMALL, "--out", h / "p.json", "--microbatch-size", "0"],
        "profile: microbatch_size must be an integer >= 1, got 0 (flag --microbatch-size)")
    add("planner answers", [*PROFILE, *SMALL, "--out", h / "p.json", "--batch-size", "1", "--microbatches", "2"],
        "batch_size 1 does not split into microbatches x dp = 2 x 1 equal microbatches of at least one sample; give "
        "a multiple of 2 (flag --batch-size)")

    name256, name252 = "n" * 252 + ".csv", "t" * 252
    deep = h.joinpath(*["p" * 200] * 21, "t.csv")
    add("paths", [*SIM, *SHAPE, "--trace", h / name256], too_long("trace file", h / name256, name256, 256))
    add("paths", [*SIM, *SHAPE, "--trace", deep],
        f"trace file {q(deep)}: the path is {len(str(deep))} bytes; the file system allows 4095: give a shorter path")
    add("paths", [*SIM, *SHAPE, "--trace", h / ("a" * 250 + ".csv"), "--json"], None, expect="ok")
    add("paths", [*prep, corpus, "--out", h / name252], too_long("token file sidecar", h / (name252 + ".json"),
                                                                 name252 + ".json", 257), (corpus,))
    add("paths", [*SCHEDLAB, "compare", "--pp", "2", "--microbatches", "2", "--out", h / name256],
        too_long("output folder", h / name256, name256, 256))
    add("paths", [*SCHEDLAB, "perfetto", h / name256], f"file name too long: {q(h / name256)}")

    script = [PY]
    for argv, message in (
            (["validate_sim.py", "--microbatch-size", "0"], "argument --microbatch-size: invalid value '0': give an "
                                                            "integer >= 1"),
            (["validate_sim.py", "--schedules", "1f1b,nope"], "argument --schedules: unknown schedule 'nope'; valid: "
                                                              "1f1b, combined-1f1b, dualpipe-v, gpipe, interleaved-1f1b, "
                                                              "interleaved-zb, looped-bfs, v-half, v-min, zb-auto, "
                                                              "zb-h1, zb-h2, zb-v, or your own as FILE.py:NAME"),
            (["validate_sim.py", "--calibrate-from", "zb-v", "--schedules", "1f1b"],
             "--calibrate-from 'zb-v' is not in the grid 1f1b; give one of them"),
            (["plan_check.py", "--calibrate-from", "1f1b"], "argument --calibrate-from: invalid value '1f1b': give "
                                                            "SCHEDULE:M, e.g. 1f1b:8"),
            (["plan_check.py", "--timeout", "-5"], "argument --timeout: invalid value '-5': give a finite number > 0"),
            (["goodput.py", "--trials", "0"], "argument --trials: invalid value '0': give an integer >= 1"),
            (["recompute_tradeoff.py", "--pp", "x"], "argument --pp: invalid value 'x': give an integer >= 1"),
            (["zb_table5.py", "--time-limit", "nan"], "argument --time-limit: invalid value 'nan': give a finite "
                                                      "number >= 0")):
        add("scripts", [*script, EXPERIMENTS / argv[0], *argv[1:]],
            f"python experiments/{argv[0]}: {message} (see --help)")
    return cases
