"""What migrate cannot write back exactly stops the run, naming the keys, before anything is written.

A tensor subclass (torchao's Int8Tensor, Float8Tensor, ...) has no bytes of
its own: its data are the tensors its state holds (``qdata``, ``scale``,
``zero_point``). Only a torch output can hold it, written back as the source
pickled it; casting it would cast nothing meaningful. A user rule (``--drop``)
that leaves such a key out is the way past.
"""
from __future__ import annotations

from collections.abc import Sequence

from ...errors import UsageError
from ...format_names import OutputFormat
from ...writers.base import OutTensor


def _shown(keys: Sequence[str]) -> str:
    more = f" and {len(keys) - 5} more" if len(keys) > 5 else ""
    return ", ".join(repr(k) for k in sorted(keys)[:5]) + more


def _drop_hint(keys: Sequence[str]) -> str:
    return " ".join(f"--drop '{k}'" for k in sorted(keys)[:3]) + (" ..." if len(keys) > 3 else "")


def refuse_subclasses(tensors: Sequence[OutTensor], fmt: OutputFormat) -> None:
    """Raise (exit 2) naming the tensor subclasses the output would drop or rewrite."""
    subs = [t for t in tensors if t.source.subclass is not None]
    if not subs:
        return
    classes = sorted({t.source.subclass.qualname for t in subs if t.source.subclass is not None})
    cast = [t.source.key for t in subs if t.cast]
    if cast:
        raise UsageError(
            f"cannot cast tensor subclass(es) {_shown(cast)} ({', '.join(classes)}): their data are the tensors "
            "they hold (quantized codes and scales), not values of their dtype; migrate without --dtype, or leave "
            f"them out with {_drop_hint(cast)}")
    if fmt is not OutputFormat.TORCH_ZIP:
        keys = [t.source.key for t in subs]
        raise UsageError(
            f"a {fmt} output cannot hold tensor subclass(es) {_shown(keys)} ({', '.join(classes)}): only a .pth "
            f"writes them back as the source pickled them; write a .pth, or leave them out with {_drop_hint(keys)}")
