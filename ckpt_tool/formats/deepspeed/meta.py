"""What a DeepSpeed checkpoint says besides the weights: run, optimizer and schedule, as metadata.

Everything here comes from values the pickles already gave: the optimizer's
moment tensors are described by dtype and size, never read.
"""
from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from ...io import paths
from ...model import TensorMeta
from ...pickles.unpickle import LazyTensor
from ..checkpoint import summarize
from .files import RunFiles
from .moe import describe_moe, is_moe

_RUN_KEYS = ("global_steps", "global_samples", "skipped_steps", "dp_world_size", "mp_world_size", "ds_version")
_OTHER_KEYS = ("lr_scheduler", "data_sampler", "random_ltd", "checkpoint_parallel_dimensions", "ds_config")


def training_dtype(m0: Mapping[Any, Any], tensors: Sequence[TensorMeta]) -> str:
    config = m0.get("ds_config")
    if isinstance(config, Mapping):
        for key, name in (("bf16", "bfloat16"), ("bfloat16", "bfloat16"), ("fp16", "float16")):
            section = config.get(key)
            if isinstance(section, Mapping) and section.get("enabled") is True:
                return name
    module = m0.get("module")
    if isinstance(module, Mapping):
        names = {v.dtype.name for v in module.values() if isinstance(v, LazyTensor) and v.dtype.is_floating}
        for name in ("bfloat16", "float16"):
            if name in names:
                return name
    return "float32"


def _optimizer_state(optim: Sequence[Mapping[Any, Any]], stage: int) -> tuple[Any, dict[str, str]]:
    """(param_groups of rank 0, state name -> description summed over ranks and groups)."""
    inner = "optimizer_state_dict" if stage == 3 else "base_optimizer_state"
    groups: Any = None
    sizes: dict[str, list[Any]] = {}
    for r, osd in enumerate(optim):
        state_dict = osd.get(inner)
        if not isinstance(state_dict, Mapping):
            continue
        if r == 0:
            groups = state_dict.get("param_groups")
        state = state_dict.get("state")
        if not isinstance(state, Mapping):
            continue
        for per_group in state.values():
            if not isinstance(per_group, Mapping):
                continue
            for name, value in per_group.items():
                if isinstance(value, LazyTensor):
                    entry = sizes.setdefault(str(name), [value.dtype.name, 0])
                    numel = 1
                    for d in value.shape:
                        numel *= d
                    entry[1] += numel
    described = {name: f"{dtype}, {numel} elements over {len(optim)} rank(s) (not read)"
                 for name, (dtype, numel) in sizes.items()}
    if isinstance(groups, list):
        groups = [{str(k): v for k, v in g.items() if k != "params"} if isinstance(g, Mapping) else g for g in groups]
    return groups, described


def describe(run: RunFiles, m0: Mapping[Any, Any], optim: Sequence[Mapping[Any, Any]], stage: int, world: int,
             tensors: Sequence[TensorMeta]) -> dict[str, Any]:
    """The metadata entries of a consolidated DeepSpeed checkpoint (JSON-safe)."""
    files = ([paths.basename(p) for _, p in run.model] + [paths.basename(p) for _, p in run.optim]
             + [paths.basename(f.path) for f in run.experts] + [paths.basename(p) for _, p in run.expert_optim])
    info: dict[str, Any] = {
        "zero_stage": stage,
        "world_size": world,
        "dtype": training_dtype(m0, tensors),
        "tag": run.tag or paths.basename(run.folder if paths.is_url(run.folder) else os.path.abspath(run.folder)),
        "folder": run.folder,
        "files": files,
    }
    for key in _RUN_KEYS:
        if key in m0:
            info[key] = summarize(m0[key])
    if is_moe(m0):
        info["moe"] = describe_moe(run, m0)
    out: dict[str, Any] = {"deepspeed": info}
    config = m0.get("ds_config")
    opt_type = None
    if isinstance(config, Mapping) and isinstance(config.get("optimizer"), Mapping):
        opt_type = config["optimizer"].get("type")
    if optim and not is_moe(m0):
        groups, state = _optimizer_state(optim, stage)
        out["optimizer"] = {
            "type": opt_type,
            "master_weights": "float32 (the trainable parameters written by ckpt)",
            "param_groups": summarize(groups),
            "state": state,
        }
    elif optim:
        out["optimizer"] = {"type": opt_type, "master_weights": "not read: a MoE run's weights are the module's and "
                            "its expert files' (what DeepSpeed's load_checkpoint restores)"}
    elif m0.get("optimizer") is not None:
        out["optimizer"] = summarize(m0.get("optimizer"))
    for key in _OTHER_KEYS:
        if m0.get(key) is not None:
            out[key] = summarize(m0[key])
    return out
