"""Per-rank torch.save files of DTensor and ShardedTensor state dicts, read statically as one model."""
