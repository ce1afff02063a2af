"""Live elastic training on torchft: data-parallel replicas and pipeline replicas under a per-step quorum (checkpoints
themselves are real.checkpoint, which the training loop and every data-parallel mode use). ``elastic``:
``ELASTIC_MODES``, ``LiveConfig``, ``LiveResult``, ``check_live``, ``check_live_layout``, ``pause_report``,
``share``, ``train_live``. ``elastic_pp``: ``check_shares``, ``train_live_pipeline``.
"""
