"""Proving what migrate wrote: bit-for-bit re-reads, values through casts, strict loads on each device."""
