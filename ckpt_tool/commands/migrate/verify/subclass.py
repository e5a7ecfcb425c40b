"""Verifying a tensor subclass (torchao's quantized tensors): by the tensors it holds, each bit for bit."""
from __future__ import annotations

from collections.abc import Sequence

from ....model import TensorMeta
from ....writers import OutTensor


def inner_pairs(pairs: Sequence[tuple[str, OutTensor, TensorMeta]],
                 problems: list[str]) -> Sequence[tuple[str, OutTensor, TensorMeta]]:
    """A tensor subclass compared by the tensors it holds (``KEY.qdata``, ...), each bit for bit; the same
    class, layout and inner names on both sides, or a problem."""
    if not any(exp.source.subclass is not None or act.subclass is not None for _, exp, act in pairs):
        return pairs  # the common case, checked once per tensor
    out: list[tuple[str, OutTensor, TensorMeta]] = []
    for label, exp, act in pairs:
        e, a = exp.source.subclass, act.subclass
        if e is None and a is None:
            out.append((label, exp, act))
            continue
        if e is None or a is None or e.qualname != a.qualname or e.layout != a.layout:
            problems.append(f"{label}: is {a.qualname if a else 'a plain tensor'}, expected "
                            f"{e.qualname if e else 'a plain tensor'}")
            continue
        if exp.cast or (act.dtype, tuple(act.shape), act.strides) != (exp.source.dtype, tuple(exp.shape),
                                                                       exp.source.strides):
            problems.append(f"{label}: {e.qualname} has another dtype, shape or stride than in the source")
            continue
        got = dict(a.inner)
        if [n for n, _ in e.inner] != [n for n, _ in a.inner]:
            problems.append(f"{label}: {e.qualname} holds {sorted(got)}, expected {[n for n, _ in e.inner]}")
            continue
        if (exp.source.storage is None) != (act.storage is None):
            problems.append(f"{label}: {e.qualname} holds its data otherwise than in the source")
            continue
        if exp.source.storage is not None:  # a subclass over its own storage: those bytes first
            out.append((label, exp, act))
        out.extend((f"{label}.{n}", OutTensor(f"{label}.{n}", t, t.dtype), got[n]) for n, t in e.inner)
    return out
