"""Every file DeepSpeed's own loader opens in a checkpoint tag, and how: the list inspect, gate and scan judge.

Derived from DeepSpeed 0.19.8's loading code, not from the files we have
seen (paths relative to site-packages/deepspeed/). Every one of them is
opened with ``torch.load(..., weights_only=False)``: TorchCheckpointEngine.load
(runtime/checkpoint_engine/torch_checkpoint_engine.py:37) or a direct call.

- runtime/engine.py:4383 ``_get_all_ckpt_names``: ``glob(TAG/mp_rank_*_model_states.pt)``
  (ZeRO-3: ``zero_pp_rank_*_mp_rank_*_model_states.pt``); state_dict_factory.py:97/123/136
  loads one or all of them (a tensor-parallel resize merges them all);
- engine.py:4785 ``_get_all_zero_checkpoint_names``/4817: every
  ``[bf16_]zero_pp_rank_R_mp_rank_XX_optim_states.pt`` (falling back to the
  pre-0.3.17 ``..._mp_rank_XXoptim_states.pt``);
- engine.py:4166/4202 ``load_moe_state_dict``: ``layer_L_expert_E_mp_rank_XX_model_states.pt``
  (``expert_E_mp_rank_XX_model_states.pt`` for pre-0.6 checkpoints), every
  expert of every MoE layer across the expert-parallel ranks; engine.py:4683:
  ``expp_rank_R_mp_rank_XX_optim_states.pt`` (MoE without ZeRO);
- runtime/pipe/module.py:598 ``ckpt_layer_path_list`` / 645 ``load_state_dir``:
  ``glob(TAG/layer_NN-*model_states.pt)``, the pipeline layer files;
- universal checkpoints: runtime/base_optimizer.py:334 ``zero/optimizer_state.pt``
  and checkpoint/universal_checkpoint.py:241 every file whose name matches
  ``(.+).pt`` (``re.search``: ``fp32.pt``, ``exp_avg.pt``, ``exp_avg_sq.pt``,
  ``step.pt``, and any other) in each ``zero/<param>/`` folder.

The readers use what holds weights (model states, layer and expert files,
fp32 partitions, ``fp32.pt``); the rest (optimizer moments, ``step.pt``,
other ranks' states, files the globs match but ckpt's names do not) is
judged by walking its pickle, so nothing the loader opens is passed over.
"""
from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass

from ...io import paths
from .files import ParallelRun

TORCH_LOAD_UNSAFE = "torch.load(weights_only=False)"

# (glob DeepSpeed applies in the tag folder, where it does so)
_TAG_GLOBS = (
    ("mp_rank_*_model_states.pt", "runtime/engine.py:4383 _get_all_ckpt_names"),
    ("zero_pp_rank_*_mp_rank_*_model_states.pt", "runtime/engine.py:4383 _get_all_ckpt_names (ZeRO-3)"),
    ("*zero_pp_rank_*_mp_rank_*optim_states.pt", "runtime/engine.py:4785 _get_all_zero_checkpoint_names"),
    ("layer_*_expert_*_mp_rank_*_model_states.pt", "runtime/engine.py:4202 load_moe_state_dict"),
    ("expert_*_mp_rank_*_model_states.pt", "runtime/engine.py:4166 load_moe_state_dict (pre-0.6 names)"),
    ("expp_rank_*_mp_rank_*_optim_states.pt", "runtime/engine.py:4683 _load_checkpoint (MoE, no ZeRO)"),
    ("layer_*-*model_states.pt", "runtime/pipe/module.py:598 ckpt_layer_path_list"),
)
_OPTIMIZER_STATE = "runtime/base_optimizer.py:334 load_hp_checkpoint_state_from_checkpoint_dir"
_UNIVERSAL_STATE = re.compile(r"(.+).pt")  # universal_checkpoint.py:243, applied with re.search


@dataclass(frozen=True)
class Opened:
    """One file the loader opens: where, how, and the line of DeepSpeed that does it."""

    path: str
    how: str
    by: str


def opened(par: ParallelRun) -> tuple[Opened, ...]:
    """The files of ``par``'s tag that DeepSpeed's load_checkpoint opens, by its own globs, in name order."""
    out: dict[str, Opened] = {}
    for name in sorted(paths.listdir(par.folder)):
        for pattern, by in _TAG_GLOBS:
            if fnmatch.fnmatchcase(name, pattern):
                out.setdefault(name, Opened(paths.join(par.folder, name), TORCH_LOAD_UNSAFE, by))
    if par.universal is not None:
        zero = par.universal
        for entry in sorted(paths.listdir(zero)):
            if entry == "optimizer_state.pt":
                out[f"zero/{entry}"] = Opened(paths.join(zero, entry), TORCH_LOAD_UNSAFE, _OPTIMIZER_STATE)
            elif not entry.endswith(".pt") and paths.isdir(paths.join(zero, entry)):
                folder = paths.join(zero, entry)
                for state in sorted(paths.listdir(folder)):
                    if _UNIVERSAL_STATE.search(state):
                        out[f"zero/{entry}/{state}"] = Opened(
                            paths.join(folder, state), TORCH_LOAD_UNSAFE,
                            "checkpoint/universal_checkpoint.py:241 load_hp_checkpoint_state")
    return tuple(out.values())
