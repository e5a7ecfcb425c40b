"""Megatron-LM's checkpoints: legacy ``mp_rank_XX`` folders merged by rules, and ``torch_dist`` DCP folders."""
from .legacy_folder import is_megatron_legacy, read_megatron_legacy
from .torch_dist import describe, unstack

__all__ = ["describe", "is_megatron_legacy", "read_megatron_legacy", "unstack"]
