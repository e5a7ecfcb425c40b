"""``ckpt inspect``: what is in a checkpoint, from metadata alone."""
