"""torch.distributed.pipelining's formats: its schedule CSV written and read as torch's loader reads it, and its own
schedule classes taken as schedlab schedules. ``torch_classes``: ``TORCH_VERSION``, ``from_torch``,
``torch_schedule_names``. ``torch_csv``: ``TORCH_SKIPPED_KINDS``, ``check_csv_path``, ``read_torch_csv``,
``read_torch_csv_graph``, ``torch_csv_text``, ``write_torch_csv``.
"""
