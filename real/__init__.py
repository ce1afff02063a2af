"""schedlab.real: the torch.distributed runtime for the same task graphs (a later issue fills it)."""
