"""Whether a checkpoint declares quantization: ``quantization_config`` in its config, or the scale and
zero-point companions quantization libraries save beside a weight.

A quantized weight's values are codes that mean nothing without their
scales: casting them (``--dtype``) or writing them under a config that no
longer matches would produce a model no loader reads right. ckpt does not
dequantize (a later issue); it says what the checkpoint declares so that
inspect can show it and migrate can refuse what would break it.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..model import Checkpoint

# The last component of a key that is a quantized weight's companion, as the libraries name them:
# FP8 block scales (DeepSeek-V3, Qwen FP8: weight_scale_inv), compressed-tensors and FP8 per-tensor
# (weight_scale, weight_zero_point, weight_global_scale), GPTQ/AWQ (qweight, qzeros, g_idx), bitsandbytes
# (SCB, absmax, nested_absmax, quant_map, quant_state.*). These names mean quantization on their own.
COMPANIONS = frozenset({
    "weight_scale_inv", "weight_scale", "weight_zero_point", "weight_global_scale", "weight_packed", "qweight",
    "qzeros", "g_idx", "SCB", "absmax", "nested_absmax", "quant_map", "nested_quant_map",
})
COMPANION_SUFFIXES = ("_scale_inv", "_zero_point", "_absmax")
_STATE_MARKER = ".quant_state."  # bitsandbytes 4-bit: weight.quant_state.bitsandbytes__nf4
# Names that ordinary models use too: a companion only beside the sibling that makes it one (in the same
# module): GPTQ's scales beside qweight, compressed-tensors' weight_shape beside weight_packed, static FP8's
# activation scales beside weight_scale, optimum-quanto's weight._data beside weight._scale.
_WITH_SIBLING = {
    "scales": ("qweight", "qzeros"), "weight_shape": ("weight_packed",),
    "input_scale": ("weight_scale", "weight_scale_inv"), "output_scale": ("weight_scale", "weight_scale_inv"),
    "_data": ("_scale",), "_scale": ("_data",),
}


def _split(key: str) -> tuple[str, str]:
    head, _, last = key.rpartition(".")
    return head, last


def is_companion(key: str, keys: frozenset[str] | set[str] = frozenset()) -> bool:
    """``key`` names a scale, zero point or packed part of a quantized weight (by the libraries' names);
    ``keys`` (all the checkpoint's keys) decides the names ordinary models use too."""
    head, last = _split(key)
    if last in COMPANIONS or last.endswith(COMPANION_SUFFIXES) or _STATE_MARKER in key:
        return True
    siblings = _WITH_SIBLING.get(last)
    if siblings is None and last.endswith("_scales"):  # MXFP4 (gpt-oss): X_scales beside X_blocks
        siblings = (last[: -len("_scales")] + "_blocks",)
    prefix = f"{head}." if head else ""
    return siblings is not None and any(prefix + s in keys for s in siblings)


# Substrings every companion name holds (tests/formats/test_declared_quantization.py checks it): a few C-speed
# substring searches of the joined keys rule out the common checkpoint, 200,000 weights and biases, without a
# call per key.
TOKENS = ("_scale", "scales", "zero_point", "_packed", "qweight", "qzeros", "g_idx", "SCB", "absmax", "quant_map",
          "weight_shape", "_data", "quant_state")


def companion_keys(keys: Iterable[str]) -> list[str]:
    """The keys among ``keys`` that are companions of quantized weights, in order."""
    listed = list(keys)
    joined = "\n".join(listed)
    if not any(token in joined for token in TOKENS):
        return []
    every = set(listed)
    return [k for k in listed if is_companion(k, every)]


def config_method(config: Mapping[str, Any] | None) -> tuple[str, dict[str, Any]] | None:
    """(method, quantization_config) when a model config declares quantization, else None."""
    if not isinstance(config, Mapping):
        return None
    q = config.get("quantization_config")
    if not isinstance(q, Mapping) or not q:
        return None
    method = q.get("quant_method") or q.get("quantization_method") or q.get("format") or "unnamed"
    return str(method), dict(q)


@dataclass(frozen=True)
class DeclaredQuantization:
    """What a checkpoint says about its quantization (see the module docstring)."""

    method: str | None  # quantization_config's quant_method; None when only companions say it
    config_file: str | None  # the file declaring it ("config.json"), None without one
    config: Mapping[str, Any] = field(default_factory=dict)  # quantization_config as written
    companions: tuple[str, ...] = ()  # tensor keys that are scales or zero points of quantized weights

    def describe(self) -> str:
        """inspect's ``quantized:`` line."""
        parts = []
        if self.method is not None:
            details = ", ".join(f"{k} {v}" for k, v in self.config.items() if k != "quant_method"
                                and isinstance(v, (str, int, float, list)) and len(str(v)) < 40)
            where = f"quantization_config in {self.config_file}" + (f": {details}" if details else "")
            parts.append(f"{self.method} ({where})")
        if self.companions:
            shown = ", ".join(self.companions[:3]) + (" ..." if len(self.companions) > 3 else "")
            parts.append(f"{len(self.companions)} scale/zero-point companion tensor(s): {shown}")
        return "; ".join(parts) + "; not dequantized by ckpt: --dtype casts are refused"

    def to_json(self) -> dict[str, Any]:
        return {"method": self.method, "config_file": self.config_file, "config": dict(self.config),
                "companions": list(self.companions)}


def declared(ck: Checkpoint) -> DeclaredQuantization | None:
    """What ``ck`` declares: its library folder's config.json, and the companions among its tensors."""
    folder = ck.metadata.get("hf_folder") if isinstance(ck.metadata, Mapping) else None
    found = config_method(folder.get("config")) if isinstance(folder, Mapping) else None
    companions = tuple(companion_keys(ck.keys))
    if found is None and not companions:
        return None
    method, config = found if found is not None else (None, {})
    return DeclaredQuantization(method, "config.json" if found is not None else None, config, companions)
