"""ckpt migrate (not yet implemented)."""
COMMANDS: list = []
