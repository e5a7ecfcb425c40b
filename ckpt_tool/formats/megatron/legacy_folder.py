"""Megatron-LM's legacy checkpoint folders: one ``model_optim_rng.pt`` per tensor-parallel rank, merged by rules.

::

    run/
      latest_checkpointed_iteration.txt     "1000" (or "release")
      iter_0001000/                         (or release/)
        mp_rank_00/model_optim_rng.pt       tp rank 0: {"model": {"language_model": ...}, "args", "iteration", ...}
        mp_rank_01/model_optim_rng.pt       (mp_rank_TT_PPP/ with pipeline parallelism)

Megatron-LM's ``load_checkpoint`` (megatron/training/checkpointing.py:
``get_checkpoint_name`` names ``mp_rank_TT[_PPP][_EEE]/model_optim_rng.pt``,
``model_rng.pt`` for a release with the distributed optimizer;
``_load_base_checkpoint`` opens it with ``torch.load(weights_only=False)``)
also opens ``distrib_optim.pt`` beside it when the run used the distributed
optimizer (``get_distributed_optimizer_checkpoint_name``; megatron-core
0.16.1 optimizer/distrib_optimizer.py:2263 ``load_parameter_state``:
``torch.load(filename)``). Every one of those files is read or judged
(``opened``); an expert-parallel layout (``mp_rank_TT_PPP_EEE``) is refused.

Each rank's file is read like any torch.save file (restricted unpickler, no
tensor byte) and its state_dict located (``model``); the ranks are then
merged by the rules the user gives (``--tp-rules FILE``): Megatron records
none, and ckpt keeps no per-model table of split dimensions. One rank needs
no rules. Pipeline stages number their layers from 0 each, so joining them
needs a renumbering ckpt does not guess: pp > 1 is refused with a message.
"""
from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from ...errors import InputError
from ...format_names import Format
from ...io import paths
from ...model import DataSource, GlobalRef, TensorMeta
from ...pickles.unpickle import Placeholder
from ..checkpoint import build_checkpoint as build, file_danger, summarize
from ..interface import FormatReader, Loaded, ReadOptions
from ..tp import merge_ranks

LATEST = "latest_checkpointed_iteration.txt"
_RANK = re.compile(r"^mp_rank_(\d{2})(?:_(\d{3}))?$")
_EXPERT_RANK = re.compile(r"^mp_rank_\d{2}_\d{3}_\d{3}$")  # get_checkpoint_name with expert parallelism
_FILES = ("model_optim_rng.pt", "model_rng.pt")
DISTRIB_OPTIM = "distrib_optim.pt"


def opened(folder: str) -> list[str]:
    """Every file Megatron-LM's load_checkpoint opens in an iteration folder (relative to it), in name order."""
    out = []
    for name in sorted(paths.listdir(folder)):
        if not (_RANK.match(name) or _EXPERT_RANK.match(name)):
            continue
        try:
            inside = paths.listdir(paths.join(folder, name))
        except InputError:
            continue
        out += [f"{name}/{f}" for f in (*_FILES, DISTRIB_OPTIM) if f in inside]
    return out


def _rank_dirs(folder: str) -> dict[tuple[int, int], str]:
    """(tp rank, pp rank) -> the rank's checkpoint file, for the mp_rank_* folders holding one."""
    out: dict[tuple[int, int], str] = {}
    try:
        names = paths.listdir(folder)
    except InputError:
        return out
    for name in names:
        m = _RANK.match(name)
        if not m:
            continue
        try:
            inside = paths.listdir(paths.join(folder, name))
        except InputError:
            continue
        found = next((f for f in _FILES if f in inside), None)
        if found:
            out[(int(m.group(1)), int(m.group(2) or 0))] = paths.join(paths.join(folder, name), found)
    return out


def _iteration_folder(path: str) -> tuple[str, str | None]:
    if not paths.isfile(paths.join(path, LATEST)):
        return path, None
    with paths.open_bytes(paths.join(path, LATEST)) as f:
        text = f.read_upto(0, 64).decode("utf-8", "replace").strip()
    tag = "release" if text == "release" else f"iter_{int(text):07d}" if text.isdigit() else None
    if tag is None:
        raise InputError(f"{LATEST} holds {text[:20]!r}, not an iteration number or 'release'", path)
    folder = paths.join(path, tag)
    if not _rank_dirs(folder):
        raise InputError(f"{LATEST} names iteration {text}, but {tag}/ holds no mp_rank_XX/model_optim_rng.pt",
                         path)
    return folder, tag


def is_megatron_legacy(folder: str) -> bool:
    """A run folder (``latest_checkpointed_iteration.txt``) or an iteration folder of mp_rank_XX folders."""
    return paths.isfile(paths.join(folder, LATEST)) or bool(_rank_dirs(folder))


def _check_sizes(root: object, tp: int, pp: int, folder: str) -> None:
    """The sizes the run's ``args`` record must be the folders found (a rank not copied looks like a smaller run)."""
    args = root.get("args") if isinstance(root, Mapping) else None
    attrs = args.attributes if isinstance(args, Placeholder) else {}
    for name, found in (("tensor_model_parallel_size", tp), ("pipeline_model_parallel_size", pp)):
        said = attrs.get(name)
        if type(said) is int and said != found:
            raise InputError(f"the run's args say {name}={said}, but {found} rank folder(s) of that kind are here "
                             f"(pp={pp}, tp={tp} found): the checkpoint is incomplete", folder)


def read_megatron_legacy(path: str, options: ReadOptions) -> Loaded:
    """Every tensor-parallel rank's state_dict, merged by the user's rules."""
    folder, tag = _iteration_folder(path)
    files = _rank_dirs(folder)
    expert = sorted(n for n in paths.listdir(folder) if _EXPERT_RANK.match(n))
    if expert:
        raise InputError(f"an expert-parallel Megatron-LM checkpoint ({expert[0]}/: mp_rank_TT_PPP_EEE): ckpt "
                         "does not merge its expert ranks yet", folder)
    tp = max(t for t, _ in files) + 1
    pp = max(p for _, p in files) + 1
    missing = [(t, p) for t in range(tp) for p in range(pp) if (t, p) not in files]
    if missing:
        t, p = missing[0]
        name = f"mp_rank_{t:02d}" + (f"_{p:03d}" if pp > 1 else "")
        raise InputError(f"{name}/ is missing (pp={pp}, tp={tp}): the checkpoint is incomplete", folder)
    if pp > 1:
        raise InputError(f"a pipeline-parallel Megatron-LM checkpoint (pp={pp}, tp={tp}): each stage numbers its "
                         "layers from 0, and ckpt does not renumber them; read one stage's mp_rank_TT_PPP folder at a "
                         "time", folder)
    from ..torchsave import read_torch_zip

    references: list[GlobalRef] = []
    warnings: list[str] = []
    sources: list[DataSource] = []
    ranks: list[OrderedDict[str, TensorMeta]] = []
    meta0: dict[str, Any] = {}
    key = None
    for t in range(tp):
        file = files[(t, 0)]
        loaded = read_torch_zip(file, options)
        sources += loaded.sources
        ck = build(loaded, file, None, options.limits)
        references += ck.references
        warnings += [f"mp_rank_{t:02d}: {w}" for w in ck.warnings]
        ranks.append(OrderedDict((m.key, m) for m in ck.tensors))
        if t == 0:
            meta0, key = dict(ck.metadata), ck.state_dict_key
            _check_sizes(loaded.root, tp, pp, folder)
    every = opened(folder)
    read = {paths.basename(paths.dirname(files[(t, 0)])) + "/" + paths.basename(files[(t, 0)]) for t in range(tp)}
    for name in every:  # distrib_optim.pt: judged, as Megatron's loader opens it
        if name in read:
            continue
        part = read_torch_zip(paths.join(folder, name), options)
        try:
            references += part.references
            warnings += file_danger(name, part.references, "torch.load(weights_only=False)")
            warnings += [f"{name}: {w}" for w in part.warnings]
        finally:
            for source in part.sources:
                source.close()
    info: dict[str, Any] = {"tp": tp, "pp": pp, "iteration": tag, "state_dict": key, "folder": folder,
                            "files": every}
    if tp == 1:
        tensors = ranks[0]
    else:
        if options.tp_rules is None:
            raise InputError(f"a Megatron-LM tensor-parallel checkpoint (pp={pp}, tp={tp}) records no merging rules; "
                             "give the split dimension of each key in a rules file, --tp-rules rules.toml "
                             "(inspect, diff, gate and migrate take it; docs/consolidate.md)", path)
        tensors, more, counts = merge_ranks(ranks, options.tp_rules, folder, (pp, tp))
        sources += more
        info["tp_rules"] = {"from": options.tp_rules.origin, "merged": counts}
    metadata = {"megatron": info}
    for name, value in meta0.items():
        metadata.setdefault(name, summarize(value))
    return Loaded(Format.MEGATRON_LEGACY, tensors, tuple(references), tuple(dict.fromkeys(warnings)), tuple(sources),
                  layout="state_dict", metadata=metadata, framework="megatron", tensors=tuple(tensors.values()))


READER = FormatReader(Format.MEGATRON_LEGACY, read_megatron_legacy)
