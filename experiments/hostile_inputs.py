"""Try what a hostile new user would type, and count the outcomes.

    python experiments/hostile_inputs.py            # table of outcomes, then every case that went wrong
    python experiments/hostile_inputs.py --json     # exactly one JSON object
    python experiments/hostile_inputs.py --only names,outputs
    python experiments/hostile_inputs.py --markdown docs/results/hostile_inputs.md   # also the results page

Each case is one command run as a subprocess (as a user runs it), with a
timeout. Outcomes:

* ``clean error``: exit status 2 and exactly one line on stderr, starting ``error:``;
* ``ok``: exit status 0 (and, with ``--json``, stdout parses as strict JSON);
* ``traceback``: a Python traceback on stderr;
* ``hang``: no answer within the timeout;
* ``unclean``: any other failure (several lines, another status);
* ``wrong``: a clean result of the other kind than the case expects (an
  error for valid input, or valid output for input that must be refused),
  or a refusal with another message than the case's exact one;
* ``data lost``: a file the case keeps is changed, replaced or gone.

A case expects either a refusal or a result; the goal is every case as expected.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from analysis.hostile import Case, run_case
from analysis.hostile_parse import cases as parse_cases
from analysis.hostile_paths import cases as path_cases
from analysis.hostile_procs import cases as proc_cases

PY = sys.executable
SIM = [PY, "-m", "sim"]
SCHEDLAB = [PY, "-m", "analysis"]
REAL = [PY, "-m", "real"]
PROFILE = [PY, "-m", "real.profile"]
SHAPE = ["--schedule", "1f1b", "--pp", "4", "--microbatches", "8"]
SMALL = ["--layers", "2", "--dim", "16", "--heads", "2", "--vocab", "32", "--seq", "8"]


def _files(d: Path) -> dict[str, str]:
    """Bad (and good) input files the cases point at."""
    w = {}

    def put(name: str, data: str | bytes) -> str:
        p = d / name
        p.parent.mkdir(parents=True, exist_ok=True)
        (p.write_bytes if isinstance(data, bytes) else p.write_text)(data)
        w[name] = str(p)
        return str(p)

    put("good.csv", "0F0,0F1,0B0,0B1\n1F0,1F1,1B0,1B1\n")
    put("bom.csv", "\ufeff0F0,0F1,0B0,0B1\n1F0,1F1,1B0,1B1\n")
    put("binary.csv", bytes(range(256)) * 4)
    put("empty.csv", "")
    put("badcell.csv", "0F0,0X1\n1F0,1F1\n")
    put("missing.csv", "0F0,0B0\n1F0\n")
    put("deadlock.csv", "0B0,0F0\n1F0,1B0\n")
    put("twoplaces.csv", "0F0,1F0,0B0,1B0\n0F0,0B0\n")
    put("quoted.csv", '"0F0,0B0"\n1F0,1B0\n')
    put("dir.csv/keep", "")
    w["dir.csv"] = str(d / "dir.csv")
    header = '# schedlab-trace {"source": "real", "schedule": "1f1b", "params": {"pp": 2, "microbatches": 2, "chunks": 1}}\n'
    cols = "rank,stream,action,kind,stage,microbatch,start,end,bytes\n"
    row = "0,compute,0F0,F,0,0,0.0,1.0,0\n"
    put("trace_binary.csv", bytes(range(256)) * 8)
    put("trace_nonnumeric.csv", header + cols + "0,compute,0F0,F,0,0,abc,1.0,0\n")
    put("trace_cut.csv", header + cols + row + "1,compute,1F0,F,1,0,1.")
    put("trace_badheader.csv", "# schedlab-trace {not json\n" + cols + row)
    put("trace_endbeforestart.csv", header + cols + "0,compute,0F0,F,0,0,2.0,1.0,0\n")
    put("trace_missingcol.csv", header + "rank,stream,action\n0,compute,0F0\n")
    put("trace_empty.csv", "")
    put("trace_text.csv", "hello world\n")
    put("cfg_schedule_int.toml", '[model]\npreset = "gpt-6.2b"\n[cluster]\npreset = "dgx-h100"\n[parallel]\npp = 8\n'
                                 '[run]\nschedule = 5\nmicrobatches = 8\n')
    put("cfg_split_str.toml", '[model]\npreset = "gpt-6.2b"\n[cluster]\npreset = "dgx-h100"\n[parallel]\npp = 2\n'
                              '[run]\nschedule = "1f1b"\nmicrobatches = 8\nlayers_per_stage = "12,12"\n')
    put("cfg_bucket_str.toml", '[model]\npreset = "gpt-6.2b"\n[cluster]\npreset = "dgx-h100"\n'
                               '[parallel]\npp = 8\ndp = 2\ndp_mode = "ddp"\nbucket_mb = "x"\n'
                               '[run]\nschedule = "1f1b"\nmicrobatches = 8\n')
    put("cfg_layers_float.toml", '[model]\nlayers = 6.2\nhidden = 1024\nheads = 16\nvocab = 50000\nseq_len = 1024\n'
                                 '[cluster]\npreset = "dgx-h100"\n[parallel]\npp = 2\n[run]\nschedule = "1f1b"\n'
                                 'microbatches = 4\n')
    put("cfg_mb_float.toml", '[model]\npreset = "gpt-6.2b"\n[cluster]\npreset = "dgx-h100"\n[parallel]\npp = 8\n'
                             '[run]\nschedule = "1f1b"\nmicrobatches = 2.5\n')
    put("cfg_pp_bool.toml", '[model]\npreset = "gpt-6.2b"\n[cluster]\npreset = "dgx-h100"\n[parallel]\npp = true\n'
                            '[run]\nschedule = "1f1b"\nmicrobatches = 8\n')
    put("cfg_eff_str.toml", '[model]\npreset = "gpt-6.2b"\n[cluster]\npreset = "dgx-h100"\n[parallel]\npp = 8\n'
                            '[run]\nschedule = "1f1b"\nmicrobatches = 8\nefficiency = "high"\n')
    put("cfg_broken.toml", "[model\npreset = \n")
    put("cfg_unknown_table.toml", '[modle]\npreset = "gpt-6.2b"\n')
    put("cfg_unknown_key.toml", '[model]\npreset = "gpt-6.2b"\n[cluster]\npreset = "dgx-h100"\n[parallel]\npp = 8\n'
                                'ppp = 2\n[run]\nschedule = "1f1b"\nmicrobatches = 8\n')
    put("cfg_good.toml", '[model]\npreset = "gpt-6.2b"\n[cluster]\npreset = "dgx-h100"\n[parallel]\npp = 8\n'
                         '[run]\nschedule = "1f1b"\nmicrobatches = 8\n')
    stage = {"F": 0.01, "B": 0.02, "I": 0.012, "W": 0.01}
    base = {"schema": "schedlab.profile/1", "activation_bytes": 4096,
            "p2p": {"alpha": 1e-4, "beta": 1e8}, "task_overhead": 1e-4, "step_overhead": 1e-3}

    def profile(parts: list[dict], **over: object) -> str:
        return json.dumps({**base, "partitions": parts, **over})

    two = [{"num_stages": 2, "stages": [{"stage": 0, **stage}, {"stage": 1, **stage}]}]
    four = [{"num_stages": 4, "stages": [{"stage": s, **stage} for s in range(4)]}]
    put("cost_good.json", profile(two + four))
    put("cost_notjson.json", "{ not json")
    put("cost_schema.json", json.dumps({**json.loads(profile(two)), "schema": "other/9"}))
    put("cost_dupstage.json", profile([{"num_stages": 2, "stages": [{"stage": 0, **stage}, {"stage": 0, **stage}]}]))
    put("cost_range.json", profile([{"num_stages": 2, "stages": [{"stage": 0, **stage}, {"stage": 5, **stage}]}]))
    put("cost_nostage.json", profile([{"num_stages": 2, "stages": [stage, stage]}]))
    put("cost_duppart.json", profile(two + two))
    put("cost_nop2p.json", json.dumps({k: v for k, v in json.loads(profile(two)).items() if k != "p2p"}))
    put("cost_negative.json", profile([{"num_stages": 2, "stages": [{"stage": 0, **stage, "F": -1},
                                                                    {"stage": 1, **stage}]}]))
    put("cost_nan.json", profile(two).replace("0.01", "NaN", 1))
    put("afile", "x")
    put("adir/keep", "")
    w["adir"] = str(d / "adir")
    return w


def _cases(d: Path) -> list[Case]:
    f = _files(d)
    out = str(d / "out")
    cases: list[Case] = []

    def add(group: str, argv: list[str], expect: str = "error", stdout: str | None = None) -> None:
        cases.append(Case(group, tuple(argv), expect, stdout))

    # -- numbers and shapes ----------------------------------------------------------------------------------
    for flag, values in {
        "--pp": ["0", "-1", "1.5", "abc", "", "1e3"], "--microbatches": ["0", "-3", "x", "2.0"],
        "--chunks": ["0", "-2", "y"],
    }.items():
        for v in values:
            shape = {"--schedule": "interleaved-1f1b" if flag == "--chunks" else "1f1b", "--pp": "4",
                     "--microbatches": "8", flag: v}
            add("numbers", [*SIM, *(x for kv in shape.items() for x in kv)])
    for flag in ("--tf", "--tb", "--tw", "--tcomm"):
        for v in ("-1", "nan", "inf", "-inf", "1e308", "x"):
            add("numbers", [*SIM, *SHAPE, flag, v, "--json"])
    for v in ("2", "-0.1", "nan"):
        add("numbers", [*SIM, *SHAPE, "--mw", v])
        add("numbers", [*SIM, "--schedule", "dualpipe-v", "--pp", "4", "--microbatches", "8", "--pair-overlap", v])
    for name in ("1f1b", "zb-v", "dualpipe-v", "interleaved-1f1b", "zb-auto"):
        add("numbers", [*SIM, "--schedule", name, "--pp", "4", "--microbatches", "8", "--tf", "1e308", "--tb", "1e308",
                        "--json"])
    for m in ("10000000", "99999999999"):
        add("numbers", [*SIM, "--schedule", "1f1b", "--pp", "4", "--microbatches", m])
    add("numbers", [*SIM, "--schedule", "1f1b", "--pp", "100000", "--microbatches", "1000"])
    for v in ("0", "-1", "0.5", "nan"):
        add("numbers", [*SIM, "--schedule", "zb-auto", "--pp", "4", "--microbatches", "8", "--mem-limit", v])
    add("numbers", [*SIM, *SHAPE, "--mem-limit", "4"])
    add("numbers", [*SIM, "--schedule", "interleaved-1f1b", "--pp", "4", "--microbatches", "6"])
    add("numbers", [*SIM, "--schedule", "zb-v", "--pp", "4", "--microbatches", "8", "--chunks", "3"])
    add("numbers", [*SIM, "--schedule", "gpipe", "--pp", "4", "--microbatches", "8", "--chunks", "2"])
    add("numbers", [*SIM, "--schedule", "dualpipe-v", "--pp", "4", "--microbatches", "4"])
    for ok in (["--tf", "1e300", "--json"], ["--tcomm", "0.5", "--json"], ["--tf", "2", "--tb", "3", "--tw", "0.5"]):
        add("numbers", [*SIM, *SHAPE, *ok], "ok")

    # -- names ---------------------------------------------------------------------------------------------------
    for name in ("nope", "zbv", "1f1f", "x" * 300, "", " ", "torch:", "torch:Nope", "torch:PipelineScheduleSingle",
                 "csv:", "csv:/no/such/file.csv", "gpipe,1f1b", "../etc/passwd", "1f1b\n"):
        add("names", [*SIM, "--schedule", name, "--pp", "4", "--microbatches", "8"])
    for name in ("1F1B", "ZB-V", "Interleaved-1F1B", "GPipe", "torch:gpipe", "torch:ZBVZeroBubble"):
        add("names", [*SIM, "--schedule", name, "--pp", "4", "--microbatches", "8", "--json"], "ok")
    add("names", [*SIM, "--schedule", "torch:1F1B", "--pp", "4", "--microbatches", "8"])  # torch 2.13's bug: refused
    for sch in (",", " , ", "nope", "y" * 400, "gpipe,,nope"):
        add("names", [*SCHEDLAB, "compare", "--schedules", sch, "--out", out])
    add("names", [*SCHEDLAB, "compare", "--pp", "4", "--microbatches", "6", "--out", out, "--json"], "ok")
    add("names", [*SCHEDLAB, "nosuchcommand"])
    add("names", [*SCHEDLAB], "error")

    # -- schedule files ------------------------------------------------------------------------------------------
    for name in ("binary.csv", "empty.csv", "badcell.csv", "missing.csv", "deadlock.csv", "twoplaces.csv",
                 "quoted.csv", "dir.csv"):
        add("schedule files", [*SIM, "--schedule", f"csv:{f[name]}"])
    add("schedule files", [*SIM, "--schedule", f"csv:{f['good.csv']}", "--pp", "3"])
    add("schedule files", [*SIM, "--schedule", f"csv:{f['good.csv']}", "--chunks", "2"])
    for name in ("good.csv", "bom.csv"):
        add("schedule files", [*SIM, "--schedule", f"csv:{f[name]}", "--json"], "ok")

    # -- flags that would be ignored -----------------------------------------------------------------------------
    costs = f["cost_good.json"]
    for flag, v in (("--tf", "2"), ("--tb", "2"), ("--tw", "1"), ("--tcomm", "0.1"), ("--mw", "0.5"),
                    ("--pair-overlap", "0.3")):
        add("ignored flags", [*SIM, "--schedule", "1f1b", "--pp", "2", "--microbatches", "4", "--costs", costs, flag, v])
    for flag, v in (("--dp", "2"), ("--tp", "2"), ("--dp-mode", "ddp"), ("--collective", "ring"),
                    ("--microbatch-size", "2"), ("--bucket-mb", "10"), ("--order", "pp-inner"), ("--efficiency", "0.5"),
                    ("--recompute", "selective"), ("--seq-len", "4096")):
        add("ignored flags", [*SIM, *SHAPE, flag, v])
    add("ignored flags", [*SIM, *SHAPE, "--recompute", "full"], "ok")  # R before every backward
    add("ignored flags", [*SIM, *SHAPE, "--sp"])
    add("ignored flags", [*SIM, "--model", "gpt3-175b", "--cluster", "dgx-a100:8", "--pp", "8", "--schedule", "1f1b",
                          "--microbatches", "8", "--sp"])  # sequence parallelism with tp=1 would do nothing
    add("ignored flags", [*SCHEDLAB, "compare", "--recompute", "full", "--out", out])
    for flag, v in (("--tf", "2"), ("--tcomm", "0.1")):
        add("ignored flags", [*SIM, "--model", "gpt-6.2b", "--cluster", "dgx-h100", "--pp", "8", "--schedule", "1f1b",
                              "--microbatches", "8", flag, v])
    for flag, v in (("--dp", "2"), ("--dp-mode", "ddp"), ("--microbatch-size", "2")):
        add("ignored flags", [*SCHEDLAB, "compare", flag, v, "--out", out])
    add("ignored flags", [*SCHEDLAB, "compare", "--tf", "2", "--costs", costs, "--out", out])
    add("ignored flags", [*SCHEDLAB, "report", "--tb", "2", "--costs", costs, "--out", out])
    add("ignored flags", [*SCHEDLAB, "compare", "--pp", "2", "--microbatches", "4", "--schedules", "1f1b,zb-h1",
                          "--costs", costs, "--out", out, "--json"], "ok")

    # -- outputs -------------------------------------------------------------------------------------------------
    targets = {"a directory": f["adir"], "under a file": f["afile"] + "/x", "read-only /proc": "/proc/schedlab",
               "read-only /sys": "/sys/schedlab"}
    for what, base in targets.items():
        for flag, suffix in (("--trace", ".csv"), ("--plot", ".png"), ("--export-csv", ".csv"),
                             ("--export-csv-comms", ".csv")):
            path = base if what == "a directory" else base + "/out" + suffix
            add(f"outputs ({what})", [*SIM, *SHAPE, flag, path])
        add(f"outputs ({what})", [*SCHEDLAB, "compare", "--out", f["afile"] if what == "a directory" else base])
        add(f"outputs ({what})", [*SCHEDLAB, "report", "--schedules", "gpipe", "--out",
                                  f["afile"] if what == "a directory" else base])
    for flag, v in (("--trace", "t.txt"), ("--plot", "t.gif"), ("--export-csv", "t.json")):
        add("outputs (suffix)", [*SIM, *SHAPE, flag, str(d / v)])
    add("outputs (suffix)", [*SCHEDLAB, "perfetto", f["good.csv"], str(d / "x.txt")])
    add("outputs (pipes)", [*SIM, *SHAPE, "--json"], "ok", stdout="head")
    add("outputs (pipes)", [*SIM, *SHAPE], "ok", stdout="head")
    add("outputs (pipes)", [*SCHEDLAB, "list"], "ok", stdout="head")
    add("outputs (pipes)", [*SIM, *SHAPE, "--json"], "error", stdout="full")
    add("outputs (pipes)", [*SCHEDLAB, "list"], "error", stdout="full")

    # -- trace files ---------------------------------------------------------------------------------------------
    for name in ("trace_binary.csv", "trace_nonnumeric.csv", "trace_cut.csv", "trace_badheader.csv",
                 "trace_endbeforestart.csv", "trace_missingcol.csv", "trace_empty.csv", "trace_text.csv"):
        add("trace files", [*SCHEDLAB, "perfetto", f[name], str(d / "p.json")])
        add("trace files", [*SCHEDLAB, "report", "--schedules", "gpipe", "--real", f[name], "--out", out])
    add("trace files", [*SCHEDLAB, "perfetto", str(d / "nope.csv")])

    # -- configs, models, clusters -------------------------------------------------------------------------------
    for name in ("cfg_schedule_int.toml", "cfg_split_str.toml", "cfg_bucket_str.toml", "cfg_layers_float.toml",
                 "cfg_mb_float.toml", "cfg_pp_bool.toml", "cfg_eff_str.toml", "cfg_broken.toml",
                 "cfg_unknown_table.toml", "cfg_unknown_key.toml"):
        add("configs", [*SIM, "--config", f[name]])
    add("configs", [*SIM, "--config", str(d / "none.toml")])
    add("configs", [*SIM, "--config", f["cfg_good.toml"], "--json"], "ok")
    units = ["--schedule", "1f1b", "--microbatches", "8"]
    for extra in (["--model", "nope", "--cluster", "dgx-h100", "--pp", "8"],
                  ["--model", "gpt-6.2b", "--cluster", "nope", "--pp", "8"],
                  ["--model", "gpt-6.2b", "--cluster", "dgx-h100:0", "--pp", "8"],
                  ["--model", "gpt-6.2b", "--cluster", "dgx-h100", "--pp", "64"],
                  ["--model", "gpt-6.2b", "--cluster", "dgx-h100", "--pp", "4", "--tp", "3"],
                  ["--model", "gpt-6.2b", "--cluster", "dgx-h100", "--pp", "1", "--tp", "16"],
                  ["--model", "gpt-6.2b", "--cluster", "dgx-h100", "--pp", "8", "--efficiency", "2"],
                  ["--model", "gpt-6.2b", "--cluster", "dgx-h100", "--pp", "8", "--dp-mode", "bogus"],
                  ["--model", "gpt-6.2b", "--cluster", "dgx-h100", "--pp", "8", "--bucket-mb", "0"],
                  ["--model", "gpt-6.2b", "--cluster", "dgx-h100", "--pp", "8", "--microbatch-size", "0"],
                  ["--model", "gpt-6.2b", "--cluster", "dgx-h100", "--pp", "8", "--collective", "carrier-pigeon"],
                  ["--model", "gpt-6.2b", "--cluster", "dgx-h100", "--pp", "8", "--mem-limit", "4"],
                  ["--model", "gpt-6.2b", "--cluster", "dgx-h100", "--pp", "8", "--costs", costs],
                  ["--model", "gpt3-175b", "--cluster", "dgx-a100:8", "--pp", "8", "--tp", "8", "--recompute", "most"],
                  ["--model", "gpt3-175b", "--cluster", "dgx-a100:8", "--pp", "8", "--tp", "8", "--seq-len", "0"],
                  ["--model", "gpt3-175b", "--cluster", "dgx-a100:8", "--pp", "8", "--tp", "8", "--seq-len", "1.5"],
                  ["--model", "gpt3-175b", "--cluster", "dgx-a100:8", "--pp", "8", "--tp", "16"]):
        add("physical units", [*SIM, *units, *extra])
    add("physical units", [*SIM, *units, "--model", "gpt-6.2b", "--cluster", "dgx-h100", "--pp", "4", "--tp", "2",
                           "--json"], "ok")
    add("physical units", [*SIM, "--model", "gpt3-175b", "--cluster", "dgx-a100:8", "--tp", "8", "--pp", "8",
                           "--schedule", "interleaved-1f1b", "--chunks", "3", "--microbatches", "64", "--recompute",
                           "selective", "--sp", "--json"], "ok")
    add("physical units", [*SCHEDLAB, "compare", "--model", "gpt-6.2b", "--pp", "8"])

    # -- cost files ----------------------------------------------------------------------------------------------
    for name in ("cost_notjson.json", "cost_schema.json", "cost_dupstage.json", "cost_range.json", "cost_nostage.json",
                 "cost_duppart.json", "cost_nop2p.json", "cost_negative.json", "cost_nan.json"):
        add("cost files", [*SIM, "--schedule", "1f1b", "--pp", "2", "--microbatches", "4", "--costs", f[name]])
    add("cost files", [*SIM, "--schedule", "1f1b", "--pp", "2", "--microbatches", "4", "--costs", str(d / "no.json")])
    add("cost files", [*SIM, "--schedule", "1f1b", "--pp", "3", "--microbatches", "4", "--costs", costs])
    add("cost files", [*SIM, "--schedule", "zb-v", "--pp", "2", "--microbatches", "4", "--costs", costs, "--json"], "ok")
    add("cost files", [*SIM, "--schedule", "zb-v", "--pp", "2", "--microbatches", "4", "--costs", costs,
                       "--costs-profile", costs])  # a profile scales a trace, not a cost file
    add("cost files", [*SIM, "--schedule", "1f1b", "--pp", "2", "--microbatches", "4", "--costs", f["badcell.csv"]])
    add("cost files", [*SCHEDLAB, "report", "--out", out, "--validation", f["afile"]])

    # -- the real runtime (one process; no torchrun) ---------------------------------------------------------------
    one = ["--schedule", "gpipe", "--pp", "1", "--microbatches", "2", "--steps", "2", *SMALL]
    for extra in (["--pp", "2"], ["--batch-size", "3"], ["--split", "2,x"], ["--split", "1,1"], ["--dim", "15"],
                  ["--trace-step", "5"], ["--trace-steps", "0"], ["--trace-steps", "3"], ["--fail-rank", "3"], ["--fail-at-step", "9"], ["--keep-last", "0",
                  "--checkpoint-dir", str(d / "ck")], ["--checkpoint-dir", f["afile"]], ["--save-params", f["adir"]],
                  ["--trace", f["afile"] + "/t.csv"], ["--plot", f["adir"]], ["--optimizer", "lamb"], ["--lr", "0"],
                  ["--lr", "nan"], ["--dp-mode", "zero3"], ["--backend", "nccl"], ["--timeout", "-1"],
                  ["--recv-ahead", "0"], ["--layers", "0"], ["--vocab", "1"], ["--steps", "0"], ["--dp", "auto2"]):
        add("real runtime", [*REAL, *one, *extra])
    add("real runtime", [*REAL, "--schedule", f"csv:{f['badcell.csv']}", "--steps", "2"])
    add("real runtime", [*REAL, "--schedule", "torch:GPipe", "--steps", "2"])
    add("real runtime", [*REAL, "--pp", "1", "--microbatches", "2"])
    add("real runtime", [*REAL, *one, "--json"], "ok")
    add("real runtime", [*REAL, "--schedule", "torch:GPipe", "--pp", "1", "--microbatches", "2", "--steps", "2",
                         *SMALL, "--json"], "ok")
    add("real runtime", [*REAL, *one, "--lr", "1e30", "--optimizer", "sgd"])  # diverges: the loss goes non-finite
    for extra in (["--out", str(d / "p.txt")], ["--out", f["adir"]], ["--out", f["afile"] + "/p.json"],
                  ["--out", str(d / "p.json"), "--stages", "2,x"], ["--out", str(d / "p.json"), "--stages", "0"],
                  ["--out", str(d / "p.json"), "--reps", "0"], ["--out", str(d / "p.json"), "--split", "3,1",
                                                                 "--stages", "2,4"]):
        add("profiler", [*PROFILE, *SMALL, *extra])

    # -- hardening, runtime: flags that do nothing, the user's code, token files, a NaN at pp 2 --------------------
    one = ["--schedule", "gpipe", "--pp", "1", "--microbatches", "2", "--steps", "2", *SMALL]
    for extra in (["--checkpoint-every", "2"], ["--keep-last", "3"], ["--async-checkpoint"], ["--dp-mode", "zero1"],
                  ["--bucket-mb", "5"], ["--recv-ahead", "2"], ["--seed", str(2**64)], ["--seed", "-1"]):
        add("runtime: idle flags", [*REAL, *one, *extra])
    models = d / "hostile_models.py"
    models.write_bytes((EXPERIMENTS / "hostile_models.py").read_bytes())
    user = ["--schedule", "gpipe", "--pp", "1", "--microbatches", "2", "--batch-size", "8", "--steps", "3"]
    add("runtime: idle flags", [*REAL, *user, "--model", f"{models}:good", "--heads", "4"])
    add("runtime: idle flags", [*PROFILE, "--model", f"{models}:good", "--out", str(d / "p.json")])
    for factory in ("stage_tuple", "last_tuple", "last_none", "zero_d", "int_inputs", "width_changes", "loss_vector",
                    "loss_float", "loss_nograd", "exits", "exits_text"):
        add("runtime: your code", [*REAL, *user, "--model", f"{models}:{factory}"])
    add("runtime: your code", [*REAL, *user, "--model", f"{models}:good", "--json"], "ok")
    add("runtime: your code", [*SCHEDLAB, "run", *user, "--pp", "2", "--model", f"{models}:stage_tuple"])
    gpt = ["--schedule", "gpipe", "--pp", "1", "--microbatches", "1", "--batch-size", "2", "--steps", "1",
           "--layers", "1", "--dim", "8", "--heads", "2", "--seq", "4"]
    for name, tokens, dtype, sidecar in (("big", [1, 2, 300, 4], "uint16", {"dtype": "uint16", "vocab": 256}),
                                         ("dtype_lie", [1, 2, 3, 4], "uint16", {"dtype": "uint32", "vocab": 256}),
                                         ("vocab_lie", [1, 2, 3, 40], "uint16", {"dtype": "uint16", "vocab": 16}),
                                         ("vocab_str", [1, 2, 3, 4], "uint16", {"dtype": "uint16", "vocab": "256"}),
                                         ("no_sidecar", [1, 2, 3, 99], "uint16", None),
                                         ("good", [1, 2, 3, 200], "uint16", {"dtype": "uint16", "vocab": 256})):
        path = d / f"tokens_{name}.bin"
        np.asarray(tokens * 5, dtype=dtype).tofile(path)
        if sidecar is not None:
            Path(f"{path}.json").write_text(json.dumps(sidecar))
        add("runtime: token files", [*REAL, *gpt, "--data", str(path), *(["--json"] if name == "good" else [])],
            "ok" if name == "good" else "error")
    add("runtime: failures", [*SCHEDLAB, "run", "--schedule", "1f1b", "--pp", "2", "--microbatches", "2", "--steps",
                              "3", "--batch-size", "4", "--lr", "1e30", *SMALL])  # NaN at pp 2: one line
    cases += _hardening_cases(d)
    (d / "parse").mkdir()
    cases += parse_cases(d / "parse")  # group "parse": numbers, names, sizes and data files (analysis.hostile_parse)
    cases += path_cases(d)  # group paths: every input and output through the one output policy
    cases += proc_cases(d)  # group procs: processes, signals, --elastic live
    return cases


# -- hardening: data loss, runaway searches, the planner's answers, paths, the scripts --------------------------------
# Each case gives its exact one-line message and the files it must leave as they were (a device stays a device).
EXPERIMENTS = Path(__file__).resolve().parent
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


def _hardening_cases(d: Path) -> list[Case]:
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
        "plan: no configuration fits in 85.5 GB per device: model states and one microbatch fit (8.2 GB at least), "
        f"the microbatches each schedule holds in flight do not; {fits}")
    add("runaway", [*PLAN, "--global-batch", str(2**40), "--out", h / "plan3"],
        "plan: no configuration fits in 85.5 GB per device: the smallest needs at least 8796 GB (model states and one "
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
    add("planner answers", [*PLAN, "--global-batch", "8", "--schedules", "interleaved-1f1b", "--chunks", "1", "--out",
                            h / "plan7"], "plan: chunks [1] leave no stage count for interleaved-1f1b: each takes 2 or "
                                          "more stages per rank (flag --chunks)")
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
                                                              "1f1b, dualpipe-v, gpipe, interleaved-1f1b, "
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




def _page(rows: list[dict], groups: dict[str, dict[str, int]], bad: list[dict], args: argparse.Namespace) -> str:
    from analysis.results_page import table

    outcomes = ["clean error", "ok", "wrong", "unclean", "traceback", "hang"]
    cells = [[name, *(g.get(o, 0) for o in outcomes)] for name, g in groups.items()]
    cells.append(["**all**", *(sum(g.get(o, 0) for g in groups.values()) for o in outcomes)])
    subset = f" Only the groups starting {args.only!r} (`--only`): not the whole set." if args.only else ""
    problems = "\n".join(f"- [{r['outcome']}] `{r['argv']}`: exit {r['rc']}, expected {r['expect']}" for r in bad)
    return f"""\
{len(rows)} commands a hostile new user might type, each run as a subprocess with a {args.timeout:g} s timeout.
"clean error": exit status 2 and one line on stderr starting `error:`; "ok": exit 0 (strict JSON with
`--json`); "wrong": a clean result of the other kind than the case expects; "unclean": any other failure;
"traceback" and "hang" as they say. The goal: every case a clean error or ok, as it expects.{subset}

{table(["group", *outcomes], cells)}

{"Every case went as expected." if not bad else "Cases that went wrong:" + chr(10) + chr(10) + problems}
"""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", help="comma-separated group prefixes to run")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds per case (default 60)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--json", action="store_true")
    p.add_argument("--markdown", metavar="PAGE.md", help="also write the results page (docs/results/hostile_inputs.md)")
    args = p.parse_args(argv)
    if args.markdown:
        from analysis.cli.common import errors_to_exit
        from analysis.results_page import check_page

        with errors_to_exit():
            check_page(args.markdown)
    with tempfile.TemporaryDirectory(prefix="schedlab-hostile-") as tmp:
        d = Path(tmp)
        cases = _cases(d)
        if args.only:
            cases = [c for c in cases if any(c.group.startswith(g) for g in args.only.split(","))]
        with ThreadPoolExecutor(args.workers) as pool:
            rows = list(pool.map(lambda c: run_case(c, d, args.timeout), cases))
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["outcome"]] = counts.get(r["outcome"], 0) + 1
    groups: dict[str, dict[str, int]] = {}
    for r in rows:
        g = groups.setdefault(r["group"], {})
        g[r["outcome"]] = g.get(r["outcome"], 0) + 1
    bad = [r for r in rows if r["outcome"] not in ("clean error", "ok")]
    if args.markdown:
        from analysis.results_page import write_page

        page = write_page(args.markdown, "Hostile inputs", _page(rows, groups, bad, args),
                          argv=[__file__, *(argv if argv is not None else sys.argv[1:])])
        print(f"wrote {page}", file=sys.stderr)
    if args.json:
        print(json.dumps({"cases": len(rows), "outcomes": counts, "groups": groups, "problems": bad}))
        return 0
    print(f"{len(rows)} cases: " + ", ".join(f"{v} {k}" for k, v in sorted(counts.items())))
    for name, g in groups.items():
        print(f"  {name:<28} " + ", ".join(f"{v} {k}" for k, v in sorted(g.items())))
    for r in bad:
        print(f"\n[{r['outcome']}] {r['argv']}\n    rc={r['rc']} expected {r['expect']}: {r['stderr']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
