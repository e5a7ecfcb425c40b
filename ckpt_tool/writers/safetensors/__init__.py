"""safetensors outputs: one file, or a sharded set with its index."""
