"""DeepSpeed checkpoints read as the consolidated model: the entry point for every layout.

A data-parallel (ZeRO 0-3) run is one model-parallel rank (ranks.py);
pipeline and tensor-parallel runs are several, joined and merged
(model_parallel.py); a universal checkpoint is already merged (universal.py).
Only pickles are read (restricted unpickler); no tensor byte.
"""
from __future__ import annotations

from dataclasses import replace

from ...errors import InputError
from ...format_names import DeepSpeedLayout, Format
from ...io import paths
from ..checkpoint import file_danger
from ..interface import FormatReader, Loaded, ReadOptions
from .files import ParallelRun, find_parallel
from .meta import describe
from .model_parallel import parallel_sizes, read_parallel
from .opened import opened
from .ranks import consolidate
from .universal import read_universal


def read_deepspeed(path: str, options: ReadOptions) -> Loaded:
    """A run folder or tag folder: the consolidated model's tensors, no tensor byte read.

    Every file DeepSpeed's loader opens (opened.py) is read or judged: the
    readers take the weights; the files they do not use are walked here.
    """
    par = find_parallel(path)
    if par.universal is not None:
        loaded = read_universal(par, options)
    elif len(par.ranks) > 1 or par.layers:
        loaded = read_parallel(path, par, options)
    else:
        loaded = _read_zero(par, options)
    return _judge_unread(loaded, par, options)


def _judge_unread(loaded: Loaded, par: ParallelRun, options: ReadOptions) -> Loaded:
    """Walk the pickle of every file the loader opens that no reader used (moments, other ranks' states, ...)."""
    from ..torchsave import read_torch_zip

    files = opened(par)
    read = {s.path for s in loaded.sources}
    references, warnings = list(loaded.references), list(loaded.warnings)
    for f in files:
        if f.path in read:
            continue
        part = read_torch_zip(f.path, options)
        try:
            references += part.references
            warnings += file_danger(_shown(f.path, par), part.references, f.how)
            warnings += [f"{paths.basename(f.path)}: {w}" for w in part.warnings]
        finally:
            for source in part.sources:
                source.close()
    metadata = loaded.metadata
    info = metadata.get("deepspeed")
    if isinstance(info, dict):  # the list the weights-only verdict goes through, file by file
        metadata = {**metadata, "deepspeed": {**info, "files": [_shown(f.path, par) for f in files]}}
    return replace(loaded, references=tuple(references), warnings=tuple(warnings), metadata=metadata)


def _shown(path: str, par: ParallelRun) -> str:
    top = par.folder.rstrip("/") + "/"
    return path[len(top):] if path.startswith(top) else path


def _read_zero(par: ParallelRun, options: ReadOptions) -> Loaded:
    run = par.ranks[0]
    if paths.is_url(run.folder):  # every rank file's first request at once, not one round trip after another
        paths.open_together([p for _, p in run.model + run.optim] + [f.path for f in run.experts])
    part = consolidate(run, options)
    pp, tp = parallel_sizes(part.m0, par)
    if pp * tp > 1:  # one rank's shards are not the model (AutoTP on CPU once wrote only mp_rank_00 files)
        raise InputError(f"the model states say pp={pp} x tp={tp} ({pp * tp} model-parallel ranks), but only "
                         "mp_rank_00 files are here: the other ranks' files are missing (not saved, or not copied)",
                         run.folder)
    tensors = list(part.tensors.values())
    metadata = describe(run, part.m0, part.optim, part.stage, part.world, tensors)
    metadata["deepspeed"]["layout"] = str(DeepSpeedLayout.ZERO)
    return Loaded(Format.DEEPSPEED, part.tensors, tuple(part.reader.references), tuple(part.reader.warnings),
                  (part.builder.source, *part.reader.sources), layout="state_dict", metadata=metadata,
                  framework="deepspeed", tensors=tuple(tensors))


READER = FormatReader(Format.DEEPSPEED, read_deepspeed)
