"""A torchrun worker shared by the multi-process tests: every labelled RunConfig of a JSON file, in one group.

    torchrun --nproc-per-node N tests/run_configs.py CONFIGS.json OUT.pt

Each configuration runs in turn in the same gloo process group (one Mesh per pp, dp, servers and ep); rank 0
``torch.save``s ``{label: {"losses", "params", "start_step", "sha", "trace", "memory"}}``. Launched through
``tests.conftest.launch_runs``; a test needing something else per run keeps a worker of its own.
"""

from __future__ import annotations

import json
import os
import sys
from datetime import timedelta
from pathlib import Path


def main(cfg_file: str, out_file: str) -> None:
    import torch
    import torch.distributed as dist

    from real import Mesh, RunConfig, make_plan, run

    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    meshes, results = {}, {}
    for label, d in json.loads(Path(cfg_file).read_text()).items():
        cfg = RunConfig.from_dict(d)
        key = (cfg.layout.pp, cfg.layout.dp, cfg.sync.servers, cfg.layout.ep)
        if key not in meshes:
            meshes[key] = Mesh.create(make_plan(cfg, dist.get_world_size()), "gloo", cfg.runtime.timeout_s)
        r = run(cfg, mesh=meshes[key])
        if dist.get_rank() == 0:
            results[label] = {"losses": r.losses, "params": r.parameters, "start_step": r.start_step,
                              "sha": r.param_sha256, "trace": r.trace, "memory": r.memory}
    if dist.get_rank() == 0:
        torch.save(results, out_file)
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main(*sys.argv[1:3])
