"""A schedule of the user's own, written in a file schedlab has never seen, goes wherever a built-in goes.

The file (written into each test's folder) defines 1F1B with the backward split into I and W and rank r's W
passes held back r+1 slots, registered with ``schedules.register``, and two plain functions. The fast tests
resolve it every way a command line or a script can name it and check every refusal; the slow test takes it
through simulate, compare, report (predicted against measured), a real 2-process run equal to single-process
training, the planner and its torch CSV export, as a user would, one command after the other.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from common.usercode import UserCodeError
from schedules import Action, Kind, PipelineParams, SchedlabError, ScheduleError, build, load_schedule, lower, validate
from schedules.registry import _REGISTRY, spec
from sim import UniformCosts, simulate

USER_FILE = textwrap.dedent('''
    """1F1B with the I/W split, rank r's W passes delayed r+1 slots (a user's idea)."""
    from schedules import Action, Kind, PipelineParams, build, make_schedule, register


    @register("{name}", summary="1F1B with I/W split, W delayed rank+1 slots")
    def lazyw(params: PipelineParams):
        base = build("1f1b", pp=params.pp, microbatches=params.microbatches)
        programs = []
        for r, prog in enumerate(base.programs):
            out, pending = [], []
            for a in prog:
                if a.kind is Kind.B:
                    out.append(Action(Kind.I, a.stage, a.microbatch))
                    pending.append(Action(Kind.W, a.stage, a.microbatch))
                    if len(pending) > r + 1:
                        out.append(pending.pop(0))
                else:
                    out.append(a)
            programs.append(out + pending)
        return make_schedule("{name}", params, programs)


    def plain(params):
        """Not registered: a function from the parameters to a Schedule."""
        return build("gpipe", pp=params.pp, microbatches=params.microbatches)


    def broken(params):
        return {{}}["nope"]


    def not_a_schedule(params):
        return [1, 2]


    def wrong_shape(params):
        return build("1f1b", pp=params.pp + 1, microbatches=params.microbatches)


    NUMBER = 3
''')


def _expected(pp: int, m: int) -> list[list[str]]:
    """The user's order, derived here independently: 1F1B's programs, B -> I, W held back rank + 1 slots."""
    out = []
    for r, prog in enumerate(build("1f1b", pp=pp, microbatches=m).programs):
        got, pending = [], []
        for a in prog:
            if a.kind is Kind.B:
                got.append(f"{a.stage}I{a.microbatch}")
                pending.append(f"{a.stage}W{a.microbatch}")
                if len(pending) > r + 1:
                    got.append(pending.pop(0))
            else:
                got.append(str(a))
        out.append(got + pending)
    return out


@pytest.fixture
def user_file(tmp_path, request):
    """The user's file, registering a name unique to this test (the registry is per process), removed after."""
    name = f"lazyw-{request.node.name[-20:].strip('[]').replace('[', '-')}-{os.getpid()}"
    path = tmp_path / "my_schedules.py"
    path.write_text(USER_FILE.format(name=name))
    yield path, name
    _REGISTRY.pop(name, None)


def test_every_way_to_name_it_gives_the_same_validated_schedule(user_file, monkeypatch):
    path, name = user_file
    by_function = load_schedule(f"{path}:lazyw", pp=3, microbatches=6)
    assert [[str(a) for a in p] for p in by_function.programs] == _expected(3, 6)
    assert by_function.name == name and dict(by_function.params) == {"pp": 3, "microbatches": 6, "chunks": 1}
    assert spec(f"{path}:lazyw").name == name  # the registered function is found as registered
    by_name = load_schedule(f"{path}:{name}", pp=3, microbatches=6)  # the name it registered, through its file
    assert by_name.programs == by_function.programs
    assert build(name, pp=3, microbatches=6).programs == by_function.programs  # registered once imported
    validate(lower(by_function))
    monkeypatch.chdir(path.parent)  # a module beside the command, as python -m finds it
    assert load_schedule("my_schedules:plain", pp=2, microbatches=4).programs == \
        build("gpipe", pp=2, microbatches=4).programs


def test_a_plain_function_takes_the_shape_it_is_given(user_file):
    path, _ = user_file
    got = load_schedule(f"{path}:plain", PipelineParams(pp=4, microbatches=8))
    assert got.programs == build("gpipe", pp=4, microbatches=8).programs and spec(f"{path}:plain").any_chunks


def test_it_simulates_and_its_memory_is_the_held_back_ws(user_file):
    """Unit costs: 1F1B's 15 at pp 2, m 4 becomes 13 with the split; the W's held back hold what I does not free."""
    path, _ = user_file
    result = simulate(lower(load_schedule(f"{path}:lazyw", pp=2, microbatches=4)), UniformCosts())
    assert result.makespan == 13.0


@pytest.mark.parametrize(("attr", "message"), [
    ("nothere", "schedule '{path}:nothere': {path} defines no 'nothere' and registers no schedule of that name"),
    ("NUMBER", "schedule '{path}:NUMBER': 'NUMBER' in {path} is a int, not a function (PipelineParams) -> Schedule"),
    ("not_a_schedule", "schedule 'not_a_schedule': its generator (my_schedules.py:33, not_a_schedule) returned list; "
                       "it must return a schedules.Schedule (build one with schedules.make_schedule)"),
    ("wrong_shape", "schedule 'wrong_shape': its generator was asked for pp=2, microbatches=4 and returned pp=3, "
                    "microbatches=4; build the programs from the params it is given"),
])
def test_a_bad_reference_is_one_line_naming_it(user_file, attr, message):
    path, _ = user_file
    with pytest.raises(ScheduleError) as exc:
        load_schedule(f"{path}:{attr}", pp=2, microbatches=4)
    assert str(exc.value) == message.format(path=path) and exc.value.field == "schedule"


def test_the_users_own_error_names_its_file_line_and_function(user_file):
    path, _ = user_file
    with pytest.raises(UserCodeError) as exc:
        load_schedule(f"{path}:broken", pp=2, microbatches=4)
    assert str(exc.value) == ("schedule 'broken': its generator (my_schedules.py:29, broken) raised KeyError: 'nope' "
                              "at my_schedules.py:30 in broken")
    assert exc.value.frames and "my_schedules.py" in exc.value.frames[-1]


def test_a_file_that_fails_to_import_is_one_line(tmp_path):
    bad = tmp_path / "bad_sched.py"
    bad.write_text("x = 1\nraise RuntimeError('half written')\n")
    with pytest.raises(UserCodeError, match=r"^schedule '.*bad_sched.py:f': importing .*bad_sched.py failed "
                                            r"\(RuntimeError: half written\) at bad_sched.py:2$"):
        load_schedule(f"{bad}:f", pp=2, microbatches=4)
    with pytest.raises(SchedlabError, match=r"^schedule '.*missing.py:f': no file .*missing.py$"):
        load_schedule(f"{tmp_path / 'missing.py'}:f", pp=2, microbatches=4)


def test_the_tutorial_shows_the_file_it_runs():
    """docs/your-schedule.md's code block is experiments/my_schedule.py, which its commands run."""
    root = Path(__file__).resolve().parents[1]
    page = (root / "docs" / "your-schedule.md").read_text()
    assert page.split("```python\n", 1)[1].split("```", 1)[0] == (root / "experiments" / "my_schedule.py").read_text()


def test_a_schedule_built_by_hand_records_its_shape():
    """A Schedule made with the constructor, as a user might: its params still say pp, microbatches and chunks."""
    from schedules import Schedule

    s = Schedule("mine", 2, 2, 2, (0, 1), [[Action(Kind.F, 0, 0), Action(Kind.F, 0, 1), Action(Kind.B, 0, 0),
                                          Action(Kind.B, 0, 1)],
                                         [Action(Kind.F, 1, 0), Action(Kind.B, 1, 0), Action(Kind.F, 1, 1),
                                          Action(Kind.B, 1, 1)]])
    assert dict(s.params) == {"pp": 2, "microbatches": 2, "chunks": 1}


def test_a_trace_that_records_its_programs_is_predicted_from_them():
    """predict_for_trace rebuilds the run's own order, whatever the name (here one no registry knows)."""
    from sim.plan.sweep import predict_for_trace

    s = build("zb-h1", pp=2, microbatches=4)
    attrs = {"schedule": "someone-elses", "params": dict(s.params),
             "programs": [[str(a) for a in p] for p in s.programs], "stage_to_rank": list(s.stage_to_rank)}
    assert predict_for_trace(attrs).makespan == simulate(lower(s), UniformCosts()).makespan


# -- the whole path, as a user runs it --------------------------------------------------------------------------

SMALL = ["--layers", "4", "--dim", "16", "--heads", "2", "--vocab", "32", "--seq", "8"]


def _cli(args: list[str], cwd: Path, timeout: float = 150) -> str:
    cmd = [sys.executable, "-m", *args]
    with subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          start_new_session=True, env={**os.environ, "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg"}) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            pytest.fail(f"{' '.join(args[:3])} hung; stderr so far:\n{proc.communicate()[1][-4000:]}")
    assert proc.returncode == 0, f"{' '.join(args)}\n{err[-6000:]}"
    return out


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_users_schedule_goes_through_every_command(tmp_path):
    torch = pytest.importorskip("torch")
    from real import ModelConfig, RunConfig, reference_run
    from schedules import read_torch_csv

    (tmp_path / "lazy.py").write_text(USER_FILE.format(name="1f1b-lazyw"))
    ref = "lazy.py:lazyw"  # relative to the working directory, as a user types it

    # simulate, with its torch CSV export loaded back through torch's own loader
    sim = json.loads(_cli(["sim", "--schedule", ref, "--pp", "2", "--microbatches", "4", "--json",
                           "--export-csv", "lazy.csv"], tmp_path))
    assert sim["makespan"] == 13.0 and sim["schedule"] == "1f1b-lazyw"
    from test_interop import torch_runtime
    from torch.distributed.pipelining import schedules as ts

    runtime = torch_runtime(ts, 2, 1, 4)
    runtime._load_csv(str(tmp_path / "lazy.csv"))
    assert [[str(a) for a in runtime.pipeline_order[r]] for r in range(2)] == _expected(2, 4)

    # compare it with built-ins, by --import and its registered name
    table = json.loads(_cli(["analysis", "compare", "--import", "lazy.py", "--schedules", "1f1b,1f1b-lazyw,zb-h1",
                             "--pp", "2", "--microbatches", "4", "--json", "--out", "cmp"], tmp_path))
    rows = {r["schedule"]: r for r in table["schedules"]}
    assert (rows["1f1b"]["makespan"], rows["1f1b-lazyw"]["makespan"]) == (15.0, 13.0)
    assert (tmp_path / "cmp" / "timeline-1f1b-lazyw.png").is_file()

    # run it for real on 2 processes: equal to single-process training
    out = json.loads(_cli(["analysis", "run", "--schedule", ref, "--pp", "2", "--microbatches", "4", "--steps", "3",
                           "--batch-size", "16", *SMALL, "--optimizer", "sgd", "--lr", "0.1", "--json",
                           "--trace", "real.csv"], tmp_path))
    cfg = RunConfig.of(schedule="1f1b", pp=1, microbatches=4, steps=3, batch_size=16, optimizer="sgd", lr=0.1,
                       model=ModelConfig(kind="gpt", layers=4, dim=16, heads=2, vocab=32, seq=8))
    assert max(abs(a - b) for a, b in zip(out["losses"], reference_run(cfg)[0], strict=True)) <= 1e-5
    assert out["schedule"] == ref and [m["peak_activations_mb"] for m in out["memory"]] == pytest.approx([3.0, 3.0])

    # the report: predicted against measured as the validation grid predicts, calibrated from a 1F1B run's trace
    # and a profile (a cost file; the tutorial's docs block takes a real one), the user's run held out, with the
    # noise verdict and the measured peaks
    _cli(["analysis", "run", "--schedule", "1f1b", "--pp", "2", "--microbatches", "4", "--steps", "3",
          "--batch-size", "16", *SMALL, "--optimizer", "sgd", "--lr", "0.1", "--trace", "calib.csv"], tmp_path)
    from tests.test_calibrate import _profile_file  # a cost file of this shape (docs/your-schedule.md profiles one)

    _profile_file(tmp_path)
    _cli(["analysis", "report", "--schedules", f"1f1b,{ref}", "--pp", "2", "--microbatches", "4", "--costs",
          "calib.csv", "--costs-profile", "profile.json", "--real", "real.csv", "--out", "rep", "--no-progress"],
         tmp_path)
    page = (tmp_path / "rep" / "report.md").read_text()
    assert "**Noise verdict: " in page and "| 1f1b-lazyw | 4 | held out |" in page, page
    memory = page.split("| run | rank | measured MiB | measured M_B | simulated M_B |")[1].split("\n\n")[0]
    cells = [[c.strip() for c in line.strip("| ").split(" | ")] for line in memory.strip().splitlines()[1:]]
    # measured and simulated M_B per rank: 1F1B's p - r, and the held-back W's keeping 3 on both ranks
    assert [(c[0], c[1], c[3], c[4]) for c in cells] == [("1f1b", "0", "2", "2"), ("1f1b", "1", "1", "1"),
                                                         ("1f1b-lazyw", "0", "3", "3"), ("1f1b-lazyw", "1", "3", "3")]
    assert (tmp_path / "rep" / "sim-vs-real-real.png").is_file()

    # the planner searches it and exports its order for torch
    plan = json.loads(_cli(["analysis", "plan", "--model", "gpt-tiny", "--cluster", "dgx-h100:1", "--global-batch",
                            "8", "--workers", "1", "--schedules", ref, "--out", "plan", "--json", "--no-progress"],
                           tmp_path))
    win = plan["top"][0]["config"]
    assert win["schedule"] == ref
    exported = read_torch_csv(tmp_path / "plan" / "schedule.csv")
    assert [[str(a) for a in p] for p in exported.programs] == _expected(win["pp"], win["microbatches"])
    del torch  # imported for its skip only
