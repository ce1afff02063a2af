"""schedlab.real: DOING IT. The torch.distributed runtime for the same task graphs the simulator runs.

    torchrun --nproc-per-node 2 -m real --schedule 1f1b --pp 2 --microbatches 8 --trace out/real.csv

    >>> from real import Layout, RunConfig, run
    >>> result = run(RunConfig(layout=Layout(schedule="gpipe", microbatches=4), steps=3))  # one process
    >>> result.losses, result.trace                                                     # trace: rank 0 only
    >>> fit(UserModel(model=net, loss=F.cross_entropy, batches=source), schedule="1f1b", batch_size=16)  # any model
"""

from real.config import (
    DataConfig,
    FaultConfig,
    Layout,
    ModelConfig,
    OptimConfig,
    Plan,
    RunConfig,
    RuntimeConfig,
    SyncConfig,
    make_plan,
    partition,
)
from real.mesh import Mesh
from real.model_api import UserModel
from real.reference import reference_run
from real.train import fit, run
from real.trainer import RunResult, param_digest

__all__ = [
    "DataConfig",
    "FaultConfig",
    "Layout",
    "Mesh",
    "ModelConfig",
    "OptimConfig",
    "Plan",
    "RunConfig",
    "RunResult",
    "RuntimeConfig",
    "SyncConfig",
    "UserModel",
    "fit",
    "make_plan",
    "param_digest",
    "partition",
    "reference_run",
    "run",
]
