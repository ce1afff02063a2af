"""Simulation in real units and the planner's search: a layout studied on a cluster, many simulations at once, data-
parallel modes amortized over steps, and the planner with its space, bounds and named layouts. ``against``:
``in_space``, ``parse_layout``, ``simulate_layout``. ``budget`` (zb-auto's memory limit in bytes as its activation
budget): ``SIZE_UNITS``, ``ActivationBudget``, ``activation_budget``, ``held_bytes``, ``parse_bytes``,
``zb_auto_options``. ``bounds``: ``Bounds``, ``MemoryRows``, ``memory_rows``,
``peak_activations``. ``comm_modes``: ``ModeStepTime``, ``amortized``, ``mode_step_time``. ``search``:
``SIMPLEST_FIRST``, ``PlanEntry``, ``PlanResult``, ``entry_of``, ``merge_ties``, ``order_digest``, ``plan``.
``space``: ``EXPERT_OVERLAP``, ``MAX_GLOBAL_BATCH``, ``MAX_MICROBATCHES``, ``PLAN_DP_MODES``, ``PlanConfig``, ``PlanSpace``, ``enumerate_configs``, ``shape_ok``, ``tp_choices``,
``why_empty``. ``study``: ``Study``, ``StudyResult``, ``dp_options``, ``exposed_comm``, ``load_study``,
``run_study``, ``study_from_dict``. ``sweep``: ``RecomputePoint``, ``Sweep``, ``SweepConfig``, ``applicable``,
``bubble_sweep``, ``predict_for_trace``, ``recompute_tradeoff``, ``run_sweep``, ``simulate_many``,
``trace_graph``, ``units_comparison``.
"""
