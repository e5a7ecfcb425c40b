"""Reader safety limits, in a module of their own.

Every reader and the scanner take a Limits; keeping it out of unpickle.py
lets paths that never unpickle (``ckpt scan``'s opcode walk, safetensors
headers) start without importing the restricted unpickler.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Limits:
    """Ceilings that keep a hostile file from exhausting memory (docs/reliability.md)."""

    max_pickle_bytes: int = 1 << 30
    max_tensors: int = 10_000_000
    max_key_length: int = 65_536
    max_header_bytes: int = 100_000_000
    max_member_bytes: int = 1 << 31  # decompressed size of a deflated zip member


DEFAULT_LIMITS = Limits()
