"""Where each consolidated DeepSpeed parameter lies in the ranks' partitions (no bytes read).

The algorithms of DeepSpeed's own ``zero_to_fp32.py`` (0.19), applied to
element counts instead of tensors (fixtures/deepspeed/LAYOUT.md):

- ZeRO-1/2: each parameter group's fp32 partitions, padding stripped, are
  concatenated over the ranks; the group's parameters follow one another in
  ``param_shapes`` order, each followed by its ``param_alignment_paddings``.
- ZeRO-3: every parameter of ``n`` elements is split on its own into
  ``ceil(n / world)`` elements per rank (zero-padded at the end); each rank's
  groups, concatenated, hold its piece of every parameter in order.

The results are Segments; SegmentSource reads them.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import accumulate
from math import ceil, prod

from ...io import Part, Segment, concat_slice

Shapes = Sequence[tuple[str, tuple[int, ...]]]


class MergeError(ValueError):
    """The partitions do not hold what the parameter shapes need."""


def _align(x: int, to: int) -> int:
    return to * ceil(x / to)


def zero2_group(shapes: Shapes, parts: Sequence[Part], world: int, itemsize: int,
                paddings: Sequence[int] | None = None) -> dict[str, list[Segment]]:
    """The segments of each parameter of one ZeRO-1/2 group.

    ``parts`` are the group's partitions in rank order, ``paddings`` the
    per-parameter alignment paddings (None: all 0). Checks, as DeepSpeed
    does, that the parameters consume the partitions up to the alignment
    of 2 x world elements.
    """
    if paddings is not None and len(paddings) != len(shapes):
        raise MergeError(f"{len(shapes)} parameters but {len(paddings)} alignment paddings")
    starts = [0, *accumulate(p.numel for p in parts)]
    total = starts[-1]
    out: dict[str, list[Segment]] = {}
    offset = 0
    for i, (name, shape) in enumerate(shapes):
        n = prod(shape)
        if offset + n > total:
            raise MergeError(f"parameter {name!r} ({n} elements at {offset}) lies past the {total} elements "
                             "the partitions hold")
        out[name] = concat_slice(parts, offset, n, itemsize, starts)
        offset += n + (paddings[i] if paddings is not None else 0)
    if _align(offset, 2 * world) != _align(total, 2 * world):
        raise MergeError(f"the parameters use {offset} of the {total} elements the partitions hold")
    return out


def zero3_params(shapes: Shapes, rank_parts: Sequence[Sequence[Part]], itemsize: int) -> dict[str, list[Segment]]:
    """The segments of every trainable ZeRO-3 parameter (all groups' shapes, merged in order).

    ``rank_parts[r]`` are rank r's flat groups in group order.
    """
    world = len(rank_parts)
    starts = [[0, *accumulate(p.numel for p in parts)] for parts in rank_parts]
    out: dict[str, list[Segment]] = {}
    offset = 0
    for name, shape in shapes:
        n = prod(shape)
        piece = ceil(n / world)
        segs: list[Segment] = []
        for r, parts in enumerate(rank_parts):
            take = min(piece, n - r * piece)
            if offset + piece > starts[r][-1] and take > 0:
                raise MergeError(f"parameter {name!r} needs elements {offset}..{offset + piece} of rank {r}'s "
                                 f"partition, which holds {starts[r][-1]}")
            segs += concat_slice(parts, offset, take, itemsize, starts[r])
        out[name] = _joined(segs)
        offset += piece
    if offset != starts[0][-1]:
        raise MergeError(f"the parameters use {offset} of the {starts[0][-1]} elements of each rank's partition")
    return out


def zero3_frozen(shapes: Shapes, fragments: Sequence[Mapping[str, Part]], itemsize: int) -> dict[str, list[Segment]]:
    """Frozen ZeRO-3 parameters: every rank's fragment concatenated, cut to the parameter's size."""
    out: dict[str, list[Segment]] = {}
    for name, shape in shapes:
        parts = []
        for r, frags in enumerate(fragments):
            part = frags.get(name)
            if part is None:
                raise MergeError(f"rank {r} holds no fragment of the frozen parameter {name!r}")
            parts.append(part)
        n = prod(shape)
        total = sum(p.numel for p in parts)
        if n > total:
            raise MergeError(f"the fragments of the frozen parameter {name!r} hold {total} elements, "
                             f"fewer than its {n}")
        out[name] = concat_slice(parts, 0, n, itemsize)
    return out


def _joined(segs: list[Segment]) -> list[Segment]:
    out: list[Segment] = []
    for seg in segs:
        s = seg
        if out and out[-1].source is s.source and out[-1].key == s.key and out[-1].offset + out[-1].length == s.offset:
            prev = out.pop()
            s = Segment(prev.source, prev.key, prev.offset, prev.length + s.length)
        out.append(s)
    return out
