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
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from analysis.hostile import Case, run_case
from analysis.hostile_hardening import EXPERIMENTS, PROFILE, REAL, SCHEDLAB, SHAPE, SIM, SMALL
from analysis.hostile_hardening import cases as hardening_cases
from analysis.hostile_parse import cases as parse_cases
from analysis.hostile_paths import cases as path_cases
from analysis.hostile_procs import cases as proc_cases


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
    cases += hardening_cases(d)  # data loss, runaway, planner answers, paths, scripts (analysis.hostile_hardening)
    (d / "parse").mkdir()
    cases += parse_cases(d / "parse")  # group "parse": numbers, names, sizes and data files (analysis.hostile_parse)
    cases += path_cases(d)  # group paths: every input and output through the one output policy
    cases += proc_cases(d)  # group procs: processes, signals, --elastic live
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
