"""Format readers, chosen by the bytes of the input (see detect.py).

Each reader returns a ``Loaded`` (the container tree, references, warnings,
byte sources); ``load`` locates the state_dict and returns a Checkpoint.
"""
from __future__ import annotations

import contextlib
import dataclasses
import gc
import importlib
import os
from collections.abc import Callable, Iterator
from typing import Any

from ..errors import CkptError, InputError, UnsupportedFormat
from ..format_names import Format
from ..io.bytesource import is_url
from ..limits import DEFAULT_LIMITS, Limits
from ..model import Checkpoint, TensorMeta
from ..pickles.torch_rules import inputs as wo_input
from . import detect as _detect
from .interface import Loaded, ReadOptions
from .options import DEFAULT_SOURCE, SourceOptions
from .tp import TpRules

Reader = Callable[[str, ReadOptions], Loaded]

# format -> "module:function", imported on first use so each path
# imports only what it needs (and none of them imports torch). SHARDED is read
# by read_file itself (it reads each shard through read_file); detect never
# returns TORCHSCRIPT or DILL (the zip and pickle readers tell them).
_READERS: dict[Format, str] = {
    Format.TORCH_ZIP: "torchsave.archive:read_torch_zip",
    Format.SAFETENSORS: "safetensors.header:read_safetensors",
    Format.TORCH_LEGACY: "torchsave.legacy:read_legacy",
    Format.PICKLE: "torchsave.plainpickle:read_pickle",
    Format.DCP: "dcp.metadata:read_dcp",
    Format.TORCH_TAR: "torchsave.tar:read_legacy_tar",
    Format.DEEPSPEED: "deepspeed.read:read_deepspeed",
    Format.MEGATRON_LEGACY: "megatron.legacy_folder:read_megatron_legacy",
    Format.TORCH_EXPORT: "torchsave.export:read_export",
    Format.DIST_SAFETENSORS: "safetensors.distributed:read_distributed",
    Format.RANKS: "ranks.read:read_ranks",
    Format.NUMPY: "numpy.read:read_npy",
    Format.NPZ: "numpy.read:read_npz",
}
_UNSAFE_READS = frozenset({Format.TORCH_ZIP, Format.TORCH_LEGACY, Format.PICKLE, Format.TORCH_TAR})


def reader_for(fmt: Format) -> Reader:
    module_name, func = _READERS[fmt].split(":")
    module = importlib.import_module(f"{__name__}.{module_name}")
    reader: Reader = getattr(module, func)
    return reader


def _read_torch_blob(*args: Any, **kwargs: Any) -> Any:
    """torch.save bytes nested in a pickle (rare): formats/torchsave/inmemory.py is imported only for them."""
    from .torchsave.inmemory import read_torch_blob

    return read_torch_blob(*args, **kwargs)


def read_file(path: str, options: ReadOptions) -> Loaded:
    """Read one file or folder (any format) into a Loaded, without locating."""
    if options.read_blob is None:
        options = dataclasses.replace(options, read_blob=_read_torch_blob)
    if options.unsafe and is_url(path):
        raise InputError("--unsafe loads with torch.load, which reads local files only: download the file "
                         "first, then run the command on the copy", path)
    try:
        fmt = _detect.detect(path)
    except UnsupportedFormat as exc:  # bytes no reader takes, which another loader may still unpickle (a .npy)
        if not options.walk:
            raise
        from .checkpoint.findings import name_calls

        raise name_calls(path, exc, options.limits) from exc
    if options.unsafe and fmt in _UNSAFE_READS:
        from .torchsave.unsafe import read_unsafe

        loaded = read_unsafe(path, fmt, options)
    elif fmt == Format.SHARDED:
        from .hf.index import read_sharded

        parts: list[tuple[str, Loaded]] = []

        def read_part(p: str, o: ReadOptions) -> Loaded:
            part = read_file(p, o)
            parts.append((os.path.basename(p), part))
            return part

        loaded = read_sharded(path, options, read_part, _shard_tensors)
        loaded.weights_only = wo_input.WeightsOnlyInput(wo_input.SHARDED, path=path, parts=tuple(
            (name, part.weights_only) for name, part in parts))
    elif fmt == Format.HF_FOLDER:  # a library's folder: the weights it names, read by their own reader
        from .hf.read import read_folder

        loaded = read_folder(path, options, read_file, _shard_tensors)
    else:
        try:
            loaded = reader_for(fmt)(path, options)
        except InputError as exc:
            if not options.walk:
                raise
            from .checkpoint.findings import name_calls

            raise name_calls(path, exc, options.limits) from exc
        from .checkpoint.findings import join_walk, needs_walk

        if options.walk and needs_walk(loaded, path):
            join_walk(loaded, path, options.limits)
    if loaded.weights_only is None:
        loaded.weights_only = _weights_only_input(path, loaded.format, options)
    warning = _detect.extension_warning(path, loaded.format)
    if warning:
        loaded.warnings.insert(0, warning)
    if fmt == Format.TORCH_ZIP and any(r.name in ("DTensor", "ShardedTensor") for r in loaded.references):
        from .ranks.files import lone_rank_hint

        rank_hint = lone_rank_hint(loaded.root, path)
        if rank_hint:
            loaded.warnings.insert(0, rank_hint)
    if fmt == Format.TORCH_ZIP and path.endswith("_states.pt"):  # the names of DeepSpeed's rank files
        from .deepspeed.files import rank_file_hint

        hint = rank_file_hint(path)
        if hint:
            loaded.warnings.insert(0, hint)
    return loaded


def _weights_only_input(path: str, fmt: Format, options: ReadOptions) -> wo_input.WeightsOnlyInput | None:
    """What torch.load(weights_only=True) meets in a file whose reader recorded nothing (see wo_input.py)."""
    if fmt == Format.SAFETENSORS:
        return wo_input.WeightsOnlyInput(wo_input.SAFETENSORS, path=path)
    if fmt == Format.TORCH_TAR:  # torch >= 2.6 refuses the tar format under weights_only whatever it holds
        return wo_input.WeightsOnlyInput(wo_input.TAR, path=path)
    if fmt == Format.DCP:
        return wo_input.WeightsOnlyInput(wo_input.OTHER, path=path, note=(
            "a torch.distributed.checkpoint folder: torch.distributed.checkpoint.load reads it, not torch.load"))
    if fmt == Format.DIST_SAFETENSORS:
        return wo_input.WeightsOnlyInput(wo_input.OTHER, path=path, note=(
            "a folder of distributed safetensors rank files: torch.distributed.checkpoint's "
            "HuggingFaceStorageReader reads it (each file holds no pickle), not torch.load"))
    if fmt in (Format.NUMPY, Format.NPZ):
        return wo_input.WeightsOnlyInput(wo_input.OTHER, path=path, note=(
            "a NumPy file: np.load reads it, not torch.load (which refuses it: no torch zip, no pickle at byte 0)"))
    if options.unsafe:  # the real unpickler ran: the restricted readers say what weights_only would meet
        try:
            return read_file(path, dataclasses.replace(options, unsafe=False)).weights_only
        except CkptError:
            return None
    return None


def _shard_tensors(loaded: Loaded, path: str) -> list[TensorMeta]:
    from .checkpoint.build import build

    return list(build(loaded, path).tensors)


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
    from .checkpoint.build import build

    p = os.fspath(path)
    if not is_url(p) and not os.path.lexists(p):
        raise InputError("no such file or folder", p)
    with gc_paused():
        loaded = read_file(p, ReadOptions(limits=source.limits, unsafe=source.unsafe, tp_rules=source.tp_rules))
        try:
            if source.unstack_layers:
                from .megatron import unstack

                unstack(loaded, p)
            ck = build(loaded, p, source.key, source.limits)
            if read_values and loaded.deferred:  # walking 200,000 entries of any other file would find none
                from .dcp.deferred import with_values

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


__all__ = ["DEFAULT_SOURCE", "Loaded", "ReadOptions", "SourceOptions", "load", "read_checkpoint", "read_file"]
