"""Data parallelism as a definition: the modes (how a pipeline task graph gains its gradient collectives, optimizer
steps and server updates) and the gradient codecs with the bytes they move, defined once for the simulator and the
runtime. ``codecs``: ``CODECS``, ``Compression``, ``buffer_bytes``, ``check_dp_mode``, ``parse_compression``,
``powersgd_messages``, ``powersgd_split``. ``modes``: ``APPROXIMATE_MODES``, ``DP_MODES``, ``PEER_SELECTIONS``,
``ZERO3_READS``, ``DPPlan``, ``DataParallelGraph``, ``add_data_parallel``, ``exchange_peers``, ``random_peer``,
``ring_neighbours``, ``server_update``.
"""
