"""ckpt diff (not yet implemented)."""
COMMANDS: list = []
