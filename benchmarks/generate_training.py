"""Write DeepSpeed ZeRO-3 run folders of any size and rank count without DeepSpeed.

The files have the structure DeepSpeed 0.19.8 writes (fixtures/deepspeed/
LAYOUT.md): same file names, same pickled keys, types and globals (the three
DeepSpeed classes are written as their GLOBAL names by a pickler that never
imports them), same per-parameter ceil(n / world) partitioning of
``fp32_flat_groups``. tests/formats/test_deepspeed_layout_generator.py checks this
against the run folders DeepSpeed itself wrote.

Values are a cheap deterministic function of (parameter index, element
index), computed only for the slice each rank holds, so a 4 GB folder is
written at memory speed and ``expected_state_dict`` can rebuild the
consolidated model for small sizes.

    python3 benchmarks/generate_training.py OUT --world-size 4 --gib 4
"""
from __future__ import annotations

import argparse
import math
import os
import pickle
import sys
import types
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import torch

DS_VERSION = "0.19.8"


class _DsGlobal:
    """A stand-in pickled under a DeepSpeed class name (module, name)."""

    ds_global: tuple[str, str] = ("", "")


def _fake_class(module: str, name: str) -> type:
    return type(name, (_DsGlobal,), {"ds_global": (module, name), "__module__": __name__})


_LossScaler = _fake_class("deepspeed.runtime.fp16.loss_scaler", "LossScaler")
_ZeroStageEnum = _fake_class("deepspeed.runtime.zero.config", "ZeroStageEnum")


def loss_scaler() -> Any:
    """Pickles as DeepSpeed's LossScaler: NEWOBJ of the class, then BUILD of its __dict__."""
    obj = _LossScaler()
    obj.__dict__.update(cur_scale=1.0, dynamic=False)
    return obj


class ZeroStage:
    """Pickles as DeepSpeed's Enum member: ZeroStageEnum(stage)."""

    def __init__(self, stage: int) -> None:
        self.stage = stage

    def __reduce__(self) -> Any:
        return (_ZeroStageEnum, (self.stage,))


class _Pickler(pickle._Pickler):  # type: ignore[name-defined,misc]
    """Writes the stand-ins' GLOBAL names without importing DeepSpeed."""

    def save_global(self, obj: Any, name: Any = None) -> None:
        if isinstance(obj, type) and issubclass(obj, _DsGlobal) and obj is not _DsGlobal:
            module, qualname = obj.ds_global
            self.write(pickle.GLOBAL + module.encode() + b"\n" + qualname.encode() + b"\n")  # type: ignore[attr-defined]
            self.memoize(obj)  # type: ignore[attr-defined]
            return
        super().save_global(obj, name)  # type: ignore[misc]


_pickle_module = types.SimpleNamespace(Pickler=_Pickler, Unpickler=pickle.Unpickler, __name__="pickle")


def _save(obj: Any, path: str) -> None:
    torch.save(obj, path, pickle_module=_pickle_module, pickle_protocol=2)


@dataclass(frozen=True)
class Zero3Spec:
    """What to write: parameter groups, frozen params, buffers, ties, ranks."""

    groups: list[list[tuple[str, tuple[int, ...]]]]
    world_size: int
    frozen: list[tuple[str, tuple[int, ...]]] = field(default_factory=list)
    buffers: dict[str, torch.Tensor] = field(default_factory=dict)
    shared: dict[str, str] = field(default_factory=dict)  # tied key -> key holding the data
    bf16: bool = False
    config: dict[str, Any] = field(default_factory=dict)
    step: int = 1


def values(index: int, start: int, end: int) -> torch.Tensor:
    """Elements [start, end) of parameter ``index`` (float32, in [-0.5, 0.5))."""
    i = torch.arange(start, end, dtype=torch.int64)
    return (((i * 2654435761 + index * 97) % 1000003).to(torch.float64) / 1000003 - 0.5).to(torch.float32)


def _piece(index: int, n: int, rank: int, world: int) -> torch.Tensor:
    """This rank's ceil(n / world) piece of a parameter, zero-padded past n."""
    p = math.ceil(n / world)
    start, end = rank * p, min((rank + 1) * p, n)
    out = torch.zeros(p, dtype=torch.float32)
    if end > start:
        out[: end - start] = values(index, start, end)
    return out


def _numel(shape: tuple[int, ...]) -> int:
    return math.prod(shape)


def _all_params(spec: Zero3Spec) -> list[tuple[str, tuple[int, ...]]]:
    return [item for group in spec.groups for item in group] + list(spec.frozen)


def write_zero3(out: str, spec: Zero3Spec, tag: str | None = None) -> str:
    """Write a ZeRO-3 run folder (``latest`` + ``global_stepN/``); returns the tag folder."""
    tag = tag or f"global_step{spec.step}"
    folder = os.path.join(out, tag)
    os.makedirs(folder, exist_ok=True)
    world = spec.world_size
    half = torch.bfloat16 if spec.bf16 else torch.float32
    index = {name: i for i, (name, _) in enumerate(_all_params(spec))}
    config = spec.config or {"zero_optimization": {"stage": 3}, **({"bf16": {"enabled": True}} if spec.bf16 else {})}
    prefix = "bf16_" if spec.bf16 else ""
    for rank in range(world):
        module: OrderedDict[str, torch.Tensor] = OrderedDict()
        for name, buf in spec.buffers.items():
            module[name] = buf
        for name, _ in _all_params(spec):
            module[name] = torch.empty(0, dtype=half)
        for tied, source in spec.shared.items():
            module[tied] = module[source]
        frozen_fragments = OrderedDict(
            (name, _piece(index[name], _numel(shape), rank, world).to(half)) for name, shape in spec.frozen
        )
        model_states = {
            "module": module,
            "buffer_names": list(spec.buffers),
            "optimizer": None,
            "param_shapes": [OrderedDict((n, torch.Size(s)) for n, s in group) for group in spec.groups],
            "frozen_param_shapes": OrderedDict((n, torch.Size(s)) for n, s in spec.frozen),
            "shared_params": dict(spec.shared) if rank == 0 else {},
            "frozen_param_fragments": frozen_fragments,
            "lr_scheduler": None,
            "data_sampler": None,
            "random_ltd": None,
            "skipped_steps": 0,
            "global_steps": spec.step,
            "global_samples": spec.step * world,
            "dp_world_size": world,
            "mp_world_size": 1,
            "checkpoint_parallel_dimensions": {"pp_degree": 1, "tp_degree": 1},
            "ds_config": config,
            "ds_version": DS_VERSION,
        }
        _save(model_states, os.path.join(folder, f"zero_pp_rank_{rank}_mp_rank_00_model_states.pt"))
        del model_states, module, frozen_fragments

        flat_groups = []
        state = {}
        param_groups = []
        for g, group in enumerate(spec.groups):
            pieces = [_piece(index[name], _numel(shape), rank, world) for name, shape in group]
            flat = torch.cat(pieces) if pieces else torch.empty(0)
            del pieces
            flat.requires_grad_(True)
            flat.ds_id = f"{g}_{len(group)}"  # type: ignore[attr-defined]  # DeepSpeed's attribute
            flat_groups.append(flat)
            state[g] = {"step": torch.tensor(float(spec.step)), "exp_avg": torch.zeros(flat.numel()),
                        "exp_avg_sq": torch.zeros(flat.numel())}
            param_groups.append({"weight_decay": 0.01 if g == 0 else 0.0, "lr": 0.05, "betas": (0.9, 0.999),
                                 "eps": 1e-08, "amsgrad": False, "maximize": False, "foreach": None,
                                 "capturable": False, "differentiable": False, "fused": None,
                                 "decoupled_weight_decay": True, "params": [g]})
        optim_states = {
            "optimizer_state_dict": {
                "zero_stage": ZeroStage(3),
                "loss_scaler": loss_scaler(),
                "dynamic_loss_scale": False,
                "overflow": False,
                "partition_count": world,
                "optimizer_state_dict": {"state": state, "param_groups": param_groups},
                "fp32_flat_groups": flat_groups,
            },
            "ds_config": config,
            "ds_version": DS_VERSION,
        }
        _save(optim_states, os.path.join(folder, f"{prefix}zero_pp_rank_{rank}_mp_rank_00_optim_states.pt"))
        del optim_states, flat_groups, state
    with open(os.path.join(out, "latest"), "w") as f:
        f.write(tag)
    return folder


def expected_state_dict(spec: Zero3Spec) -> dict[str, torch.Tensor]:
    """The consolidated model the folder holds (DeepSpeed's order and dtypes)."""
    half = torch.bfloat16 if spec.bf16 else torch.float32
    out: dict[str, torch.Tensor] = {k: (v.float() if v.is_floating_point() else v) for k, v in spec.buffers.items()}
    for i, (name, shape) in enumerate(_all_params(spec)):
        t = values(i, 0, _numel(shape)).view(shape)
        out[name] = t.to(half) if name in dict(spec.frozen) else t
    frozen = [n for n, _ in spec.frozen]
    ordered = {k: out[k] for k in list(spec.buffers) + frozen}
    ordered.update({k: out[k] for k in out if k not in ordered})
    for tied, source in spec.shared.items():
        ordered[tied] = ordered[source]
    return ordered


def llama_like_spec(gib: float, world_size: int, bf16: bool = False) -> Zero3Spec:
    """A Llama-like model whose run folder is about ``gib`` GiB on disk.

    Every trainable parameter costs 12 bytes in a ZeRO-3 folder: the fp32
    master plus AdamW's two fp32 moments (the model-states files hold only
    [0]-shaped placeholders); so 4 GiB is about 358M parameters.
    """
    params = gib * (1 << 30) / 12
    hidden = 1024 if params < 2e8 else 2048 if params < 1.5e9 else 4096
    ffn, vocab = hidden * 11 // 4, 32000
    per_layer = 4 * hidden * hidden + 3 * hidden * ffn
    layers = max(1, int((params - 2 * vocab * hidden) // per_layer))
    decay: list[tuple[str, tuple[int, ...]]] = [("model.embed_tokens.weight", (vocab, hidden))]
    no_decay: list[tuple[str, tuple[int, ...]]] = []
    for i in range(layers):
        p = f"model.layers.{i}."
        decay += [(p + f"self_attn.{x}_proj.weight", (hidden, hidden)) for x in "qkvo"]
        decay += [(p + "mlp.gate_proj.weight", (ffn, hidden)), (p + "mlp.up_proj.weight", (ffn, hidden)),
                  (p + "mlp.down_proj.weight", (hidden, ffn))]
        no_decay += [(p + "input_layernorm.weight", (hidden,)), (p + "post_attention_layernorm.weight", (hidden,))]
    decay.append(("lm_head.weight", (vocab, hidden)))
    no_decay.append(("model.norm.weight", (hidden,)))
    return Zero3Spec(groups=[decay, no_decay], world_size=world_size, bf16=bf16)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write a DeepSpeed ZeRO-3 run folder without DeepSpeed.")
    parser.add_argument("out")
    parser.add_argument("--world-size", type=int, default=4)
    parser.add_argument("--gib", type=float, default=4.0, help="approximate folder size, GiB")
    parser.add_argument("--bf16", action="store_true")
    args = parser.parse_args(argv)
    write_zero3(args.out, llama_like_spec(args.gib, args.world_size, args.bf16))
    return 0


if __name__ == "__main__":
    sys.exit(main())
