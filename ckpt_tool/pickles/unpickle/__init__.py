"""The restricted unpickler and the inert stand-ins it builds instead of running anything."""
