"""A DeepSpeed MoE run: the shared weights of the model states plus every expert file.

DeepSpeed 0.19.8 saves a model holding ``deepspeed.moe.layer.MoE`` layers
(runtime/engine.py ``_save_moe_checkpoint``) as:

- ``mp_rank_XX_model_states.pt``: ``module`` without the expert parameters
  (``_get_non_moe_state_dict`` drops every key of a MoE module holding
  ``expert`` but the gate's ``wg.weight``), and ``num_experts``, a list of
  each MoE layer's expert count (an int in checkpoints older than 0.6);
- ``layer_L_expert_E_mp_rank_XX_model_states.pt``: one file per MoE layer L
  (its index among the model's MoE modules) and global expert E, holding
  that expert's tensors under their module names, the local id replaced by
  the global one (``global = ep_rank * num_local_experts + local``), so the
  files of every expert-parallel rank together are the whole model;
- ``expp_rank_R_mp_rank_XX_optim_states.pt`` (no ZeRO) or the usual ZeRO
  files: the optimizer.

``load_checkpoint`` (``_load_checkpoint`` -> ``load_moe_state_dict``) opens
the model states and, for each MoE module and local expert, its expert file
with ``torch.load(weights_only=False)`` (checkpoint_engine/
torch_checkpoint_engine.py:37), renames global to local ids and loads the
result into the module; with ZeRO 1/2 the optimizer's fp32 partitions are
loaded after and copied back into the same values. ckpt reads the same
files: the consolidated model is the module's tensors plus every expert's,
keyed by global expert id (``...deepspeed_moe.experts.deepspeed_experts.E...``),
in the dtype the module held. The ZeRO partitions are not used: expert
groups are partitioned over the expert-data-parallel group, not the data-
parallel one, and the module already holds what they hold.
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Protocol

from ...errors import InputError
from ...io import paths
from ...pickles.unpickle import LazyTensor
from .files import ExpertFile, RunFiles

_GLOBAL_ID = re.compile(r"\.deepspeed_moe\.experts\.deepspeed_experts\.(\d+)\.")


class _Reader(Protocol):
    warnings: list[str]

    def pickle(self, path: str) -> dict[Any, Any]: ...

    def value(self, path: str) -> object: ...


def expert_counts(m0: Mapping[Any, Any]) -> list[int] | None:
    """``num_experts`` of the model states: one count per MoE layer, or None for a model without MoE."""
    counts = m0.get("num_experts")
    if counts is None:
        return None
    if type(counts) is int:  # DeepSpeed before 0.6: one count, files named expert_E_mp_rank_XX
        return [counts]
    if isinstance(counts, list) and all(type(c) is int and c >= 1 for c in counts):
        return list(counts)
    raise InputError("num_experts in the model states is not a list of expert counts", "")


def is_moe(m0: Mapping[Any, Any]) -> bool:
    """The model states name MoE layers (``num_experts``): the weights include the expert files'."""
    try:
        return bool(expert_counts(m0))
    except InputError:
        return True  # a malformed count: expert_tensors says so, naming the file


def judge_strays(run: RunFiles, reader: _Reader) -> None:
    """Expert files beside states that name no MoE layer: a MoE model's load_checkpoint opens them all the same."""
    if not run.experts:
        return
    for f in run.experts:
        reader.value(f.path)
    reader.warnings.append(f"{len(run.experts)} MoE expert file(s) are here but the model states name no experts "
                           "(num_experts): DeepSpeed's load_checkpoint opens them for a model with MoE layers; "
                           "judged, their tensors not read as the model's")


def _check_files(run: RunFiles, counts: list[int] | None, legacy: bool) -> set[tuple[int, int]]:
    """Every expert file the loader would open is here (a missing one is an error, never a dropped expert);
    returns the (layer, expert) pairs it opens."""
    if not counts:
        return set()
    have = {(f.layer, f.expert) for f in run.experts}
    layers = [-1] if legacy else list(range(len(counts)))
    wanted = set()
    for layer, count in zip(layers, counts, strict=True):
        for expert in range(count):
            wanted.add((layer, expert))
            if (layer, expert) not in have:
                name = (f"expert_{expert}_mp_rank_{run.mp:02d}_model_states.pt" if layer < 0 else
                        f"layer_{layer}_expert_{expert}_mp_rank_{run.mp:02d}_model_states.pt")
                raise InputError(f"the model states name {count} experts in MoE layer {max(layer, 0)}, but {name} "
                                 "is missing: DeepSpeed's load_checkpoint opens it (not saved, or not copied)",
                                 run.folder)
    return wanted


def expert_tensors(run: RunFiles, m0: Mapping[Any, Any], reader: _Reader) -> dict[str, LazyTensor]:
    """Every expert file's tensors, by global key; each file is read (and judged) even if the states name none."""
    try:
        counts = expert_counts(m0)
    except InputError as exc:
        raise InputError(exc.message, run.model[0][1]) from None
    if m0.get("ds_autoep_layers") or m0.get("autoep_layers"):
        # engine.py:5178: AutoEP's fused experts.w1/w2/w3 [E_local, ...] are split into per-expert keys in
        # these files and stacked back by load_moe_state_dict; ZeRO-3 AutoEP keeps them in the optimizer shards
        raise InputError("an AutoEP MoE run (ds_autoep_layers in the model states): its fused expert tensors are "
                         "not consolidated yet", run.model[0][1])
    legacy = type(m0.get("num_experts")) is int
    wanted = _check_files(run, counts, legacy)
    out: dict[str, LazyTensor] = {}
    odd: list[str] = []
    extra = [f for f in run.experts if (f.layer, f.expert) not in wanted]
    for f in extra:  # judged all the same: a file beside the run is one a differently built model would open
        reader.value(f.path)
    if extra:
        reader.warnings.append(f"expert file(s) beyond the states' num_experts {counts} are judged, their tensors "
                               f"left out (DeepSpeed does not open them for this model): "
                               f"{', '.join(paths.basename(f.path) for f in extra[:5])}")
    for f in run.experts:
        if (f.layer, f.expert) not in wanted:
            continue
        sd = reader.pickle(f.path)
        for name, value in sd.items():
            key = str(name)
            if not isinstance(value, LazyTensor):  # the loader's load_state_dict(strict=True) refuses it
                odd.append(f"{key!r} ({paths.basename(f.path)})")
                continue
            _check_id(key, f)
            if key in out:
                raise InputError(f"{key!r} is in two expert files (two runs saved into one tag?)", f.path)
            out[key] = value
    if odd:
        reader.warnings.append(f"expert file entries that are not tensors are left out: {', '.join(odd[:5])} "
                               "(DeepSpeed's load_checkpoint loads them into the module strictly: it would fail)")
    return out


def _check_id(key: str, f: ExpertFile) -> None:
    m = _GLOBAL_ID.search(key)
    if m and int(m.group(1)) != f.expert:
        raise InputError(f"{key!r} names expert {m.group(1)} but is in expert {f.expert}'s file", f.path)


def describe_moe(run: RunFiles, m0: Mapping[Any, Any]) -> dict[str, Any]:
    """inspect's ``metadata.deepspeed.moe``: the expert counts and files."""
    counts = expert_counts(m0) or []
    return {"num_experts": counts, "expert_files": len(run.experts),
            "layers": sorted({f.layer for f in run.experts})}
