"""What a plan says and how to launch it: the planner's report (top-K, why the winner wins, the Pareto front) and its
exports to torchtitan, Megatron-LM and torch's schedule CSV. ``exports``: ``TORCH_SCHEDULE_CLASS``, ``PlanLayout``,
``plan_layout``, ``plan_schedule``, ``write_exports``, ``write_schedule_csv``. ``megatron``: ``DEFAULT_SOURCES``,
``DP_FLAGS``, ``FLAG_SOURCES``, ``FSDP_MODES``, ``MEGATRON_COMMIT``, ``REDUCE_FLAGS``, ``megatron_defaults``,
``megatron_dp_flags``, ``megatron_env``, ``megatron_layout``, ``megatron_notes``, ``megatron_script``;
``megatron_launch``: the script as bash launches it, and the checks against Megatron-LM. ``report``: ``format_plan``, ``pareto_front``, ``plot_pareto``,
``why_against``, ``why_beats``, ``why_winner``. ``torchtitan``: ``DP_SETTINGS``, ``TORCHTITAN_VERSION``,
``torchtitan_config``, ``torchtitan_notes``.
"""
