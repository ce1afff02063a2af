"""Run Megatron-LM's own parser on every planning question's launch script, as a user launches it.

    python experiments/check_megatron_launch.py --repo PATH/TO/Megatron-LM.git [--commit REV]
        [--markdown docs/results/megatron_launch.md] [--json docs/results/megatron_launch.json]

For each question of tests/plan_questions.py (and the 1f1b one on a model without dropout): the planner's winner is exported
(analysis.plan.megatron.megatron_script), bash runs the script with a recording
torchrun (analysis.plan.megatron_launch.launch_script), once from an environment
without CUDA_DEVICE_MAX_CONNECTIONS and once with it at 1. Megatron-LM's
``parse_args``, ``validate_args``, ``core_transformer_config_from_args``,
``get_megatron_ddp_config``, its microbatch calculator and vocabulary padding
then run in this process on exactly that argument list and environment (plus
what torchrun sets for rank 0), and every field of ``plan_settings`` must
equal what Megatron-LM resolved. Each tensor-parallel or Megatron-FSDP script
is also validated with the variable the other way, to record Megatron-LM's
refusal. Exits 1 on any mismatch.

Megatron-LM is read from ``git archive`` of the commit (no work tree needed).
Patched, because this machine has no GPU, no Transformer Engine and Python
3.11: ``get_device_arch_version`` answers 9 (Hopper, the planner's H100s),
TE's fused RoPE kernel is a placeholder (``apply_rope_fusion`` is on by
default and TransformerConfig checks the kernel exists), and
``typing.override`` (Python 3.12, which main requires) is typing_extensions'.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import os
import subprocess
import sys
import tempfile
import typing
import warnings
from pathlib import Path

from analysis.plan.exports import plan_layout, plan_schedule
from analysis.plan.megatron import MEGATRON_COMMIT, megatron_script
from analysis.plan.megatron_launch import launch_script, megatron_settings, plan_settings, torchrun_env
from analysis.results_page import check_page, table, write_page
from tests.plan_questions import CLUSTER, GLOBAL_BATCH, QUESTIONS, TINY, Question

STARTS = {"unset": {}, "at 1": {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}}
# The twelve questions' models have dropout; a Llama trains without: the 1f1b question on such a model.
_F = QUESTIONS["1f1b"]
CASES = {**QUESTIONS, "1f1b-no-dropout": Question(dataclasses.replace(TINY, dropout=False), _F.expect, **_F.choices)}


def _import_megatron(tree: Path):
    import typing_extensions

    if not hasattr(typing, "override"):  # Python 3.11: main uses typing.override (3.12)
        typing.override = typing_extensions.override
    warnings.simplefilter("ignore")
    with contextlib.redirect_stdout(io.StringIO()):
        import megatron.core
        import megatron.core.models.common.embeddings.rope_utils as rope
        from megatron.training import arguments
        from megatron.training.argument_utils import core_transformer_config_from_args
        from megatron.training.training import get_megatron_ddp_config
        from megatron.training.vocab_utils import calculate_padded_vocab_size
    if not str(Path(megatron.core.__file__).resolve()).startswith(str(tree.resolve())):
        raise SystemExit(f"megatron.core came from {megatron.core.__file__}, not the checkout")
    arguments.get_device_arch_version = lambda: 9  # no GPU here: the planner's H100 is Hopper (sm_90)
    rope.fused_apply_rotary_pos_emb = object()  # Transformer Engine's fused RoPE, present where TE is
    return arguments, core_transformer_config_from_args, get_megatron_ddp_config, calculate_padded_vocab_size


def _resolve(megatron, launch, env_override=None):
    """Megatron-LM's parse and validation of ``launch`` -> (settings, None) or (None, its one-line refusal)."""
    from megatron.core import num_microbatches_calculator as nmc

    arguments, to_config, ddp_config, padded = megatron
    env = {**torchrun_env(launch), **(env_override or {})}
    env = {k: v for k, v in env.items() if v is not None}
    os.environ.clear()
    os.environ.update(env)
    sys.argv = [launch.script, *launch.argv]
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            args = arguments.parse_args()
            arguments.validate_args(args, {})
            config = to_config(args)
            ddp = ddp_config(args)
            nmc.init_num_microbatches_calculator(0, None, args.global_batch_size, args.micro_batch_size,
                                                 args.data_parallel_size)
            micro = nmc.get_num_microbatches()
            nmc.destroy_num_microbatches_calculator()
            vocab = padded(args.vocab_size, args.make_vocab_size_divisible_by, args.tensor_model_parallel_size, False)
    except (AssertionError, ValueError) as e:
        return None, f"{type(e).__name__}: {' '.join(str(e).split())}"
    return megatron_settings(args, config, ddp, micro, vocab), None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repo", required=True, help="a Megatron-LM git directory (bare or not)")
    ap.add_argument("--commit", default=MEGATRON_COMMIT, help=f"the revision (default {MEGATRON_COMMIT[:12]})")
    ap.add_argument("--markdown", help="write the results page here (docs/results/megatron_launch.md)")
    ap.add_argument("--json", help="write the verified launches here (docs/results/megatron_launch.json)")
    ap.add_argument("--tree", help=argparse.SUPPRESS)  # the extracted checkout, on this process's PYTHONPATH
    args = ap.parse_args(argv)
    if args.markdown:
        check_page(args.markdown)
    if args.tree is None:  # extract the commit, then run again with it first on PYTHONPATH
        with tempfile.TemporaryDirectory(prefix="megatron-lm-") as tmp:
            with subprocess.Popen(["git", "-C", args.repo, "archive", args.commit, "megatron", "pretrain_gpt.py"],
                                  stdout=subprocess.PIPE) as git:
                subprocess.run(["tar", "x", "-C", tmp], stdin=git.stdout, check=True)
            if git.returncode != 0:
                print(f"error: git archive {args.commit} in {args.repo} failed", file=sys.stderr)
                return 2
            path = os.pathsep.join(p for p in (tmp, os.environ.get("PYTHONPATH")) if p)
            return subprocess.run([sys.executable, __file__, *(sys.argv[1:] if argv is None else argv), "--tree", tmp],
                                  env={**os.environ, "PYTHONPATH": path}).returncode
    saved_env, saved_argv = dict(os.environ), list(sys.argv)
    megatron = _import_megatron(Path(args.tree))
    rows, record, bad = [], {}, 0
    for name, q in CASES.items():
        c = q.winner()
        layout = plan_layout(c, q.model, plan_schedule(c))
        text = megatron_script(c, q.model, GLOBAL_BATCH, layout, q.reduce_dtype, 8)
        want = plan_settings(c, q.model, GLOBAL_BATCH, layout, q.reduce_dtype)
        launches, got, passed = {}, None, True
        for start, env in STARTS.items():
            launch = launch_script(text, env)
            launches[start] = launch
            got, refused = _resolve(megatron, launch)
            diff = [] if got is None else [f"{k}: plan {want[k]!r}, Megatron {got[k]!r}" for k in want
                                           if got[k] != want[k]]
            ok = refused is None and not diff
            bad += not ok
            passed &= ok
            if not ok:
                print(f"FAIL {name} (CUDA_DEVICE_MAX_CONNECTIONS {start}): {refused or '; '.join(diff)}")
        conn = launches["unset"].env.get("CUDA_DEVICE_MAX_CONNECTIONS")
        wrong = ({"CUDA_DEVICE_MAX_CONNECTIONS": None} if conn == "1" else
                 {"CUDA_DEVICE_MAX_CONNECTIONS": "1"} if "unset CUDA_DEVICE_MAX" in text else None)
        refusal = None if wrong is None else _resolve(megatron, launches["unset"], wrong)[1]
        launch = launches["unset"]
        record[name] = {"plan": c.label(), "torchrun": launch.torchrun, "script": launch.script,
                        "argv": list(launch.argv),
                        "CUDA_DEVICE_MAX_CONNECTIONS": {s: la.env.get("CUDA_DEVICE_MAX_CONNECTIONS")
                                                        for s, la in launches.items()},
                        "megatron": got, "refused_with_the_variable_the_other_way": refusal}
        seen = record[name]["CUDA_DEVICE_MAX_CONNECTIONS"]
        rows.append([name, c.label(), launch.world_size, ", ".join(f"{s}: {v or 'unset'}" for s, v in seen.items()),
                     "pass" if passed else "FAIL", len(want), refusal or "-"])
    os.environ.clear()
    os.environ.update(saved_env)
    sys.argv = saved_argv
    body = (f"Megatron-LM `{args.commit}` (`git archive` of {args.repo}), cluster {CLUSTER}, global batch "
            f"{GLOBAL_BATCH}. Each row: the question's winner exported as `megatron.sh`, run by bash with a recording "
            "torchrun from an environment with `CUDA_DEVICE_MAX_CONNECTIONS` unset and at 1 (the variable as "
            "torchrun received it), then Megatron-LM's `parse_args`, `validate_args`, "
            "`core_transformer_config_from_args`, `get_megatron_ddp_config`, microbatch calculator and vocabulary "
            "padding on that exact argument list, compared field by field with the plan (`plan_settings`). "
            "Patched (no GPU, no Transformer Engine, Python 3.11): `get_device_arch_version` = 9 (Hopper), TE's "
            "fused RoPE kernel a placeholder, `typing.override` from typing_extensions. The last column: "
            "`validate_args` on the same line with the variable the other way.\n\n"
            + table(["question", "plan", "GPUs", "CUDA_DEVICE_MAX_CONNECTIONS at torchrun", "Megatron-LM",
                     "fields equal", "with the variable the other way"], rows)
            + f"\n\n{sum(r[4] == 'pass' for r in rows)} of {len(CASES)} launch as planned.\n")
    print(body)
    if args.json:
        Path(args.json).write_text(json.dumps({"commit": args.commit, "questions": record}, indent=1) + "\n")
    if args.markdown:
        shown = saved_argv[:saved_argv.index("--tree")] + saved_argv[saved_argv.index("--tree") + 2:]
        write_page(args.markdown, "Megatron-LM's parser on the exported launch scripts", body, argv=shown)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
