"""Tensor subclasses in a diff: compared by the tensors they hold, and named where the two sides differ in kind.

A wrapper subclass (torchao's Int8Tensor) has no bytes of its own, so its
values are those of its inner tensors (``KEY.qdata``, ``KEY.scale``, ...);
a subclass on one side and a plain tensor (or another class) on the other has
the same dtype and shape and still holds something else, which is said.
"""
from __future__ import annotations

from collections.abc import Sequence

from ...model import TensorMeta


def inner_value_pairs(pairs: Sequence[tuple[TensorMeta, TensorMeta]]) -> list[tuple[TensorMeta, TensorMeta]]:
    """``pairs`` with each pair of same-class wrapper subclasses replaced by their inner tensors, pair by pair."""
    out: list[tuple[TensorMeta, TensorMeta]] = []
    for a, b in pairs:
        sa, sb = a.subclass, b.subclass
        if (sa is not None and sb is not None and a.storage is None and b.storage is None
                and sa.qualname == sb.qualname and [n for n, _ in sa.inner] == [n for n, _ in sb.inner]):
            out.extend((x, y) for (_, x), (_, y) in zip(sa.inner, sb.inner, strict=True))
        else:
            out.append((a, b))
    return out


def kind_warnings(a_tensors: Sequence[TensorMeta], b_tensors: Sequence[TensorMeta]) -> list[str]:
    """A warning naming the tensors under the same key that are a subclass on one side and not (or of another
    class) on the other; none when neither side holds a subclass (checked once per tensor)."""
    if all(t.subclass is None for t in a_tensors) and all(t.subclass is None for t in b_tensors):
        return []
    b_by_key = {t.key: t for t in b_tensors}
    pairs = [(t, b_by_key[t.key]) for t in a_tensors if t.key in b_by_key]
    differ = [a.key for a, b in pairs if _kind(a) != _kind(b)]
    if not differ:
        return []
    a, b = next((a, b) for a, b in pairs if a.key == differ[0])
    what = f"{_kind(a) if a.subclass else 'a plain tensor'} in A, {_kind(b) if b.subclass else 'a plain tensor'} in B"
    return [f"{len(differ)} tensor(s) hold another kind of data on each side (e.g. {differ[0]!r}: {what}), "
            f"though dtypes and shapes may agree: {', '.join(differ[:5])}"]


def _kind(t: TensorMeta) -> str | None:
    """The subclass a tensor is (its qualified name), None for a plain tensor."""
    return t.subclass.qualname if t.subclass else None
