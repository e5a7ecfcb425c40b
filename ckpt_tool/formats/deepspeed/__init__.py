"""DeepSpeed run folders (ZeRO 0-3, any number of ranks) read as the consolidated model."""
