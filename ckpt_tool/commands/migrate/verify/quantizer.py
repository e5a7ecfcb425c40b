"""Verifying a quantized tensor's quantizer: scheme, scale, zero point and axis as the source pickled them."""
from __future__ import annotations

import struct

from ....model import TensorMeta
from ....writers import OutTensor


def same_number(a: object, b: object) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return struct.pack("<d", a) == struct.pack("<d", b)  # bit for bit: NaN and -0.0 included
    return bool(a == b)


def same_quantizer(where: str, expected: tuple[object, ...] | None, actual: tuple[object, ...] | None,
                   pairs: list[tuple[str, OutTensor, TensorMeta]]) -> str | None:
    """A problem when a quantized tensor's scheme, scale, zero point or axis differ; per-channel
    scales and zero points join ``pairs`` (compared bit for bit with the other tensors)."""
    if expected is None and actual is None:
        return None
    if expected is None or actual is None or len(expected) != len(actual) or str(expected[0]) != str(actual[0]):
        return f"{where}: quantizer is {_describe_q(actual)}, expected {_describe_q(expected)}"
    for i, (e, a) in enumerate(zip(expected[1:], actual[1:], strict=True), 1):
        if isinstance(e, TensorMeta):
            if not isinstance(a, TensorMeta):
                return f"{where}: quantizer part {i} is not a tensor"
            pairs.append((f"{where}<{'scales' if i == 1 else 'zero_points'}>", OutTensor(where, e, e.dtype), a))
        elif isinstance(e, list):
            if not isinstance(a, list) or len(a) != len(e) or not all(map(same_number, e, a)):
                return f"{where}: quantizer part {i} differs"
        elif not same_number(e, a):
            return f"{where}: quantizer {('scale', 'zero point', 'axis')[min(i, 3) - 1]} is {a!r}, expected {e!r}"
    return None


def _describe_q(q: tuple[object, ...] | None) -> str:
    return "none (not quantized)" if q is None else f"{q[0]}"
