"""Generate the benchmark inputs into benchmarks/data/ (git-ignored, never committed).

Inputs, all written with real torch.save / safetensors save_file:

* ``lm-1g`` / ``lm-4g``: a Llama-like fp16 state_dict (``model.embed_tokens``,
  ``model.layers.N.self_attn.{q,k,v,o}_proj``, ``mlp.{gate,up,down}_proj``,
  norms, ``lm_head``) of about 1 GiB / 4 GiB, as ``.pth`` and ``.safetensors``.
  Both have 8 layers (75 tensors); the 4 GiB one is twice as wide (hidden
  4096), so comparing them isolates file size from tensor count;
  a near-identical copy ``-near.safetensors`` (a few tensors nudged by 1e-3)
  for value diffs; for 4 GiB also a sharded safetensors set (index + shards).
* ``small-200k``: 200,000 float32 tensors of 16 elements, as ``.pth`` and
  ``.safetensors``.

Values come from one random pool (N(0, 0.02)) sliced at rolling offsets, so
4 GiB is generated at memory speed; no tensor holds NaN or Inf.

    python3 benchmarks/generate.py [--quick] [--data DIR]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import OrderedDict
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_DATA = os.path.join(HERE, "data")
# Bump when an input changes so stale files are regenerated (per input).
VERSIONS = {"small-200k": 1, "lm-1g": 1, "lm-4g": 2}

LAYERS = 8
VOCAB = 32000
GIB = 1 << 30
# (hidden, ffn) per input: 8 layers each; 4 GiB is the 1 GiB model twice as wide
WIDTH = {1 * GIB: (2048, 5504), 4 * GIB: (4096, 14336)}


def lm_shapes(target_bytes: int) -> "OrderedDict[str, tuple[int, ...]]":
    """Key -> shape of a Llama-like model of LAYERS layers whose fp16 weights total about ``target_bytes``."""
    hidden, ffn = WIDTH[target_bytes]
    shapes: OrderedDict[str, tuple[int, ...]] = OrderedDict()
    shapes["model.embed_tokens.weight"] = (VOCAB, hidden)
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            shapes[p + f"self_attn.{name}.weight"] = (hidden, hidden)
        shapes[p + "mlp.gate_proj.weight"] = (ffn, hidden)
        shapes[p + "mlp.up_proj.weight"] = (ffn, hidden)
        shapes[p + "mlp.down_proj.weight"] = (hidden, ffn)
        shapes[p + "input_layernorm.weight"] = (hidden,)
        shapes[p + "post_attention_layernorm.weight"] = (hidden,)
    shapes["model.norm.weight"] = (hidden,)
    shapes["lm_head.weight"] = (VOCAB, hidden)
    return shapes


def largest_tensor_bytes(target_bytes: int) -> int:
    """Bytes of the largest tensor (fp16): the embedding, the head, or the MLP projections."""
    hidden, ffn = WIDTH[target_bytes]
    return max(VOCAB, ffn) * hidden * 2


def lm_state_dict(target_bytes: int, seed: int = 0) -> "OrderedDict[str, Any]":
    import torch

    gen = torch.Generator().manual_seed(seed)
    pool = (torch.randn(1 << 24, generator=gen) * 0.02).to(torch.float16)  # 32 MiB of values
    sd: OrderedDict[str, Any] = OrderedDict()
    offset = 0
    for key, shape in lm_shapes(target_bytes).items():
        n = 1
        for d in shape:
            n *= d
        if key.endswith("norm.weight"):
            sd[key] = torch.ones(shape, dtype=torch.float16)
            continue
        out = torch.empty(n, dtype=torch.float16)
        filled = 0
        while filled < n:
            start = offset % pool.numel()
            take = min(n - filled, pool.numel() - start)
            out[filled : filled + take] = pool[start : start + take]
            filled += take
            offset += take + 7919  # rolling, so tensors differ
        sd[key] = out.view(shape)
    return sd


def nudged(sd: "OrderedDict[str, Any]") -> "OrderedDict[str, Any]":
    """The same state_dict with three tensors changed by 1e-3 (near-identical)."""
    keys = [k for k in sd if k.endswith("q_proj.weight")][:3]
    out = OrderedDict(sd)
    for k in keys:
        out[k] = sd[k] + 1e-3
    return out


def small_state_dict(count: int = 200_000) -> "OrderedDict[str, Any]":
    import torch

    base = torch.arange(count * 16, dtype=torch.float32).view(count, 16) / (count * 16)
    sd: OrderedDict[str, Any] = OrderedDict()
    for i in range(count):
        sd[f"model.blocks.{i // 8}.w{i % 8}"] = base[i].clone()
    return sd


def write_sharded(sd: "OrderedDict[str, Any]", folder: str, max_shard_bytes: int) -> None:
    """A Hugging Face-style sharded safetensors set: shards + model.safetensors.index.json."""
    from safetensors.torch import save_file

    os.makedirs(folder, exist_ok=True)
    shards: list[OrderedDict[str, Any]] = [OrderedDict()]
    size = 0
    for k, v in sd.items():
        nbytes = v.numel() * v.element_size()
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append(OrderedDict())
            size = 0
        shards[-1][k] = v
        size += nbytes
    weight_map = {}
    total = 0
    for i, shard in enumerate(shards):
        name = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, os.path.join(folder, name), metadata={"format": "pt"})
        for k, v in shard.items():
            weight_map[k] = name
            total += v.numel() * v.element_size()
    with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)


def _stamp_ok(data: str, name: str) -> bool:
    try:
        with open(os.path.join(data, name + ".stamp")) as f:
            return f.read().strip() == str(VERSIONS[name])
    except OSError:
        return False


def _stamp(data: str, name: str) -> None:
    with open(os.path.join(data, name + ".stamp"), "w") as f:
        f.write(str(VERSIONS[name]))


def _log(msg: str) -> None:
    print(f"[generate] {msg}", file=sys.stderr, flush=True)


def generate_lm(data: str, name: str, target_bytes: int, sharded: bool) -> None:
    if _stamp_ok(data, name):
        return
    import torch
    from safetensors.torch import save_file

    t0 = time.perf_counter()
    for stale in (f"{name}.pth", f"{name}.safetensors", f"{name}-near.safetensors", f"{name}-sharded"):
        path = os.path.join(data, stale)
        if os.path.isdir(path):
            import shutil

            shutil.rmtree(path)
        elif os.path.exists(path):
            os.unlink(path)
    sd = lm_state_dict(target_bytes)
    torch.save(sd, os.path.join(data, f"{name}.pth"))
    save_file(sd, os.path.join(data, f"{name}.safetensors"), metadata={"format": "pt"})
    save_file(nudged(sd), os.path.join(data, f"{name}-near.safetensors"), metadata={"format": "pt"})
    if sharded:
        write_sharded(sd, os.path.join(data, f"{name}-sharded"), 1 * GIB)
    del sd
    _stamp(data, name)
    _log(f"{name}: written in {time.perf_counter() - t0:.0f} s")


def generate_small(data: str, name: str = "small-200k") -> None:
    if _stamp_ok(data, name):
        return
    import torch
    from safetensors.torch import save_file

    t0 = time.perf_counter()
    sd = small_state_dict()
    torch.save(sd, os.path.join(data, f"{name}.pth"))
    save_file(sd, os.path.join(data, f"{name}.safetensors"))
    _stamp(data, name)
    _log(f"{name}: written in {time.perf_counter() - t0:.0f} s")


def generate(data: str, quick: bool) -> dict[str, str]:
    """Write (or reuse) every input; returns name -> path prefix."""
    os.makedirs(data, exist_ok=True)
    generate_small(data)
    generate_lm(data, "lm-1g", 1 * GIB, sharded=False)
    if not quick:
        generate_lm(data, "lm-4g", 4 * GIB, sharded=True)
    names = ["small-200k", "lm-1g"] + ([] if quick else ["lm-4g"])
    return {n: os.path.join(data, n) for n in names}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="only the 1 GiB and the 200k-tensor inputs")
    ap.add_argument("--data", default=DEFAULT_DATA, help="where to write (default benchmarks/data)")
    args = ap.parse_args(argv)
    for name, prefix in generate(args.data, args.quick).items():
        print(name, prefix)
    return 0


if __name__ == "__main__":
    sys.exit(main())
