"""Write DeepSpeed pipeline-parallel runs and universal checkpoints of any size without DeepSpeed.

Two layouts of issue 24, with the structure DeepSpeed 0.19.8 writes
(fixtures/deepspeed_parallel/, written by DeepSpeed itself: same file names,
pickled keys, types, dtypes and globals; the DeepSpeed classes are written as
their GLOBAL names by generate_training.py's pickler, which never imports
them). tests/formats/test_deepspeed_parallel_generator.py checks both against
those fixtures.

- ``write_pipeline``: a ``PipelineModule`` run (pp stages, tp=1, dp=1,
  ZeRO-1, as fixtures/deepspeed_parallel/pipeline/): ``global_stepN/
  layer_XX-model_states.pt`` per layer (that layer's own ``state_dict()``),
  ``mp_rank_SS_model_states.pt`` per stage (``module`` None, the stage's
  ``param_shapes`` named ``<layer>.<key>``) and ``[bf16_]zero_pp_rank_0_
  mp_rank_SS_optim_states.pt`` (the stage's fp32 masters in one flat
  ``single_partition_of_fp32_groups`` tensor, AdamW's moments, the
  ``fragment_address`` slice map). Layers go to stages as DeepSpeed's
  ``partition_method="uniform"`` puts them.
- ``write_universal``: ``ds_to_universal``'s output of a tp-rank run
  (fixtures/deepspeed_parallel/universal/): ``global_stepN_universal/
  zero/<param>/{fp32,exp_avg,exp_avg_sq,step}.pt`` (whole tensors,
  ``cat_dim``/``vocab_tensor`` notes as its ``universal_checkpoint_info``
  patterns say), ``zero/optimizer_state.pt``, the run's
  ``mp_rank_TT_model_states.pt`` (each tensor-parallel rank's ``module``
  shards) and ``latest_universal``.

The model is Llama-like (generate_training.py's shapes); values are
generate_training's cheap deterministic function of (parameter index,
element index), so a 4 GB folder is written at memory speed and
``expected_state_dict`` rebuilds the consolidated model for small sizes.

    python3 benchmarks/generate_deepspeed_parallel.py pipeline OUT --gib 2 --stages 4
    python3 benchmarks/generate_deepspeed_parallel.py universal OUT --gib 2 --tp 2
"""
from __future__ import annotations

import argparse
import math
import os
import sys
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from generate_training import DS_VERSION, ZeroStage, _fake_class, _save, loss_scaler, values

_FragmentAddress = _fake_class("deepspeed.utils.tensor_fragment", "fragment_address")

Shape = tuple[int, ...]


def fragment_address(numel: int, start: int) -> Any:
    """Pickles as DeepSpeed's fragment_address dataclass: NEWOBJ, then BUILD of {numel, start}."""
    obj = _FragmentAddress()
    obj.__dict__.update(numel=numel, start=start)
    return obj


@dataclass(frozen=True)
class PipelineSpec:
    """PipelineModule layers (each a list of its state_dict's (key, shape), buffers apart), over ``stages``."""

    layers: list[list[tuple[str, Shape]]]
    stages: int
    buffers: dict[int, list[tuple[str, Shape]]] | None = None  # layer index -> persistent buffers
    bf16: bool = False
    config: dict[str, Any] | None = None
    step: int = 1


def partition_uniform(items: int, parts: int) -> list[int]:
    """DeepSpeed's runtime.utils.partition_uniform: stage s holds layers [bounds[s], bounds[s + 1])."""
    if items <= parts:
        return [min(p, items) for p in range(parts + 1)]
    size, extra = divmod(items, parts)
    bounds = [p * size for p in range(parts + 1)]
    for i in range(extra):
        bounds[i + 1:] = [b + 1 for b in bounds[i + 1:]]
    return bounds


def _names(spec: PipelineSpec) -> list[tuple[str, Shape, bool]]:
    """Every (name, shape, is_buffer) of the model in global order, named as PipelineModule.state_dict() does."""
    out: list[tuple[str, Shape, bool]] = []
    for i, layer in enumerate(spec.layers):
        out += [(f"{i}.{k}", s, False) for k, s in layer]
        out += [(f"{i}.{k}", s, True) for k, s in (spec.buffers or {}).get(i, [])]
    return out


def _index(spec: PipelineSpec) -> dict[str, int]:
    return {name: i for i, (name, _, _) in enumerate(_names(spec))}


def _value(index: int, shape: Shape) -> torch.Tensor:
    return values(index, 0, math.prod(shape)).view(shape)


def _config(spec: PipelineSpec) -> dict[str, Any]:
    if spec.config is not None:
        return spec.config
    cfg: dict[str, Any] = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 2,
                           "optimizer": {"type": "AdamW", "params": {"lr": 0.05, "weight_decay": 0.01,
                                                                     "torch_adam": True}},
                           "zero_optimization": {"stage": 1}, "steps_per_print": 1000}
    if spec.bf16:
        cfg["bf16"] = {"enabled": True}
    return cfg


def _param_groups() -> list[dict[str, Any]]:
    return [{"lr": 0.05, "betas": (0.9, 0.999), "eps": 1e-08, "weight_decay": 0.01, "amsgrad": False,
             "maximize": False, "foreach": None, "capturable": False, "differentiable": False, "fused": None,
             "decoupled_weight_decay": True, "params": [0]}]


def _optim_common(padding: list[int], count: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """The ZeRO-1 optimizer entries that are not tensors, before and after the tensors (as DeepSpeed orders them;
    ds_to_universal's optimizer_state.pt keeps both)."""
    return {"loss_scaler": loss_scaler(), "dynamic_loss_scale": False, "overflow": False, "clip_grad": 1.0}, {
        "zero_stage": ZeroStage(1), "group_paddings": padding, "param_alignment_paddings": [[0] * count],
        "partition_count": [1], "ds_version": DS_VERSION}


def _model_states(param_shapes: list[OrderedDict[str, torch.Size]], buffers: list[str], module: Any,
                  cfg: dict[str, Any], mp: int, pp: int, tp: int, step: int, samples: int) -> dict[str, Any]:
    return {"module": module, "buffer_names": buffers, "optimizer": None, "param_shapes": param_shapes,
            "frozen_param_shapes": None, "shared_params": {}, "frozen_param_fragments": None, "lr_scheduler": None,
            "data_sampler": None, "random_ltd": None, "skipped_steps": 0, "global_steps": step,
            "global_samples": samples, "dp_world_size": 1, "mp_world_size": mp,
            "checkpoint_parallel_dimensions": {"pp_degree": pp, "tp_degree": tp}, "ds_config": cfg,
            "ds_version": DS_VERSION}


def write_pipeline(out: str, spec: PipelineSpec) -> str:
    """Write a pipeline run folder (``latest`` + ``global_stepN/``); returns the tag folder."""
    tag = f"global_step{spec.step}"
    folder = os.path.join(out, tag)
    os.makedirs(folder, exist_ok=True)
    half = torch.bfloat16 if spec.bf16 else torch.float32
    index, cfg = _index(spec), _config(spec)
    bounds = partition_uniform(len(spec.layers), spec.stages)
    for stage in range(spec.stages):
        own = range(bounds[stage], bounds[stage + 1])
        params: OrderedDict[str, torch.Size] = OrderedDict()
        buffers: list[str] = []
        for i in own:
            layer: OrderedDict[str, torch.Tensor] = OrderedDict()
            for key, shape in spec.layers[i]:
                layer[key] = _value(index[f"{i}.{key}"], shape).to(half)
                params[f"{i}.{key}"] = torch.Size(shape)
            for key, shape in (spec.buffers or {}).get(i, []):
                layer[key] = _value(index[f"{i}.{key}"], shape)  # DeepSpeed leaves buffers fp32
                buffers.append(f"{i}.{key}")
            torch.save(layer, os.path.join(folder, f"layer_{i:02d}-model_states.pt"))
            del layer
        _save(_model_states([params], buffers, None, cfg, spec.stages, spec.stages, 1, spec.step, 2),
              os.path.join(folder, f"mp_rank_{stage:02d}_model_states.pt"))
        numel = sum(s.numel() for s in params.values())
        pad = numel % 2  # DeepSpeed aligns each ZeRO-1 group to 2 x dp elements
        flat = torch.zeros(numel + pad, dtype=torch.float32)
        mapping: OrderedDict[str, Any] = OrderedDict()
        start = 0
        for name, shape in params.items():
            flat[start:start + shape.numel()] = values(index[name], 0, shape.numel())
            mapping[name] = fragment_address(shape.numel(), start)
            start += shape.numel()
        flat.requires_grad_(True)
        head, tail = _optim_common([pad], len(params))
        state = {0: {"step": torch.tensor(float(spec.step)), "exp_avg": torch.zeros(flat.numel()),
                     "exp_avg_sq": torch.zeros(flat.numel())}}
        optim = {**head, "base_optimizer_state": {"state": state, "param_groups": _param_groups()},
                 "single_partition_of_fp32_groups": [flat], **tail, "param_slice_mappings": [mapping]}
        prefix = "bf16_" if spec.bf16 else ""
        _save({"optimizer_state_dict": optim, "ds_config": cfg, "ds_version": DS_VERSION},
              os.path.join(folder, f"{prefix}zero_pp_rank_0_mp_rank_{stage:02d}_optim_states.pt"))
        del flat, state, optim
    with open(os.path.join(out, "latest"), "w") as f:
        f.write(tag)
    return folder


def expected_pipeline(spec: PipelineSpec) -> OrderedDict[str, torch.Tensor]:
    """The consolidated model: the fp32 masters (the buffers as saved), in PipelineModule's order."""
    return OrderedDict((name, _value(i, shape)) for i, (name, shape, _) in enumerate(_names(spec)))


def _llama_layers(gib: float, per_param: int) -> tuple[int, int, int, int]:
    """(hidden, ffn, vocab, layers) of a Llama-like model whose folder is about ``gib`` GiB at ``per_param`` B."""
    params = gib * (1 << 30) / per_param
    hidden = 1024 if params < 2e8 else 2048 if params < 1.5e9 else 4096
    ffn, vocab = hidden * 11 // 4, 32000
    per_layer = 4 * hidden * hidden + 3 * hidden * ffn
    return hidden, ffn, vocab, max(1, int((params - 2 * vocab * hidden) // per_layer))


def _decoder_layer(hidden: int, ffn: int) -> list[tuple[str, Shape]]:
    return ([(f"self_attn.{x}_proj.weight", (hidden, hidden)) for x in "qkvo"]
            + [("mlp.gate_proj.weight", (ffn, hidden)), ("mlp.up_proj.weight", (ffn, hidden)),
               ("mlp.down_proj.weight", (hidden, ffn)), ("input_layernorm.weight", (hidden,)),
               ("post_attention_layernorm.weight", (hidden,))])


def llama_pipeline_spec(gib: float, stages: int, bf16: bool = False) -> PipelineSpec:
    """A Llama-like PipelineModule (embedding, decoder layers, norm, head) of about ``gib`` GiB on disk.

    Each parameter costs its layer-file copy (4 bytes, 2 in bf16) and 12 bytes of ZeRO-1 state (fp32 master
    and AdamW's two moments).
    """
    hidden, ffn, vocab, layers = _llama_layers(gib, 14 if bf16 else 16)
    body = [_decoder_layer(hidden, ffn) for _ in range(layers)]
    return PipelineSpec([[("weight", (vocab, hidden))], *body, [("weight", (hidden,))], [("weight", (vocab, hidden))]],
                        stages, bf16=bf16)


# Universal checkpoints: ds_to_universal's merge of a tp-rank ZeRO-1 run (Megatron-DeepSpeed's rules)


@dataclass(frozen=True)
class UniversalSpec:
    """Parameters (name, full shape, how split: 0/1 = cat_dim, None = replicated), the vocabulary ones, tp."""

    params: list[tuple[str, Shape, int | None]]
    tp: int
    vocab: tuple[str, ...] = ()
    uc_info: dict[str, Any] | None = None
    config: dict[str, Any] | None = None
    step: int = 1
    vocab_padding: int = 0  # rows the run padded its vocabulary tensors with (cut off in fp32.pt)


def _uc_info(spec: UniversalSpec) -> dict[str, Any]:
    if spec.uc_info is not None:
        return spec.uc_info
    vocab = next((s[0] for n, s, _ in spec.params if n in spec.vocab), 0)
    return {"universal_checkpoint_version": 0.2,
            "tp_replicated_parameter_patterns": [rf"{n}$".replace(".", r"\.") for n, _, d in spec.params
                                                 if d is None],
            "parameter_with_row_parallelism_patterns": [rf"{n}$".replace(".", r"\.") for n, _, d in spec.params
                                                        if d == 1],
            "vocabulary_parameter_patterns": [rf"{n}$".replace(".", r"\.") for n in spec.vocab],
            "original_vocab_size": vocab}


def _padded(spec: UniversalSpec, index: int) -> torch.Tensor:
    """Parameter ``index`` as the run held it: a vocabulary tensor with ``vocab_padding`` zero rows more."""
    name, shape, _ = spec.params[index]
    t = _value(index, shape)
    if name in spec.vocab and spec.vocab_padding:
        t = torch.cat([t, torch.zeros(spec.vocab_padding, *shape[1:])])
    return t


def _tp_shard(t: torch.Tensor, dim: int | None, rank: int, tp: int) -> torch.Tensor:
    return t.clone() if dim is None else t.chunk(tp, dim)[rank].clone()


def write_universal(out: str, spec: UniversalSpec) -> str:
    """Write ``latest_universal`` + ``global_stepN_universal/`` (zero/<param>/*.pt and the model states)."""
    tag = f"global_step{spec.step}_universal"
    folder = os.path.join(out, tag)
    zero = os.path.join(folder, "zero")
    os.makedirs(zero, exist_ok=True)
    cfg = spec.config or {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
                          "optimizer": {"type": "AdamW", "params": {"lr": 0.05, "weight_decay": 0.01,
                                                                    "torch_adam": True}},
                          "zero_optimization": {"stage": 1}, "steps_per_print": 1000}
    info = _uc_info(spec)
    for i, (name, shape, dim) in enumerate(spec.params):
        param = _padded(spec, i)
        if name in spec.vocab:  # ds_to_universal's param[:original_vocab_size]: a view, saved with its storage
            param = param[:shape[0]]
        notes: dict[str, Any] = {} if dim is None else {"cat_dim": dim}
        if name in spec.vocab:
            notes["vocab_tensor"] = True
        place = os.path.join(zero, name)
        os.makedirs(place, exist_ok=True)
        torch.save(torch.tensor(float(spec.step)), os.path.join(place, "step.pt"))
        torch.save({**notes, "param": param.requires_grad_(True)}, os.path.join(place, "fp32.pt"))
        for state in ("exp_avg", "exp_avg_sq"):
            torch.save({**notes, "param": torch.zeros(shape)}, os.path.join(place, f"{state}.pt"))
        del param
    head, tail = _optim_common([0], len(spec.params))
    _save({**head, **tail, "param_groups": _param_groups()}, os.path.join(zero, "optimizer_state.pt"))
    for rank in range(spec.tp):
        module: OrderedDict[str, torch.Tensor] = OrderedDict()
        for i, (name, _, dim) in enumerate(spec.params):
            module[name] = _tp_shard(_padded(spec, i), dim, rank, spec.tp)
        shapes = OrderedDict((n, torch.Size(t.shape)) for n, t in module.items())
        states = _model_states([shapes], [], module, cfg, spec.tp, 1, spec.tp, spec.step, 2)
        states["universal_checkpoint_info"] = info
        _save(states, os.path.join(folder, f"mp_rank_{rank:02d}_model_states.pt"))
        del module, states
    with open(os.path.join(out, "latest_universal"), "w") as f:
        f.write(tag)
    return folder


def expected_universal(spec: UniversalSpec) -> OrderedDict[str, torch.Tensor]:
    """Every parameter's fp32.pt, in the model's order."""
    return OrderedDict((name, _value(i, shape)) for i, (name, shape, _) in enumerate(spec.params))


def llama_universal_spec(gib: float, tp: int = 2) -> UniversalSpec:
    """A Llama-like model's universal checkpoint of about ``gib`` GiB: 16 bytes a parameter (fp32.pt, the two
    moments, the tensor-parallel ranks' module copies), column/row-parallel as Megatron splits it."""
    hidden, ffn, vocab, layers = _llama_layers(gib, 16)
    row = {"self_attn.o_proj.weight", "mlp.down_proj.weight"}
    params: list[tuple[str, Shape, int | None]] = [("model.embed_tokens.weight", (vocab, hidden), 0)]
    for i in range(layers):
        for key, shape in _decoder_layer(hidden, ffn):
            params.append((f"model.layers.{i}.{key}", shape, None if len(shape) == 1 else 1 if key in row else 0))
    params += [("model.norm.weight", (hidden,), None), ("lm_head.weight", (vocab, hidden), 0)]
    return UniversalSpec(params, tp, vocab=("model.embed_tokens.weight", "lm_head.weight"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("layout", choices=("pipeline", "universal"))
    parser.add_argument("out")
    parser.add_argument("--gib", type=float, default=2.0, help="approximate folder size, GiB")
    parser.add_argument("--stages", type=int, default=4, help="pipeline stages (pipeline)")
    parser.add_argument("--tp", type=int, default=2, help="tensor-parallel ranks of the run (universal)")
    parser.add_argument("--bf16", action="store_true", help="a bf16 pipeline run (layer files in bf16)")
    args = parser.parse_args(argv)
    if args.layout == "pipeline":
        write_pipeline(args.out, llama_pipeline_spec(args.gib, args.stages, args.bf16))
    else:
        write_universal(args.out, llama_universal_spec(args.gib, args.tp))
    return 0


if __name__ == "__main__":
    sys.exit(main())
