"""The foundation every floor stands on: schedlab's errors for bad input with the field checks that raise them, and the
one output-path policy (checked early, written whole) that every writer uses. ``errors``: ``CheckpointError``,
``ClusterError``, ``ConfigError``, ``CostFileError``, ``OutputError``, ``SchedlabError``, ``ScheduleError``,
``check_choice``, ``check_fraction``, ``check_multiple_of_pp``, ``check_positive``, ``check_positive_ints``,
``choice``, ``quote``. ``outputs``: ``atomic_write``, ``atomic_write_all``, ``check_distinct``,
``check_name_length``, ``check_output_dir``, ``check_output_file``, ``replace_folder``, ``write_files_into``. ``procs``:
``die_with_parent`` (no child process outlives its parent).
"""
