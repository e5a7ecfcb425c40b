"""``ckpt scan``: every pickle in the inputs and what it would import, never run."""
