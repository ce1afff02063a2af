"""Every data-parallel mode of the runtime on its own gradient hooks: bucketed gradient sync scheduled by readiness,
ZeRO-2/3, the synchronous and asynchronous parameter servers, decentralized and local SGD, and the gradient codecs
with the bytes they should send. ``compress``: ``PROFILED``, ``Codec``, ``Pending``, ``codec_state``,
``dequantize``, ``load_codec``, ``make_codec``, ``profile_codecs``, ``quantize``. ``compress_bytes``:
``predicted_step_bytes``. ``peer_sync``: ``PEER_MODES``, ``PeerSync``, ``check_resume``, ``make_data_sync``. ``ps``:
``PSTrainer``, ``ParamServer``, ``ServerResult``, ``bucket_tag``, ``request_tag``, ``version_tag``. ``ps_async``:
``ANSWER``, ``FOLD``, ``AsyncPSTrainer``, ``AsyncParamServer``, ``read_ps_order``. ``sync``: ``GradSync``,
``make_buckets``. ``zero``: ``SHARDED_MODES``, ``ShardedSync``, ``full_state``, ``load_full``, ``make_sync``.
"""
