"""What migrate cannot write back exactly stops the run, naming the keys, before anything is written.

A tensor subclass (torchao's Int8Tensor, Float8Tensor, ...) has no bytes of
its own: its data are the tensors its state holds (``qdata``, ``scale``,
``zero_point``). Only a torch output can hold it, written back as the source
pickled it; casting it would cast nothing meaningful. A user rule (``--drop``)
that leaves such a key out is the way past.

A checkpoint that declares quantization (``quantization_config``, or scale and
zero-point companions of its weights) refuses a ``--dtype`` cast, which would
cast raw codes without their scales, and an hf folder is never written under
a config declaring a quantization its weights no longer carry.
"""
from __future__ import annotations

import posixpath
from collections.abc import Sequence

from ...errors import UsageError
from ...format_names import OutputFormat
from ...formats import companion_keys, config_method, declared
from ...model import Checkpoint
from ...writers import OutTensor
from .plan import MigratePlan


def _shown(keys: Sequence[str]) -> str:
    more = f" and {len(keys) - 5} more" if len(keys) > 5 else ""
    return ", ".join(repr(k) for k in sorted(keys)[:5]) + more


def _drop_hint(keys: Sequence[str]) -> str:
    return " ".join(f"--drop '{k}'" for k in sorted(keys)[:3]) + (" ..." if len(keys) > 3 else "")


def refuse_subclasses(tensors: Sequence[OutTensor], fmt: OutputFormat, sanitize: bool = False) -> None:
    """Raise (exit 2) naming the tensor subclasses the output would drop or rewrite."""
    subs = [t for t in tensors if t.source.subclass is not None]
    if not subs:
        return
    classes = sorted({t.source.subclass.qualname for t in subs if t.source.subclass is not None})
    if sanitize:
        keys = [t.source.key for t in subs]
        raise UsageError(
            f"--sanitize cannot make tensor subclass(es) {_shown(keys)} ({', '.join(classes)}) load with "
            "torch.load(weights_only=True): their class is the tensor; migrate without --sanitize, or leave them "
            f"out with {_drop_hint(keys)}")
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


def refuse_quantized_rewrites(ck: Checkpoint, plan: MigratePlan, tensors: Sequence[OutTensor]) -> None:
    """Raise (exit 2) before a cast of a checkpoint that declares quantization, or before an hf folder whose
    copied config declares a quantization the written weights no longer have."""
    q = declared(ck)
    cast = [t.source.key for t in tensors if t.cast]
    if q is not None and cast:
        what = "; ".join(filter(None, (
            f"{q.method} in {q.config_file}" if q.method else "",
            f"scale/zero-point companions {_shown(list(q.companions))}" if q.companions else "")))
        raise UsageError(
            f"the source declares quantization ({what}): --dtype would cast its raw quantized codes without "
            f"their scales ({len(cast)} tensor(s): {_shown(cast)}); ckpt does not dequantize: migrate without "
            "--dtype", plan.source.path)
    hf = plan.output.hf
    if plan.output.format is not OutputFormat.HF_FOLDER or hf is None or hf.copy_from is None:
        return
    configs = [f for f in hf.files if posixpath.basename(f) == "config.json"]
    if not configs:
        return
    from ...formats.hf import read_json
    from ...io import paths

    for rel in configs:
        found = config_method(read_json(paths.join(hf.copy_from, rel)))
        if found is None:
            continue
        written = {t.source.key for t in tensors}
        lost = [k for k in (q.companions if q is not None else ()) if k not in written]
        if lost or not companion_keys(t.key for t in tensors):
            why = (f"the rules leave out {_shown(lost)}" if lost
                   else "the weights written hold none of its scales or zero points")
            raise UsageError(
                f"{rel} (copied from {hf.copy_from}) declares quantization {found[0]}, but {why}: no loader would "
                "read the folder right; keep the scale tensors, or give --config-from a folder whose config "
                "matches the weights", plan.source.path)
