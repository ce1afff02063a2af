"""The schedule generators, each a pure function registered by name (importing this package registers them):
synchronous flush, looped multi-chunk, zero-bubble and controllable-memory schedules, the automatic zero-bubble
scheduler with its exact solvers, recomputation as an action, and schedules written as policies (a rule that
picks each rank's next action). ``controllable``: ``V_MIN_INTERVAL``, ``v_block_schedule``, ``v_half``,
``v_list_schedule``, ``v_min``, ``v_min_offsets``. ``flush``: ``gpipe``, ``one_f_one_b``. ``looped``:
``interleaved_1f1b``, ``looped_bfs``, ``looped_placement``. ``policy``: ``PassTimes``, ``Policy``, ``RankState``,
``from_policy``. ``recompute``: ``RECOMPUTE_PLACEMENTS``, ``check_recompute``, ``place_recompute``,
``recompute_full``, ``recompute_in_bubbles``. ``zb_auto``: ``ZBAutoOptions``, ``greedy_zero_bubble``,
``makespan``, ``peak_memory``, ``zb_auto``, ``zb_h2``. ``zb_exact``: ``STATUSES``, ``Refinement``, ``refine``,
``solve``. ``zb_milp``: ``SOLVERS``, ``refine_milp``. ``zero_bubble``: ``dualpipe_v``, ``interleaved_zb``,
``v_placement``, ``zb_h1``, ``zb_v``.
"""
