"""The any-model API in one process: splits, balancing, boundary inference, factories and their errors.

The multi-process equality of every schedule on a user model is in test_user_model_equality.py.
"""

from __future__ import annotations

import itertools
import json
import random

import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402, N812
from torch import nn  # noqa: E402

from analysis.cli.train import launch_main  # noqa: E402
from analysis.cli.train import main as real_main  # noqa: E402
from real import RunConfig, UserModel, fit  # noqa: E402
from real.model_api import (  # noqa: E402
    balance_split,
    from_factory,
    infer_boundaries,
    linear_partition,
    load_factory,
    plan_for,
)
from real.reference import reference_user_run  # noqa: E402
from schedules import ConfigError  # noqa: E402

EXAMPLE = "experiments/my_model.py:build"


def _batches(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    x = torch.randn(8, 6, generator=g)
    return x, x.argmax(-1) % 3


def _user(*mods: nn.Module, **kw) -> UserModel:
    torch.manual_seed(0)
    return UserModel(model=nn.Sequential(*mods), loss=F.cross_entropy, batches=_batches, **kw)


def _cfg(**kw) -> RunConfig:
    return RunConfig.of(**{**dict(schedule="1f1b", pp=2, microbatches=2, batch_size=8, steps=2), **kw})


def _brute(times: list[float], parts: int) -> float:
    best = float("inf")
    for cuts in itertools.combinations(range(1, len(times)), parts - 1):
        edges = (0, *cuts, len(times))
        best = min(best, max(sum(times[a:b]) for a, b in itertools.pairwise(edges)))
    return best


def test_linear_partition_minimizes_the_largest_stage_exactly():
    assert linear_partition([1, 1, 1, 1], 2) == (2, 2)
    assert linear_partition([9, 1, 1, 1, 1, 1], 2) == (1, 5)
    assert linear_partition([1, 2, 3, 4, 5, 6, 7, 8, 9], 3) == (5, 2, 2)  # 15 | 13 | 17: the optimum is 17
    rng = random.Random(0)
    for _ in range(200):
        n, k = rng.randint(1, 9), rng.randint(1, 4)
        if k > n:
            continue
        times = [rng.randint(1, 20) for _ in range(n)]
        sizes = linear_partition(times, k)
        assert len(sizes) == k and sum(sizes) == n and min(sizes) >= 1
        edges = list(itertools.accumulate((0, *sizes)))
        assert max(sum(times[a:b]) for a, b in itertools.pairwise(edges)) == _brute(times, k), (times, k)


def test_balance_by_profiled_time_gives_a_heavy_block_a_stage_of_its_own():
    """Block 0 does ~256x the work of each of the three others: whatever the timing noise, it stands alone."""
    torch.manual_seed(0)
    heavy = nn.Sequential(nn.Linear(64, 4096), nn.Linear(4096, 64))
    blocks = [heavy, nn.Linear(64, 64), nn.Linear(64, 64), nn.Linear(64, 64)]
    before = [p.detach().clone() for b in blocks for p in b.parameters()]
    assert balance_split(blocks, torch.randn(64, 64), 2) == (1, 3)
    after = [p.detach() for b in blocks for p in b.parameters()]
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True)) and heavy[0].weight.grad is None


def test_boundaries_are_inferred_with_their_shapes_and_dtypes():
    user = _user(nn.Linear(6, 12), nn.Unflatten(1, (3, 4)), nn.Conv1d(3, 5, 3), nn.Flatten(), nn.Linear(10, 10),
                 nn.Linear(10, 3))
    cfg = _cfg(pp=2, chunks=2, schedule="interleaved-1f1b", microbatches=2, boundaries=(2, 3, 5))
    plan, model, data = plan_for(cfg, 2, user)
    sample = data.sample(cfg.microbatch_size)[0]
    assert infer_boundaries(model, plan, sample, "float32") == {
        0: ((4, 3, 4), torch.float32), 1: ((4, 5, 2), torch.float32), 2: ((4, 10), torch.float32)}
    assert {s: d for s, (_, d) in infer_boundaries(model, plan, sample, "bfloat16").items()} == dict.fromkeys(
        range(3), torch.bfloat16)


@pytest.mark.parametrize(("mods", "kw", "message"), [
    ((nn.Linear(6, 3),), {}, "model Sequential has 1 blocks, fewer than the schedule's 2 stages (pp x chunks); "
                             "use at most 1 stages, or split model Sequential into more blocks"),
    ((nn.Linear(6, 6), nn.Linear(6, 3)), {"boundaries": (2,)},
     "model Sequential: boundary 2 (stage 1) is out of range; model Sequential has blocks 0..1 and boundaries "
     "must increase within 1..1"),
    ((nn.Linear(6, 6), nn.Linear(6, 3)), {"boundaries": (1, 1)},
     "model Sequential: 2 boundaries for 2 stages; give 1 (the first block of every stage but the first)"),
    ((nn.Linear(6, 6), nn.ReLU(), nn.Linear(6, 3)), {"split": (1, 1, 1), "pp": 3, "microbatches": 4},
     "model Sequential: stage 1 (blocks 1..1: ReLU) has no trainable parameters, but its optimizer needs them; "
     "move its blocks into a neighbouring stage"),
    ((nn.Linear(6, 6), nn.ReLU(), nn.Linear(6, 3)), {"split": (1, 1, 1), "pp": 3, "microbatches": 3,
                                                     "schedule": "zb-h1", "batch_size": 6},
     "model Sequential: stage 1 (blocks 1..1: ReLU) has no trainable parameters, but its weight-gradient pass W "
     "needs them"),
])
def test_unsplittable_models_get_one_clear_error(mods, kw, message):
    with pytest.raises(ConfigError) as err:
        plan_for(_cfg(**kw), _cfg(**kw).world_size, _user(*mods))
    assert message in str(err.value)


class _Pair(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(6, 6)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.lin(x), x


def test_a_stage_returning_a_tuple_is_refused_before_training():
    user = _user(_Pair(), nn.Linear(6, 3))
    with pytest.raises(ConfigError, match=r"model Sequential: stage 0 \(blocks 0..0\) returns tuple; a stage but "
                                          r"the last must return one tensor"):
        plan, model, data = plan_for(_cfg(), 2, user)
        infer_boundaries(model, plan, data.sample(4)[0], "float32")


def test_a_batch_function_returning_the_wrong_rows_is_named():
    user = UserModel(model=nn.Sequential(nn.Linear(6, 3)), loss=F.cross_entropy, batches=lambda s: _batches(s))
    with pytest.raises(ConfigError, match=r"batches\(0\) returned 8 inputs and 8 targets; the global batch_size is 16"):
        fit(user, schedule="1f1b", microbatches=2, batch_size=16, steps=1)


def _small() -> UserModel:
    torch.manual_seed(0)
    return UserModel(model=nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3)), loss=F.cross_entropy,
                     batches=_batches)


def test_fit_in_one_process_equals_plain_training():
    got = fit(_small(), schedule="1f1b", microbatches=4, batch_size=8, steps=3, optimizer="sgd", lr=0.1)
    losses, params = reference_user_run(_small(), got.config)
    assert max(abs(a - b) for a, b in zip(got.losses, losses, strict=True)) <= 1e-6
    assert sorted(got.parameters) == sorted(params) == ["0.bias", "0.weight", "2.bias", "2.weight"]
    assert all(float((got.parameters[k] - v).abs().max()) <= 1e-6 for k, v in params.items())


@pytest.mark.parametrize(("spec", "message"), [
    ("experiments/nothere.py:build", "model 'experiments/nothere.py:build': no file experiments/nothere.py"),
    ("experiments/my_model.py:nothing", "model 'experiments/my_model.py:nothing': experiments/my_model.py has no "
                                        "function 'nothing'"),
    ("experiments/my_model.py:batches", "model 'experiments/my_model.py:batches': the factory raised TypeError: "
                                        "batches() missing 1 required positional argument: 'step'"),
    ("real.models:make_optimizer", "model 'real.models:make_optimizer': the factory raised TypeError"),
    ("no_such_pkg_x:f", "model 'no_such_pkg_x:f': importing no_such_pkg_x failed (ModuleNotFoundError"),
])
def test_bad_factories_are_named(spec, message):
    with pytest.raises(ConfigError) as err:
        from_factory(spec, 0)
    assert message in str(err.value)


def test_factory_modules_next_to_the_command_load_without_touching_sys_path(tmp_path, monkeypatch):
    """``module:factory`` and ``pkg.module:factory`` in the working directory, as ``python -m`` finds them;
    a name imported already keeps its module, and sys.path is left as it was."""
    import sys

    (tmp_path / "beside_cmd_net.py").write_text("def build():\n    return 'module'\n")
    (tmp_path / "beside_cmd_pkg").mkdir()
    (tmp_path / "beside_cmd_pkg" / "__init__.py").write_text("")
    (tmp_path / "beside_cmd_pkg" / "net.py").write_text("from . import parts\n\ndef build():\n    return parts.WHAT\n")
    (tmp_path / "beside_cmd_pkg" / "parts.py").write_text("WHAT = 'package'\n")
    (tmp_path / "json.py").write_text("def build():\n    return 'shadowed'\n")  # imported already: stays the stdlib's
    monkeypatch.chdir(tmp_path)
    before = list(sys.path)
    try:
        assert load_factory("beside_cmd_net:build")() == "module"
        assert load_factory("beside_cmd_pkg.net:build")() == "package"
        assert load_factory("json:dumps") is json.dumps
        assert sys.path == before
    finally:
        for name in ("beside_cmd_net", "beside_cmd_pkg", "beside_cmd_pkg.net", "beside_cmd_pkg.parts"):
            sys.modules.pop(name, None)


def test_a_factory_module_that_fails_to_import_is_not_left_half_imported(tmp_path, monkeypatch):
    import sys

    (tmp_path / "beside_cmd_broken.py").write_text("raise ValueError('no luck')\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=r"importing beside_cmd_broken failed \(ValueError: no luck\)"):
        load_factory("beside_cmd_broken:build")
    assert "beside_cmd_broken" not in sys.modules


def test_cli_model_from_a_file_trains_like_the_reference(capsys, tmp_path):
    argv = ["--model", EXAMPLE, "--schedule", "gpipe", "--pp", "1", "--microbatches", "2", "--steps", "3",
            "--optimizer", "sgd", "--lr", "0.05", "--json", "--trace", str(tmp_path / "t.csv")]
    assert real_main(argv) == 0
    got = json.loads(capsys.readouterr().out)
    from schedules.trace import read_trace

    assert read_trace(tmp_path / "t.csv").attrs["model"] == {"factory": EXAMPLE}  # not the built-in model's config
    cfg = RunConfig.of(schedule="gpipe", microbatches=2, steps=3, optimizer="sgd", lr=0.05)
    losses, _ = reference_user_run(from_factory(EXAMPLE, 0), cfg)
    assert max(abs(a - b) for a, b in zip(got["losses"], losses, strict=True)) <= 1e-6


@pytest.mark.parametrize(("argv", "message"), [
    (["--model", "gpt2"], "argument --model: invalid choice 'gpt2': give gpt, mlp or pkg.module:factory"),
    (["--model", EXAMPLE, "--boundaries", "9"], "model Sequential: boundary 9 (stage 1) is out of range; model "
                                                "Sequential has blocks 0..5 and boundaries must increase within "
                                                "1..5 (flag --boundaries)"),
    (["--model", EXAMPLE, "--pp", "3", "--split", "1,1,4", "--batch-size", "30"],
     "model Sequential: stage 1 (blocks 1..1: ReLU) has no trainable parameters"),
    (["--model", EXAMPLE, "--pp", "7"], "model Sequential has 6 blocks, fewer than the schedule's 7 stages"),
])
def test_cli_errors_are_one_line(argv, message, capsys):
    base = ["--schedule", "1f1b", "--pp", "2", "--microbatches", "2"]
    with pytest.raises(SystemExit) as exit_:  # schedlab run: refused before torchrun starts
        launch_main([*base, *argv])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1 and message in err, err


RESUME_TIMEOUT = 120  # seconds per torchrun launch, kill and restart included, with room for a busy machine


@pytest.mark.slow
@pytest.mark.timeout(2 * RESUME_TIMEOUT + 10)
def test_a_user_model_killed_and_restarted_ends_bit_equal_to_an_uninterrupted_run(tmp_path):
    """``--model FILE:factory``, pp=2, checkpoints every 2 steps; rank 1 is SIGKILLed at step 3 and torchrun
    restarts the group, which resumes the user model's stages from step 2: the same losses and parameters."""
    import subprocess

    from real.launch import torchrun

    common = ["-m", "real", "--model", EXAMPLE, "--schedule", "1f1b", "--pp", "2", "--microbatches", "4",
              "--steps", "6", "--json", "--timeout", "20"]

    def launch(*extra: str, restarts: int = 0) -> dict:
        try:
            proc = torchrun(2, [*common, *extra], timeout=RESUME_TIMEOUT, capture=True, env={"OMP_NUM_THREADS": "1"},
                            launcher_args=[f"--max-restarts={restarts}", "--monitor-interval=0.2"])
        except subprocess.TimeoutExpired as exc:
            pytest.fail(f"torchrun hung; stderr so far:\n{(exc.stderr or '')[-6000:]}")
        assert proc.returncode == 0, proc.stderr[-6000:]
        return json.loads(proc.stdout)

    resumed = launch("--checkpoint-dir", str(tmp_path / "ckpt"), "--checkpoint-every", "2", "--fail-at-step", "3",
                     "--fail-rank", "1", restarts=1)
    plain = launch()
    assert (resumed["restart_count"], resumed["start_step"]) == (1, 2)
    assert resumed["resumed_from"] == str(tmp_path / "ckpt" / "step_000002")
    assert resumed["losses"] == plain["losses"] and len(plain["losses"]) == 6
    assert resumed["param_sha256"] == plain["param_sha256"]
