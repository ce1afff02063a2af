"""Where a run's batches come from: synthetic data or a user's batch function (``sources``), token files cut into
windows (``tokens``) from documents and tokenizers (``documents``, ``python -m real.data prepare``), an exactly-once
resumable order of windows (``sampler``) and the data master that leases shards through the rendezvous store
(``datamaster``). ``datamaster``: ``DataMaster``, ``LeaseClient``, ``MasterBatches``, ``MasterReport``,
``rendezvous_store``. ``documents``: ``EOT_CANDIDATES``, ``Tokenizer``, ``byte_tokenizer``, ``encode_documents``,
``load_tokenizer``, ``parse_train_spec``, ``read_documents``, ``train_bpe``. ``sampler``: ``EpochSampler``.
``sources``: ``NOISE``, ``DataSource``, ``GlobalBatches``, ``SyntheticData``, ``make_batch``, ``microbatches``,
``step_seed``. ``tokens``: ``BYTE_VOCAB``, ``DTYPES``, ``TokenBatches``, ``TokenFile``, ``prepare``,
``sidecar_vocab``.
"""
