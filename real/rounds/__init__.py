"""Several configurations run interleaved in rounds inside one process group (``torchrun -m real.rounds SPEC.json``):
the measurement protocol's worker, which times a speed probe around every run and runs again a run the host slowed.
``worker``: ``DesyncError``, ``fastest_probe``, ``foreign_cores``, ``machine_busy_seconds``, ``probe_seconds``,
``run_rounds``, ``slowdown``.
"""
