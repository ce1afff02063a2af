"""Profiling this machine for the simulator (``python -m real.profile``): every pass of every stage, messages and
collectives with their fits, the executor's own overheads, and the sections that time a data-parallel mode's own
work (compute slowed by communication, zero2/zero3's hook, ZeRO-3's gathers, PowerSGD's hooks, parameter copies, the
server's update); the machine's speed probe; and the calibration protocol that takes a profile guarded against the
host's slow spells. The cost file's schema is in ``machine``. ``comm``: ``BURST``, ``fit_warnings``. ``hook``:
``reduce_hook``. ``machine``: ``PROFILE_SCHEMA``, ``ProfileConfig``, ``StageProfile``, ``profile``,
``profile_stage``. ``overlap``: ``comm_slowdown``. ``param_copy``: ``param_copy``. ``powersgd``: ``HOOK_SPECS``,
``powersgd_section``. ``probe``: ``PROBE_ITERS``, ``PROBE_REPEATS``, ``probe_seconds``, ``spell``. ``protocol``:
``BUCKET_MB``, ``GRID_DP_MODES``, ``GRID_EXTRA_DP_MODES``, ``MODEL_SHAPE``, ``POWERSGD_RANK``, ``STALENESS``,
``SYNC_EVERY``, ``dp_buckets``, ``dp_config``, ``dp_shapes``, ``pipeline_config``, ``profile_machine``.
``psgd_backward``: ``hooks_in_backward``. ``server``: ``server_update_samples``. ``stats``: ``stat``. ``zero3``:
``MAX_REPS``, ``zero3_section``.
"""
