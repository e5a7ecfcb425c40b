"""Write multi-rank torch.distributed.checkpoint folders of any size without distributed training.

The files have the structure FSDP2 ranks write through ``dcp.save``
(fixtures/dcp_multi/, LAYOUT.md): one ``__{rank}_0.distcp`` per rank holding
a ``torch.save`` blob per chunk, back to back; ``.metadata`` a plain pickle
of DCP's own dataclasses with every tensor's chunks (``Shard(0)``, torch.chunk
row blocks: ``ceil(rows / world)`` per rank, so the last ranks may hold
fewer rows or an empty chunk), the byte range of each chunk, and
``planner_data`` to unflatten ``model.<fqn>`` keys.
tests/formats/test_dcp_generator.py checks it against the folders 2 real gloo
processes wrote, and against torch's ``dcp_to_torch_save``.

Values are the cheap deterministic function of generate_training.py, so a
4 GB folder is written at memory speed.

    python3 benchmarks/generate_dcp.py OUT --world-size 4 --gib 4
"""
from __future__ import annotations

import argparse
import math
import os
import pickle
import sys
from collections import OrderedDict
from dataclasses import dataclass, field

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from generate_training import values  # noqa: E402


@dataclass(frozen=True)
class DcpSpec:
    """Tensors (name, shape, dtype) saved under ``model.``, and the number of writing ranks."""

    tensors: list[tuple[str, tuple[int, ...], torch.dtype]]
    world_size: int
    prefix: str = "model"
    extra: dict[str, object] = field(default_factory=dict)  # non-tensor entries (bytes items), by flat key


def chunk_rows(rows: int, world: int, rank: int) -> tuple[int, int]:
    """Rows [start, end) of ``rank``'s Shard(0) chunk, as torch.chunk splits them."""
    per = math.ceil(rows / world) if rows else 0
    start = min(rank * per, rows)
    return start, min(start + per, rows)


def tensor_values(index: int, shape: tuple[int, ...], dtype: torch.dtype, start: int = 0,
                  end: int | None = None) -> torch.Tensor:
    """Rows [start, end) of tensor ``index`` (the whole tensor by default)."""
    rows = shape[0] if shape else 1
    end = rows if end is None else end
    inner = math.prod(shape[1:]) if shape else 1
    flat = values(index, start * inner, end * inner)
    out_shape = (end - start, *shape[1:]) if shape else ()
    return flat.view(out_shape).to(dtype)


def write_dcp(out: str, spec: DcpSpec) -> None:
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import (BytesStorageMetadata, ChunkStorageMetadata, Metadata,
                                                       MetadataIndex, TensorProperties, TensorStorageMetadata)

    os.makedirs(out, exist_ok=True)
    world = spec.world_size
    sdm: dict[str, object] = OrderedDict()
    storage: dict[object, object] = {}
    planner: dict[str, tuple[str, ...]] = {}
    chunks: dict[str, list[object]] = {}
    for name, shape, dtype in spec.tensors:
        fqn = f"{spec.prefix}.{name}"
        chunks[fqn] = []
        sdm[fqn] = TensorStorageMetadata(TensorProperties(dtype=dtype), torch.Size(shape), chunks[fqn])
        planner[fqn] = (spec.prefix, name)
    for key in spec.extra:
        sdm[key] = BytesStorageMetadata()
        planner[key] = tuple(int(p) if p.isdigit() else p for p in key.split("."))
    for rank in range(world):
        rel = f"__{rank}_0.distcp"
        with open(os.path.join(out, rel), "wb") as f:
            if rank == world - 1:  # non-tensor entries are written once, by one rank
                for key, value in spec.extra.items():
                    start = f.tell()
                    torch.save(value, f)
                    storage[MetadataIndex(key)] = _StorageInfo(rel, start, f.tell() - start)
            for index, (name, shape, dtype) in enumerate(spec.tensors):
                fqn = f"{spec.prefix}.{name}"
                if not shape:
                    if rank != world - 1:
                        continue
                    lo, hi = 0, 1
                    offsets: tuple[int, ...] = ()
                    sizes: tuple[int, ...] = ()
                    piece = tensor_values(index, shape, dtype)
                else:
                    lo, hi = chunk_rows(shape[0], world, rank)
                    offsets, sizes = (lo, *[0] * (len(shape) - 1)), (hi - lo, *shape[1:])
                    piece = tensor_values(index, shape, dtype, lo, hi)
                start = f.tell()
                torch.save(piece, f)
                del piece
                storage[MetadataIndex(fqn, torch.Size(offsets), len(chunks[fqn]))] = \
                    _StorageInfo(rel, start, f.tell() - start)
                chunks[fqn].append(ChunkStorageMetadata(torch.Size(offsets), torch.Size(sizes)))
    with open(os.path.join(out, ".metadata"), "wb") as f:
        pickle.dump(Metadata(state_dict_metadata=sdm, planner_data=planner, storage_data=storage, version="1.0.0"),
                    f)


def expected_state_dict(spec: DcpSpec) -> dict[str, object]:
    """What dcp_to_torch_save returns for the folder (small sizes only)."""
    model = {name: tensor_values(i, shape, dtype) for i, (name, shape, dtype) in enumerate(spec.tensors)}
    return {spec.prefix: model}


def llama_like_spec(gib: float, world_size: int, dtype: torch.dtype = torch.float32) -> DcpSpec:
    """A Llama-like model-only state_dict of about ``gib`` GiB, FSDP2-sharded over ``world_size`` ranks."""
    params = gib * (1 << 30) / torch.empty((), dtype=dtype).element_size()
    hidden = 1024 if params < 2e8 else 2048 if params < 1.5e9 else 4096
    ffn, vocab = hidden * 11 // 4, 32000
    per_layer = 4 * hidden * hidden + 3 * hidden * ffn
    layers = max(1, int((params - 2 * vocab * hidden) // per_layer))
    tensors: list[tuple[str, tuple[int, ...], torch.dtype]] = [("model.embed_tokens.weight", (vocab, hidden), dtype)]
    for i in range(layers):
        p = f"model.layers.{i}."
        tensors += [(p + f"self_attn.{x}_proj.weight", (hidden, hidden), dtype) for x in "qkvo"]
        tensors += [(p + "mlp.gate_proj.weight", (ffn, hidden), dtype), (p + "mlp.up_proj.weight", (ffn, hidden), dtype),
                    (p + "mlp.down_proj.weight", (hidden, ffn), dtype)]
        tensors += [(p + "input_layernorm.weight", (hidden,), dtype),
                    (p + "post_attention_layernorm.weight", (hidden,), dtype)]
    tensors += [("model.norm.weight", (hidden,), dtype), ("lm_head.weight", (vocab, hidden), dtype)]
    return DcpSpec(tensors, world_size)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write a multi-rank DCP folder without distributed training.")
    parser.add_argument("out")
    parser.add_argument("--world-size", type=int, default=4)
    parser.add_argument("--gib", type=float, default=4.0, help="approximate folder size, GiB")
    parser.add_argument("--bf16", action="store_true")
    args = parser.parse_args(argv)
    write_dcp(args.out, llama_like_spec(args.gib, args.world_size, torch.bfloat16 if args.bf16 else torch.float32))
    return 0


if __name__ == "__main__":
    sys.exit(main())
