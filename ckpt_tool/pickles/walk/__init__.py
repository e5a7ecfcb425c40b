"""The static symbolic walk over a pickle's opcodes: what it would import and call, never running it."""
