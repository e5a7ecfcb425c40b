"""What every reader returns, and how it becomes a Checkpoint: the state_dict located and described."""
