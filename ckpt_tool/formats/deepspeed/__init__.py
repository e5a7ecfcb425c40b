"""DeepSpeed run folders (ZeRO 0-3, pipeline, tensor-parallel, universal) read as the consolidated model."""
