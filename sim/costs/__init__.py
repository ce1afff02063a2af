"""How long each task takes and what it holds: the cost models the engine consults (uniform, analytic transformer in
real units, profiled from a cost file) and the pieces they are built from: clusters and devices, the GPU operation
model, the model shape, collectives, the parallel layout, compression, recomputation, parameter copies and the
asynchronous parameter server. ``async_ps``: ``AsyncPSResult``, ``Cycle``, ``TrainerStats``, ``check_speeds``,
``cycle_of``, ``simulate_async_ps``, ``update_time``. ``calibrated``: ``TraceCalibration``, ``from_trace``,
``load_costs``, ``occupancy``, ``trace_calibration``. ``cluster``: ``CLUSTER_PRESETS``, ``DEVICE_PRESETS``,
``Cluster``, ``Device``, ``DeviceSpec``, ``KeyCheck``, ``Link``, ``check_table``, ``cluster_from_dict``,
``cluster_preset``, ``key_choice``, ``key_flag``, ``key_fraction``, ``key_layer_counts``, ``key_positive``,
``key_positive_int``, ``key_seconds``, ``key_string``, ``load_cluster``, ``parse_placement``, ``read_toml``.
``collectives``: ``ALGORITHMS``, ``hierarchical_allreduce``, ``ps_transfer``, ``ring_allreduce``, ``ring_gather``,
``tree_allreduce``. ``compression``: ``compressed_bytes``, ``layer_shapes``, ``powersgd_ratio``, ``stage_shapes``.
``cost_file``: ``load_profile``, ``warn_once``. ``devices``: ``COMM_SLOWDOWN``, ``DEVICE_MODELS``, ``MAMF``,
``transferred_gemm``. ``gpu_model``: ``RECOMPUTE_MODES``, ``DeviceModel``, ``GemmEfficiency``, ``LayerCosts``,
``Op``, ``flash_attention_flops``, ``layer_ops``. ``parallel``: ``EMBEDDING_ALLREDUCE``, ``PS_MODES``, ``DPGroup``,
``ParallelConfig``. ``param_copy``: ``PARAM_COPY_FIELDS``, ``ParamCopy``, ``charge_param_copies``,
``param_copy_section``. ``profiled``: ``PROFILE_SCHEMA``, ``PS_MODES``, ``ProfiledCosts``, ``StageCosts``,
``step_time``. ``recompute_modes``: ``PLANNER_MODES``, ``check_recompute``, ``key_recompute``, ``layer_every``.
``transformer``: ``ATTENTION_KINDS``, ``MODEL_PRESETS``, ``TransformerConfig``, ``model_from_dict``,
``model_preset``, ``partition_layers``. ``transformer_costs``: ``ADAM_BYTES_PER_PARAM``, ``TransformerCosts``.
``uniform``: ``CostModel``, ``UniformCosts``, ``memoized_durations``.
"""
