"""``ckpt doctor``: can this environment run and verify checkpoints on its devices."""
