"""Prediction against measurement: the scores (step time, bubble, per-kind durations, memory, ranking) and the
validation grid's calibration protocol with its data-parallel rows, the asynchronous server's row and repeated grids
side by side. ``async_grid``: ``async_loop``, ``measured_parts``, ``predict_async``, ``predicted_parts``,
``trainer_rows``, ``update_s``. ``calibration``: ``ABLATIONS``, ``DP_ABLATIONS``, ``Calibration``, ``dp_graph``,
``grid_rows``, ``predict``. ``dp_calibration``: ``blocked_spans``, ``collective_times``, ``dp_replay_error``,
``dp_self_costs``, ``task_gaps``, ``unslowed_passes``. ``dp_modes``: ``HOOK_COLLECTIVES``, ``amortized_measured``,
``codec_costs``, ``codec_ns``, ``hook_time``, ``local_graph``, ``measured_hooks``, ``percentile``, ``predict_mode``,
``simulate_mode``, ``single_all_reduce``, ``split_mode``, ``split_steps``. ``dp_skew``: ``BUSY_KINDS``,
``busy_skew``, ``simulated_busy``, ``skew_fraction``, ``waits_each_step``. ``dp_transfer``: ``PARTS``,
``SHARDED_OPTIMIZER``, ``ZERO3_MODES``, ``describe_fit``, ``dp_run_costs``, ``fitted_slowdown``, ``fitted_stall``,
``idle_service``, ``measured_parts``, ``mode_costs``, ``pass_overlaps``, ``predicted_parts``, ``step_parts``,
``straggler``, ``wholly_after``, ``zero3_costs``. ``grid_runs``: ``PARTS``, ``RepeatRow``, ``repeat_rows``,
``run_summary``. ``scores``: ``GOAL_GAP``, ``GOAL_TAU``, ``NOISE_LIMIT``, ``TOO_NOISY_EXIT``, ``compare_pair``,
``decomposition``, ``describe_verdict``, ``exit_status``, ``format_tau``, ``half_difference``, ``kendall_tau``,
``kind_durations``, ``load_validation``, ``noise_verdict``, ``plan_goal``, ``plot_validation``, ``score_grid``,
``score_plan``, ``validation_summary``, ``verdict_line``. ``traces``: ``TracedRun``, ``format_rows``,
``memory_rows``, ``predict_traces``, ``traced_run``.
"""
