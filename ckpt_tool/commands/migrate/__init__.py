"""``ckpt migrate``: plan, atomic write, verify; consolidation of sharded runs, in one or several processes."""
