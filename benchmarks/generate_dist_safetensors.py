"""Write torch's distributed Hugging Face safetensors layout without distributed training.

What ``HuggingFaceStorageWriter(save_distributed=True)`` writes: one
``shard-RRRRR-model-00001-of-00001.safetensors`` per rank (R from 1), each
holding that rank's ``Shard(0)`` rows of every tensor (torch.chunk sizes;
a rank with no rows writes none), placed by the JSON in
``__metadata__["DCP_SHARDING_INFO"]`` (``{"fqn": {"saved_offsets": [...]}}``)
beside ``"DCP_VERSION": "1.0"``; no index. The tensors are those of
generate_dcp.llama_like_spec (the same model as the DCP input).

    python3 benchmarks/generate_dist_safetensors.py OUT --gib 1 --world-size 4
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from generate_dcp import DcpSpec, chunk_rows, llama_like_spec, tensor_values


def write_dist_safetensors(out: str, spec: DcpSpec) -> None:
    from safetensors.torch import save_file

    os.makedirs(out, exist_ok=True)
    world = spec.world_size
    for rank in range(world):
        pieces, info = {}, {}
        for index, (name, shape, dtype) in enumerate(spec.tensors):
            lo, hi = chunk_rows(shape[0], world, rank)
            if hi <= lo:
                continue
            pieces[name] = tensor_values(index, shape, dtype, lo, hi)
            info[name] = {"saved_offsets": [lo, *[0] * (len(shape) - 1)]}
        meta = {"format": "pt", "DCP_SHARDING_INFO": json.dumps(info), "DCP_VERSION": "1.0"}
        save_file(pieces, os.path.join(out, f"shard-{rank + 1:05d}-model-00001-of-00001.safetensors"), metadata=meta)
        del pieces


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out")
    parser.add_argument("--gib", type=float, default=1.0)
    parser.add_argument("--world-size", type=int, default=4)
    args = parser.parse_args(argv)
    write_dist_safetensors(args.out, llama_like_spec(args.gib, args.world_size))
    return 0


if __name__ == "__main__":
    sys.exit(main())
