"""Format readers, chosen by the bytes of the input (see detect.py), one per format (registry.py).

Each reader (interface.py: Reader) returns a ``Loaded`` (the container tree, references, warnings,
byte sources); ``load`` locates the state_dict and returns a Checkpoint.
"""
from __future__ import annotations

import contextlib
import dataclasses
import gc
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from ..errors import CkptError, InputError, UnsupportedFormat
from ..format_names import Format
from ..io import is_url
from ..lazy import lazy_exports
from ..limits import DEFAULT_LIMITS, Limits
from ..model import Checkpoint
from . import detect as _detect
from .interface import Loaded, Reader, ReadOptions
from .options import DEFAULT_SOURCE, SourceOptions
from .registry import READERS, reader_for

if TYPE_CHECKING:
    from ..pickles.torch_rules import inputs as wo_input
    from .tp import TpRules


def _read_torch_blob(*args: Any, **kwargs: Any) -> Any:
    """torch.save bytes nested in a pickle (rare): formats/torchsave/inmemory.py is imported only for them."""
    from .torchsave import read_torch_blob

    return read_torch_blob(*args, **kwargs)


def read_file(path: str, options: ReadOptions) -> Loaded:
    """Read one file or folder (any format) into a Loaded, without locating."""
    if options.read_blob is None or options.read_part is None:
        options = dataclasses.replace(options, read_blob=options.read_blob or _read_torch_blob, read_part=read_file)
    if options.unsafe and is_url(path):
        raise InputError("--unsafe loads with torch.load, which reads local files only: download the file "
                         "first, then run the command on the copy", path)
    fmt = _detected(path, options)
    reader = reader_for(fmt)
    if options.unsafe and reader.unsafe_load:
        from .torchsave import read_unsafe

        loaded = read_unsafe(path, fmt, options)
    elif reader.composite:  # each of its files joined the walk when read_file read it
        loaded = reader.read(path, options)
    else:
        loaded = _read_walked(reader, path, options)
    if loaded.weights_only is None:
        loaded = dataclasses.replace(loaded, weights_only=_weights_only_input(path, loaded.format, options))
    return loaded.with_warnings_first(*_hints(path, fmt, loaded))


def _detected(path: str, options: ReadOptions) -> Format:
    """detect.py's verdict; bytes no reader takes are still walked for what they would call (a .npy's pickle)."""
    try:
        return _detect.detect(path)
    except UnsupportedFormat as exc:  # bytes no reader takes, which another loader may still unpickle (a .npy)
        if not options.walk:
            raise
        from .checkpoint import name_calls

        raise name_calls(path, exc, options.limits) from exc


def _read_walked(reader: Reader, path: str, options: ReadOptions) -> Loaded:
    """One file's reader, with the static walk's findings joined when the file gives reason (findings.py)."""
    try:
        loaded = reader.read(path, options)
    except InputError as exc:
        if not options.walk:
            raise
        from .checkpoint import name_calls

        raise name_calls(path, exc, options.limits) from exc
    from .checkpoint import join_walk, needs_walk

    return join_walk(loaded, path, options.limits) if options.walk and needs_walk(loaded, path) else loaded


def _hints(path: str, fmt: Format, loaded: Loaded) -> list[str]:
    """Warnings put first, in order: the rank-file hints, then an extension that says another format."""
    hints: list[str] = []
    if fmt == Format.TORCH_ZIP and path.endswith("_states.pt"):  # the names of DeepSpeed's rank files
        from .deepspeed import rank_file_hint

        hints.append(rank_file_hint(path) or "")
    if fmt == Format.TORCH_ZIP and any(r.name in ("DTensor", "ShardedTensor") for r in loaded.references):
        from .ranks import lone_rank_hint

        hints.append(lone_rank_hint(loaded.root, path) or "")
    hints.append(_detect.extension_warning(path, loaded.format) or "")
    return [h for h in hints if h]


def _weights_only_input(path: str, fmt: Format, options: ReadOptions) -> wo_input.WeightsOnlyInput | None:
    """What torch.load(weights_only=True) meets in a file whose reader recorded nothing (see wo_input.py)."""
    said = reader_for(fmt).weights_only(path) if fmt in READERS else None
    if said is not None:
        return said
    if options.unsafe:  # the real unpickler ran: the restricted readers say what weights_only would meet
        try:
            return read_file(path, dataclasses.replace(options, unsafe=False)).weights_only
        except CkptError:
            return None
    return None


def load(
    path: str | os.PathLike[str],
    *,
    key: str | None = None,
    unsafe: bool = False,
    limits: Limits = DEFAULT_LIMITS,
    read_values: bool = False,
    tp_rules: TpRules | None = None,
    unstack_layers: bool = False,
) -> Checkpoint:
    """Read a checkpoint's metadata safely: no code runs and no tensor bytes are read.

    Non-tensor values a file keeps apart from its metadata (a DCP folder's
    bytes items: an optimizer's ``lr``, a step count) are left unread and
    described (model.Deferred) unless ``read_values`` asks for them, as
    migrate and ``diff --values`` do. ``tp_rules`` says how the tensor-parallel
    shards of a DeepSpeed run merge (formats/tp/tprules.py). ``unstack_layers`` gives a Megatron
    torch_dist checkpoint's stacked layers their per-layer names (formats/megatron/torch_dist.py).
    """
    source = SourceOptions(key=key, unsafe=unsafe, limits=limits, tp_rules=tp_rules, unstack_layers=unstack_layers)
    return read_checkpoint(path, source, read_values=read_values)


def read_checkpoint(path: str | os.PathLike[str], source: SourceOptions = DEFAULT_SOURCE, *,
                    read_values: bool = False) -> Checkpoint:
    """``load`` for the commands: the source options as one value (formats/options.py)."""
    from .checkpoint import build_checkpoint as build

    p = os.fspath(path)
    if not is_url(p) and not os.path.lexists(p):
        raise InputError("no such file or folder", p)
    with gc_paused():
        loaded = read_file(p, ReadOptions(limits=source.limits, unsafe=source.unsafe, tp_rules=source.tp_rules))
        try:
            if source.unstack_layers:
                from .megatron import unstack

                loaded = unstack(loaded, p)
            ck = build(loaded, p, source.key, source.limits)
            if read_values and loaded.deferred:  # walking 200,000 entries of any other file would find none
                from .dcp import with_values

                ck = with_values(ck, source.limits)
            return ck
        except BaseException:
            for s in loaded.sources:  # a long-running caller must not leak a descriptor per bad file
                s.close()
            raise


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic GC while building metadata for (possibly) 200,000 tensors.

    Reading allocates many small acyclic objects; each GC generation-2 pass
    rescans all of them, which made reading superlinear in the tensor count.
    Reference counting still frees everything as usual.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()

if TYPE_CHECKING:
    from .options import (
        Keyed as Keyed,
        Limited as Limited,
        Predicting as Predicting,
        TpRulesFile as TpRulesFile,
        Unpickling as Unpickling,
        Unstacking as Unstacking,
    )
    from .quantization import (
        DeclaredQuantization as DeclaredQuantization,
        companion_keys as companion_keys,
        config_method as config_method,
        declared as declared,
    )

# What other packages import from this one, each name imported from its module on first use
# (ckpt_tool/lazy.py); tests/test_surfaces.py keeps it the only way in.
EXPORTS: dict[str, tuple[str, ...]] = {
    "options": ("Keyed", "Limited", "Predicting", "TpRulesFile", "Unpickling", "Unstacking"),
    "quantization": ("DeclaredQuantization", "companion_keys", "config_method", "declared"),
}
__getattr__ = lazy_exports(__name__, EXPORTS)
__all__ = [
    "DEFAULT_SOURCE", "DeclaredQuantization", "Keyed", "Limited", "Loaded", "Predicting", "ReadOptions", "Reader",
    "SourceOptions", "TpRulesFile", "Unpickling", "Unstacking", "companion_keys", "config_method", "declared", "load",
    "read_checkpoint", "read_file", "reader_for",
]
