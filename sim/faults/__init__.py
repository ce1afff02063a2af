"""Failures over a long job: goodput under checkpoint-and-restart and under live, per-step-quorum fault tolerance, in
closed form and simulation. ``failures``: ``CheckpointPolicy``, ``ElasticResult``, ``FailureModel``,
``GoodputResult``, ``daly_interval``, ``daly_wall_time``, ``simulate_elastic``, ``simulate_job``,
``sweep_intervals``, ``young_interval``. ``live``: ``LiveCosts``, ``checkpoint_interval``, ``live_failure_cost``,
``live_goodput``, ``restart_goodput``.
"""
