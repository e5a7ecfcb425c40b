"""ckpt scan (not yet implemented)."""
COMMANDS: list = []
