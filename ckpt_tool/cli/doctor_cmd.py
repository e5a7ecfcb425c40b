"""ckpt doctor (not yet implemented)."""
COMMANDS: list = []
