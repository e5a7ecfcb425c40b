"""ckpt gate (not yet implemented)."""
COMMANDS: list = []
