"""Tied parameters of a target module: names that share one Parameter (GPT-2's lm_head and wte).

``module.state_dict()`` lists every name of a shared Parameter, so strict
loading reports a checkpoint that stores it once as missing the other
names; yet assigning the Parameter through any one name fills them all,
because they are the same object. diff reports such keys as filled by the tie.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol


class _Named(Protocol):
    """The part of nn.Module this needs (the torch adapter passes a real module)."""

    def named_parameters(self, prefix: str = ..., recurse: bool = ...,
                         remove_duplicate: bool = ...) -> Iterable[tuple[str, object]]: ...

    def named_buffers(self, prefix: str = ..., recurse: bool = ...,
                      remove_duplicate: bool = ...) -> Iterable[tuple[str, object]]: ...


@dataclass(frozen=True, kw_only=True)
class TiedKey:
    """A key the checkpoint lacks that the target ties to one it holds."""

    key: str  # missing from the checkpoint
    filled_by: str  # held by the checkpoint: the same Parameter in the target

    def to_json(self) -> dict[str, str]:
        return {"key": self.key, "filled_by": self.filled_by}


def tied_groups(module: _Named) -> list[tuple[str, ...]]:
    """Every group of two or more names for one Parameter (or buffer), in the module's order."""
    groups: dict[int, list[str]] = {}
    for name, value in module.named_parameters(remove_duplicate=False):
        groups.setdefault(id(value), []).append(name)
    for name, value in module.named_buffers(remove_duplicate=False):
        groups.setdefault(id(value), []).append(name)
    return [tuple(names) for names in groups.values() if len(names) > 1]


def filled_by_ties(missing: Sequence[str], held: Iterable[str], groups: Sequence[tuple[str, ...]]) -> list[TiedKey]:
    """The missing keys a tie fills: another name of the same Parameter is in the checkpoint."""
    present = set(held)
    out = []
    for key in missing:
        for group in groups:
            if key in group:
                source = next((name for name in group if name in present), None)
                if source is not None:
                    out.append(TiedKey(key=key, filled_by=source))
                break
    return out


def tie_advice(tied: Sequence[TiedKey]) -> str:
    """The load call that works, for diff's warnings."""
    pairs = ", ".join(f"{t.key!r} <- {t.filled_by!r}" for t in tied[:5]) + (" ..." if len(tied) > 5 else "")
    return (f"target ties {len(tied)} missing key(s) to one the checkpoint holds (one shared Parameter): {pairs}; "
            "the tie fills them: `missing, unexpected = model.load_state_dict(sd, strict=False)` loads every value "
            "(expect `missing` to list exactly these keys; a transformers model: call `model.tie_weights()` after)")
