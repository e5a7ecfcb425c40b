"""Which files make a DeepSpeed checkpoint: the run folder, its ``latest`` tag, the rank files.

A run folder holds ``latest`` (the tag, e.g. ``global_step100``) and one
folder per tag with ``mp_rank_00_model_states.pt`` (ZeRO 0-2) or
``zero_pp_rank_R_mp_rank_00_model_states.pt`` (ZeRO-3, one per rank) and
``[bf16_]zero_pp_rank_R_mp_rank_00_optim_states.pt`` (one per rank).
Model-parallel runs add ``mp_rank_XX`` files (one per pipeline stage, or
per tensor-parallel rank; ``checkpoint_parallel_dimensions`` in the model
states says which) and, for pipeline runs, ``layer_XX[-model_YY]-model_states.pt``
(one per PipelineModule layer, YY the tensor-parallel rank). A universal
checkpoint (ds_to_universal's output) holds ``zero/<param>/fp32.pt``. A run
of a model with ``deepspeed.moe`` layers adds one
``layer_L_expert_E_mp_rank_XX_model_states.pt`` per MoE layer and global
expert (``expert_E_...`` before DeepSpeed 0.6) and, without ZeRO,
``expp_rank_R_mp_rank_XX_optim_states.pt`` (moe.py reads them).
Only names are looked at here (and ``latest``); nothing is unpickled. A
folder behind a URL is read the same way (io/paths: a listing per folder).
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass

from ...errors import InputError
from ...io import paths

LATEST = "latest"
LATEST_UNIVERSAL = "latest_universal"  # what ds_to_universal writes beside its output folder
ZERO = "zero"  # a universal checkpoint's folder of per-parameter folders
_MODEL = re.compile(r"^(?:zero_pp_rank_(\d+)_)?mp_rank_(\d+)_model_states\.pt$")
_OPTIM = re.compile(r"^(bf16_)?zero_pp_rank_(\d+)_mp_rank_(\d+)_optim_states\.pt$")
_LAYER = re.compile(r"^layer_(\d+)(?:-model_(\d+))?-model_states\.pt$")
# MoE expert files (engine.py _get_expert_ckpt_name): ``layer_L_expert_E_mp_rank_XX`` (L the MoE layer's index
# among the model's MoE modules, E the global expert id), or ``expert_E_mp_rank_XX`` from DeepSpeed before 0.6
_EXPERT = re.compile(r"^(?:layer_(\d+)_)?expert_(\d+)_mp_rank_(\d+)_model_states\.pt$")
# the optimizer of a MoE run without ZeRO, one per expert-parallel rank (engine.py _get_optimizer_ckpt_name)
_EXPP_OPTIM = re.compile(r"^expp_rank_(\d+)_mp_rank_(\d+)_optim_states\.pt$")
_MAX_TAG = 4096


@dataclass(frozen=True)
class RunFiles:
    """The files of one DeepSpeed checkpoint tag."""

    folder: str  # the tag folder (global_stepN)
    tag: str | None  # what ``latest`` named, when the run folder was given
    model: tuple[tuple[int, str], ...]  # (data-parallel rank, path), rank order; ZeRO 0-2: one file, rank 0
    optim: tuple[tuple[int, str], ...]  # (rank, path), rank order; empty for ZeRO stage 0
    bf16: bool  # the optimizer files carry the ``bf16_`` prefix
    mp: int = 0  # the model-parallel rank (``mp_rank_XX``): a pipeline stage, or a tensor-parallel rank
    experts: tuple[ExpertFile, ...] = ()  # MoE expert files of this model-parallel rank, (layer, expert) order
    expert_optim: tuple[tuple[int, str], ...] = ()  # (expert-parallel rank, path): a MoE run's non-ZeRO optimizer


@dataclass(frozen=True)
class ExpertFile:
    """One MoE expert's weights: ``layer_L_expert_E_mp_rank_XX_model_states.pt``."""

    layer: int  # the MoE layer's index among the model's MoE modules; -1 for the old ``expert_E_...`` name
    expert: int  # the global expert id (expert-parallel rank x local experts + local id)
    path: str


@dataclass(frozen=True)
class ParallelRun:
    """Every file of one tag: one RunFiles per model-parallel rank, the pipeline layer files, or a universal one."""

    folder: str
    tag: str | None
    ranks: tuple[RunFiles, ...]  # mp_rank 0, 1, ...
    layers: tuple[tuple[int, int, str], ...] = ()  # (layer index, tensor-parallel rank, path), in that order
    universal: str | None = None  # the ``zero/`` folder of a universal checkpoint


def _names(folder: str) -> list[str]:
    return paths.listdir(folder)


def _has_model_states(folder: str) -> bool:
    try:
        return any(_MODEL.match(n) for n in paths.listdir(folder))
    except InputError:
        return False


def read_latest(run: str, latest: str = LATEST) -> str:
    """The tag ``latest`` names (one line, a folder inside the run folder)."""
    try:
        with paths.open_bytes(paths.join(run, latest)) as f:
            raw = f.read_upto(0, _MAX_TAG + 1)
    except InputError as exc:
        raise InputError(f"cannot read {latest}: {exc.message}", run) from None
    tag = raw.decode("utf-8", "replace").strip()
    if not tag or len(raw) > _MAX_TAG or "\n" in tag or "/" in tag or os.sep in tag or tag in (".", ".."):
        raise InputError(f"{latest} does not hold a DeepSpeed tag (one folder name, e.g. global_step100)", run)
    return tag


def is_deepspeed(folder: str) -> bool:
    """A run folder (``latest`` or ``latest_universal`` beside its tag folder) or a tag folder of model states."""
    try:
        if paths.isfile(paths.join(folder, LATEST)):
            with paths.open_bytes(paths.join(folder, LATEST)) as f:
                return f.size <= _MAX_TAG
        if _has_model_states(folder):
            return True
        # probed last: behind a URL each look is a request, and only ds_to_universal's output has it
        if paths.isfile(paths.join(folder, LATEST_UNIVERSAL)):
            with paths.open_bytes(paths.join(folder, LATEST_UNIVERSAL)) as f:
                return f.size <= _MAX_TAG
    except InputError:
        return False
    return False


def find_run(path: str) -> RunFiles:
    """The files of a data-parallel (ZeRO) checkpoint: model-parallel rank 0 only."""
    return find_parallel(path).ranks[0]


def _tag_folder(path: str) -> tuple[str, str | None]:
    if not _has_model_states(path):
        for latest in (LATEST, LATEST_UNIVERSAL):
            if paths.isfile(paths.join(path, latest)):
                tag = read_latest(path, latest)
                folder = paths.join(path, tag)
                if not _is_folder(folder):
                    raise InputError(f"{latest} names the tag {tag!r} but the folder {tag}/ is not here (the save "
                                     "did not finish, or only part of the run was copied)", path)
                return folder, tag
    return path, None


def find_parallel(path: str) -> ParallelRun:
    """The files of the checkpoint in ``path`` (a run folder with ``latest``, or a tag folder)."""
    folder, tag = _tag_folder(path)
    names = _names(folder)
    model: dict[int, dict[int, str]] = {}
    optim: dict[int, dict[int, str]] = {}
    layers: list[tuple[int, int, str]] = []
    experts: dict[int, list[ExpertFile]] = {}
    expp: dict[int, dict[int, str]] = {}
    prefixes = set()
    for name in names:
        e = _EXPERT.match(name)
        if e:
            layer = int(e.group(1)) if e.group(1) is not None else -1
            experts.setdefault(int(e.group(3)), []).append(ExpertFile(layer, int(e.group(2)), paths.join(folder, name)))
            continue
        x = _EXPP_OPTIM.match(name)
        if x:
            expp.setdefault(int(x.group(2)), {})[int(x.group(1))] = paths.join(folder, name)
            continue
        m = _MODEL.match(name)
        if m:
            model.setdefault(int(m.group(2)), {})[int(m.group(1) or 0)] = paths.join(folder, name)
            continue
        o = _OPTIM.match(name)
        if o:
            optim.setdefault(int(o.group(3)), {})[int(o.group(2))] = paths.join(folder, name)
            prefixes.add(bool(o.group(1)))
            continue
        la = _LAYER.match(name)
        if la:
            layers.append((int(la.group(1)), int(la.group(2) or 0), paths.join(folder, name)))
    if not model:
        hint = ""
        tags = sorted(n for n in names if n.startswith("global_step") and paths.isdir(paths.join(folder, n)))
        if tags:
            hint = f"; name a tag folder, e.g. {paths.join(path, tags[-1])}"
        raise InputError(f"no DeepSpeed *_model_states.pt file in {folder}{hint}", path)
    if len(prefixes) > 1:
        raise InputError("the folder mixes bf16_ and plain optimizer-states files (two runs saved into one tag?)",
                         folder)
    mps = sorted(model)
    if mps != list(range(len(mps))):
        missing = sorted(set(range(mps[-1] + 1)) - set(mps))
        raise InputError(f"the model-states files of model-parallel rank(s) {', '.join(map(str, missing[:5]))} "
                         f"(mp_rank_{missing[0]:02d}_...) are missing: the checkpoint is incomplete", folder)
    extra = sorted((set(optim) | set(experts) | set(expp)) - set(model))
    if extra:
        raise InputError(f"optimizer or expert states of model-parallel rank {extra[0]} but no "
                         f"mp_rank_{extra[0]:02d} model states", folder)
    ranks = tuple(RunFiles(folder, tag, tuple(sorted(model[mp].items())), tuple(sorted(optim.get(mp, {}).items())),
                           prefixes == {True}, mp, tuple(sorted(experts.get(mp, []), key=_expert_order)),
                           tuple(sorted(expp.get(mp, {}).items())))
                  for mp in mps)
    zero = paths.join(folder, ZERO)
    universal = zero if ZERO in names and _is_folder(zero) else None
    return ParallelRun(folder, tag, ranks, tuple(sorted(layers)), universal)


def _expert_order(f: ExpertFile) -> tuple[int, int]:
    return f.layer, f.expert


def _is_folder(path: str) -> bool:
    """A tag folder exists: locally a stat; behind a URL, it lists something (a missing one lists nothing)."""
    if not paths.is_url(path):
        return os.path.isdir(path)
    try:
        return bool(paths.listdir(path))
    except InputError:
        return False


def check_ranks(files: tuple[tuple[int, str], ...], what: str, folder: str) -> None:
    """Ranks 0..N-1, each once: a missing rank is an incomplete checkpoint."""
    ranks = [r for r, _ in files]
    if ranks != list(range(len(ranks))):
        missing = sorted(set(range(max(ranks) + 1)) - set(ranks))
        raise InputError(f"{what} files of rank(s) {', '.join(map(str, missing[:5]))} are missing: the checkpoint "
                         "is incomplete (a rank did not save, or was not copied)", folder)


def rank_file_hint(path: str) -> str | None:
    """For one rank's file of a DeepSpeed checkpoint: where the consolidated model is read from."""
    name = paths.basename(path)
    if not (_MODEL.match(name) or _OPTIM.match(name) or _LAYER.match(name) or _EXPERT.match(name)
            or _EXPP_OPTIM.match(name)):
        return None
    folder = paths.dirname(path)
    run = paths.dirname(folder)
    # a URL's run folder is not probed for ``latest`` (a request a metadata answer does not need)
    whole = run if not paths.is_url(path) and os.path.isfile(os.path.join(run, LATEST)) else folder
    return (f"{name} is one file of a DeepSpeed checkpoint; `ckpt inspect {whole}` reads the consolidated "
            "model (the fp32 master weights assembled from every rank)")
