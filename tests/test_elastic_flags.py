"""``--elastic live``'s flags: bad input is one line and exit 2 before anything runs (no torchft needed)."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from analysis.cli.train import main as real_main
from real.faults.elastic import share

LIVE = ["--elastic", "live", "--lighthouse", "http://localhost:29510"]


@pytest.mark.parametrize(("argv", "message"), [
    (["--elastic", "live"], "live elastic training needs the lighthouse's address, e.g. http://host:29510 "
     "(flag --lighthouse)"),
    (["--schedule", "1f1b", "--pp", "1", "--microbatches", "1", "--lighthouse", "http://h:1"],
     "--lighthouse has no effect without --elastic live"),
    ([*LIVE, "--pp", "2", "--microbatches", "2", "--schedule", "1f1b"],
     "world size 1 (processes launched) does not equal pp x dp = 2 x 1 = 2; launch 2 processes or change pp/dp"),
    ([*LIVE, "--dp", "2"], "live elastic training takes the number of replicas from the quorum at every step; got "
     "dp 2: use dp 1 and start one replica group per replica (flag --dp)"),
    ([*LIVE, "--microbatches", "2"], "live elastic training at pp 1 trains each replica's share in one pass; got "
     "microbatches 2: use 1 (flag --microbatches)"),
    ([*LIVE, "--trace", "t.csv"], "--trace has no effect with --elastic live (a replica syncs its gradients "
     "through torchft; no traces, logs or tuning of the runtime's own sync)"),
    ([*LIVE, "--wait-replicas", "0"], "wait_replicas must be an integer >= 1, got 0 (flag --wait-replicas)"),
    ([*LIVE, "--replica-id", "-1"], "replica_id must be an integer in 0..1048575, got -1 (flag --replica-id)"),
    ([*LIVE, "--min-step-time", "-1"], "min_step_s must be in [0, 3600) seconds, got -1.0 (flag --min-step-time)"),
])
def test_bad_live_flags_are_one_line_and_exit_2(capsys, argv, message):
    with pytest.raises(SystemExit) as exc:
        real_main([*argv, "--steps", "2", "--batch-size", "4"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err == f"error: {message}\n", err


@pytest.mark.parametrize(("batch", "n", "rows"), [
    (6, 1, [(0, 6)]), (6, 2, [(0, 3), (3, 6)]), (7, 3, [(0, 3), (3, 5), (5, 7)]), (2, 3, [(0, 1), (1, 2), (2, 2)]),
])
def test_shares_are_contiguous_in_quorum_order_and_cover_the_batch(batch, n, rows):
    assert [share(batch, n, r) for r in range(n)] == rows


def test_a_schedule_that_cannot_run_every_share_of_the_microbatches_is_refused():
    from real.config import RunConfig
    from real.faults.elastic_pp import check_shares
    from schedules import ConfigError

    check_shares(RunConfig.of(steps=2, schedule="1f1b", pp=2, microbatches=4, batch_size=8))  # 4, 2, 1: all run
    with pytest.raises(ConfigError) as exc:
        check_shares(RunConfig.of(steps=2, schedule="interleaved-1f1b", pp=2, chunks=2, microbatches=4, batch_size=8))
    assert str(exc.value) == (
        "live elastic training: with 3 replicas a replica runs 1 of the 4 microbatches, which schedule "
        "'interleaved-1f1b' cannot (interleaved-1f1b needs microbatches to be a multiple of pp=2, got 1; try 2); "
        "use a schedule that runs any number of microbatches, e.g. 1f1b, gpipe or zb-h1")
