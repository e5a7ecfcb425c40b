"""Write Megatron-core ``torch_dist`` checkpoints of any size with torch.distributed.checkpoint, without Megatron.

What megatron-core 0.16's ``dist_checkpointing.save(model.sharded_state_dict(),
folder)`` writes for a TP=1, PP=1 ``GPTModel`` (tests/formats/test_megatron.py
saves one; fixtures/megatron/dense/ is one): a DCP folder whose
``decoder.layers.*`` tensors are stacked on a leading layer axis, saved one
chunk per layer (``offsets (l, 0, ...)``, the gated ``linear_fc1`` in two
chunks per layer: its gate and up halves), each module's ``_extra_state`` a
bytes item per layer (``KEY/shard_<l>_<L>``, a ``torch.save`` of
``[None]`` for the local layer spec), over two ``__0_{0,1}.distcp`` files
(Megatron's two writer threads); ``.metadata`` with no ``planner_data``
and no index hints; ``common.pt`` (the non-sharded entries: none for a
model's sharded state dict) and ``metadata.json`` naming the backend.

The folder is written by torch's own ``dcp.save`` (no process group:
``no_dist``) with a planner that hands DCP Megatron's per-layer chunks,
as Megatron's planner does, so file names, byte layout and ``.metadata``
are torch's. Values are generate_training's cheap deterministic function,
computed one chunk at a time, so a 4 GB folder is written at memory speed.
tests/formats/test_megatron_generator.py checks the structure against a
real Megatron save.

    python3 benchmarks/generate_megatron.py OUT --gib 2
"""
from __future__ import annotations

import argparse
import io
import json
import math
import os
import sys
from dataclasses import dataclass
from typing import Any

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from generate_dcp import tensor_values

METADATA_JSON = {"sharded_backend": "torch_dist", "sharded_backend_version": 1, "common_backend": "torch",
                 "common_backend_version": 1}


@dataclass(frozen=True)
class Entry:
    """One key of the sharded state dict: a tensor (stacked over layers or not) or a per-layer object."""

    key: str
    shape: tuple[int, ...] = ()  # the global shape (layers first when stacked)
    stacked: bool = False
    parts: int = 1  # chunks per layer along axis 1 (2 for the gated linear_fc1: gate and up)
    is_object: bool = False  # a per-layer _extra_state bytes item


@dataclass(frozen=True)
class MegatronSpec:
    """The entries in Megatron's save order, the number of layers, the dtype of every tensor."""

    head: list[Entry]  # before the layers (embeddings)
    layer: list[Entry]  # per layer, in the layer's order
    tail: list[Entry]  # after the layers (final norm, output layer)
    layers: int
    dtype: torch.dtype = torch.float32


def gpt_spec(hidden: int, ffn: int, vocab: int, layers: int, bias: bool = False, norm_bias: bool = False,
             position_embeddings: int = 0, dtype: torch.dtype = torch.float32) -> MegatronSpec:
    """A GPTModel's torch_dist entries (local layer spec, gated MLP, Megatron's Transformer Engine names)."""
    L, h = layers, hidden
    head = [Entry("embedding.word_embeddings.weight", (vocab, h))]
    if position_embeddings:
        head.append(Entry("embedding.position_embeddings.weight", (position_embeddings, h)))
    layer: list[Entry] = []

    def linear(name: str, rows: int, cols: int, parts: int = 1, norm: bool = False) -> None:
        key = f"decoder.layers.{name}"
        if norm:
            layer.append(Entry(f"{key}.layer_norm_weight", (L, h), True))
            if norm_bias:
                layer.append(Entry(f"{key}.layer_norm_bias", (L, h), True))
        layer.append(Entry(f"{key}.weight", (L, rows, cols), True, parts))
        if bias:
            layer.append(Entry(f"{key}.bias", (L, rows), True, parts))
        layer.append(Entry(f"{key}._extra_state", is_object=True))

    layer.append(Entry("decoder.layers.self_attention.linear_qkv.layer_norm_weight", (L, h), True))
    if norm_bias:
        layer.append(Entry("decoder.layers.self_attention.linear_qkv.layer_norm_bias", (L, h), True))
    linear("self_attention.linear_proj", h, h)
    linear("self_attention.linear_qkv", 3 * h, h)
    linear("mlp.linear_fc1", 2 * ffn, h, parts=2, norm=True)
    linear("mlp.linear_fc2", h, ffn)
    tail = [Entry("decoder.final_layernorm.weight", (h,))]
    if norm_bias:
        tail.append(Entry("decoder.final_layernorm.bias", (h,)))
    tail.append(Entry("output_layer.weight", (vocab, h)))
    return MegatronSpec(head, layer, tail, layers, dtype)


def llama_like_spec(gib: float, dtype: torch.dtype = torch.float32) -> MegatronSpec:
    """A Llama-like GPTModel (RMSNorm, no biases, rotary positions) whose model-only folder is about ``gib``."""
    params = gib * (1 << 30) / torch.empty((), dtype=dtype).element_size()
    hidden = 1024 if params < 2e8 else 2048 if params < 1.5e9 else 4096
    ffn, vocab = hidden * 11 // 4, 32000
    per_layer = 4 * hidden * hidden + 3 * hidden * ffn
    layers = max(1, int((params - 2 * vocab * hidden) // per_layer))
    return gpt_spec(hidden, ffn, vocab, layers, dtype=dtype)


def _tensors(spec: MegatronSpec) -> list[Entry]:
    return [e for e in spec.head + spec.layer + spec.tail if not e.is_object]


def chunk_of(spec: MegatronSpec, entry: Entry, layer: int, part: int) -> torch.Tensor:
    """One saved chunk: layer ``layer``'s part ``part`` of a stacked entry (the whole tensor otherwise)."""
    index = _tensors(spec).index(entry)
    if not entry.stacked:
        return tensor_values(index, entry.shape, spec.dtype)
    piece = tensor_values(index, entry.shape, spec.dtype, layer, layer + 1)
    if entry.parts > 1:
        step = entry.shape[1] // entry.parts
        piece = piece.narrow(1, part * step, step)
    return piece.contiguous().clone()


def expected_state_dict(spec: MegatronSpec) -> dict[str, torch.Tensor]:
    """The stacked tensors dcp_to_torch_save gives (small sizes only; the objects left out)."""
    return {e.key: tensor_values(i, e.shape, spec.dtype) for i, e in enumerate(_tensors(spec))}


def _planner(spec: MegatronSpec) -> Any:
    from torch.distributed.checkpoint.default_planner import create_default_global_save_plan
    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, MetadataIndex, TensorProperties
    from torch.distributed.checkpoint.planner import SavePlan, SavePlanner, TensorWriteData, WriteItem, WriteItemType

    def tensor_item(e: Entry, layer: int, part: int) -> tuple[WriteItem, tuple[Entry, int, int]]:
        sizes = list(e.shape)
        offsets = [0] * len(sizes)
        if e.stacked:
            sizes[0], offsets[0] = 1, layer
            if e.parts > 1:
                sizes[1] //= e.parts
                offsets[1] = part * sizes[1]
        index = MetadataIndex(e.key, torch.Size(offsets))
        chunk = ChunkStorageMetadata(torch.Size(offsets), torch.Size(sizes))
        props = TensorProperties(dtype=spec.dtype)
        return WriteItem(index, WriteItemType.SHARD, tensor_data=TensorWriteData(chunk, props, torch.Size(e.shape))), \
            (e, layer, part)

    class MegatronLikePlanner(SavePlanner):
        """Megatron's per-layer chunks of its stacked tensors, in its save order, data made on demand."""

        def set_up_planner(self, state_dict: Any, storage_meta: Any = None, is_coordinator: bool = False) -> None:
            self.data: dict[MetadataIndex, Any] = {}

        def create_local_plan(self) -> SavePlan:
            items = []
            for e in spec.head:
                item, where = tensor_item(e, 0, 0)
                items.append(item)
                self.data[item.index] = where
            for layer in range(spec.layers):
                for e in spec.layer:
                    if e.is_object:
                        index = MetadataIndex(f"{e.key}/shard_{layer}_{spec.layers}")
                        buf = io.BytesIO()
                        torch.save([None], buf)
                        self.data[index] = buf
                        items.append(WriteItem(index, WriteItemType.BYTE_IO))  # no size: as Megatron's
                        continue
                    for part in range(e.parts):
                        item, where = tensor_item(e, layer, part)
                        items.append(item)
                        self.data[item.index] = where
            for e in spec.tail:
                item, where = tensor_item(e, 0, 0)
                items.append(item)
                self.data[item.index] = where
            return SavePlan(items, planner_data={})

        def create_global_plan(self, all_plans: list[SavePlan]) -> Any:
            plans, metadata = create_default_global_save_plan(all_plans, rewrite_index_hints=False)
            metadata.all_local_plans = all_plans  # Megatron keeps them, to reuse the metadata on the next save
            return plans, metadata

        def finish_plan(self, new_plan: SavePlan) -> SavePlan:
            return new_plan

        def resolve_data(self, write_item: WriteItem) -> Any:
            found = self.data[write_item.index]
            if isinstance(found, io.BytesIO):
                return io.BytesIO(found.getvalue())
            return chunk_of(spec, *found)

    return MegatronLikePlanner()


def write_megatron(out: str, spec: MegatronSpec) -> None:
    """The folder: DCP files and .metadata by torch's dcp.save, then common.pt and metadata.json as Megatron."""
    import warnings

    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import StorageMeta

    class Writer(dcp.FileSystemWriter):
        """Records the folder as the str Megatron passes (torch's writer would pickle a pathlib.Path)."""

        def storage_meta(self) -> StorageMeta | None:
            return StorageMeta(checkpoint_id=out, save_id=self.save_id)

    os.makedirs(out, exist_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "torch.distributed is not initialized": no_dist is meant
        dcp.save({}, storage_writer=Writer(out, thread_count=2), planner=_planner(spec), no_dist=True)
    # common.pt as Megatron-LM saves it (fixtures/megatron/generate.py): the iteration, the checkpoint version and
    # the run's args (an argparse.Namespace: torch.load(weights_only=True) refuses it without add_safe_globals)
    args = argparse.Namespace(num_layers=spec.layers, tensor_model_parallel_size=1, pipeline_model_parallel_size=1,
                              expert_model_parallel_size=1, num_experts=None)
    torch.save({"iteration": 7, "checkpoint_version": 3.0, "args": args}, os.path.join(out, "common.pt"))
    with open(os.path.join(out, "metadata.json"), "w") as f:
        json.dump(METADATA_JSON, f)


def nbytes(spec: MegatronSpec) -> int:
    return sum(math.prod(e.shape) for e in _tensors(spec)) * torch.empty((), dtype=spec.dtype).element_size()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("out")
    parser.add_argument("--gib", type=float, default=2.0, help="approximate folder size, GiB")
    parser.add_argument("--bf16", action="store_true")
    args = parser.parse_args(argv)
    write_megatron(args.out, llama_like_spec(args.gib, torch.bfloat16 if args.bf16 else torch.float32))
    return 0


if __name__ == "__main__":
    sys.exit(main())
