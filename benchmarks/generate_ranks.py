"""Write a folder of per-rank DTensor files as verl saves them, and run verl's merge of it (the reference).

The input: ``model_world_size_N_rank_K.pt``, each rank's ``torch.save`` of
a Llama-like model's FSDP2 state dict (every parameter a DTensor
``Shard(0)`` in ``torch.chunk`` pieces, as ``fully_shard`` leaves it; the
shapes of generate_dcp.llama_like_spec). N real gloo processes on CPU build
real DTensors (``DTensor.from_local`` on ``init_device_mesh("cpu", (N,))``),
so the pickles are torch's own; each holds only its rank's rows.

The reference, ``--merge``: verl's load-everything merge
(verl/model_merger/fsdp_model_merger.py): one process joins a gloo process
group (a DTensor cannot be unpickled without one), ``torch.load(...,
weights_only=False)`` of every rank's file (on threads, as verl), then per
key ``torch.cat`` of the ranks' ``_local_tensor`` along the placement's dim
(``Replicate()``: rank 0's), and ``safetensors.torch.save_file``. verl also
casts to bf16 (``--bf16``); left out by default so that the output is
comparable bit for bit with ckpt's.

    python3 benchmarks/generate_ranks.py OUT --gib 2 --world-size 4
    python3 benchmarks/generate_ranks.py --merge OUT model.safetensors
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile

import torch

HERE = os.path.dirname(os.path.abspath(__file__))


def _rows(n: int, world: int, rank: int) -> tuple[int, int]:
    """torch.chunk's piece ``rank`` of ``n`` rows (Shard(0)): (start, count)."""
    full = -(-n // world) if n else 0
    start = min(full * rank, n)
    return start, min(full * (rank + 1), n) - start


def _rendezvous() -> str:
    """A file rendezvous for init_process_group: no TCP port is picked, so none can be raced for (gloo's own
    sockets bind to port 0)."""
    return "file://" + os.path.join(tempfile.mkdtemp(prefix="ckpt-rdv-"), "store")


Tensors = list[tuple[str, tuple[int, ...], torch.dtype]]


def _write_rank(rank: int, out: str, tensors: Tensors, world: int, rendezvous: str) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard

    dist.init_process_group("gloo", init_method=rendezvous, rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (world,))
    g = torch.Generator().manual_seed(1000 + rank)
    sd = {}
    for name, shape, dtype in tensors:
        _, count = _rows(shape[0], world, rank)
        local = torch.empty((count, *shape[1:]), dtype=dtype).uniform_(-1, 1, generator=g)
        sd[name] = DTensor.from_local(local, mesh, [Shard(0)], run_check=False, shape=torch.Size(shape),
                                      stride=torch.empty(shape, device="meta").stride())
    torch.save(sd, os.path.join(out, f"model_world_size_{world}_rank_{rank}.pt"))
    dist.barrier()
    dist.destroy_process_group()


def write_ranks(out: str, gib: float, world: int, bf16: bool = False, tensors: Tensors | None = None) -> None:
    """Spawn ``world`` gloo processes that each save their rank's file into ``out``.

    ``tensors`` (name, global shape, dtype) replaces the Llama-like model of ``gib`` GiB.
    """
    import torch.multiprocessing as mp

    if tensors is None:
        sys.path.insert(0, HERE)
        import generate_dcp

        tensors = generate_dcp.llama_like_spec(gib, world, torch.bfloat16 if bf16 else torch.float32).tensors
    os.makedirs(out, exist_ok=True)
    mp.spawn(_write_rank, args=(out, tensors, world, _rendezvous()), nprocs=world)


def verl_merge(folder: str, output: str, bf16: bool = False) -> None:
    """verl's merge: every rank loaded whole with weights_only=False inside a process group, cat, save."""
    import glob
    import re
    from concurrent.futures import ThreadPoolExecutor

    import torch.distributed as dist
    from safetensors.torch import save_file
    from torch.distributed.tensor import DTensor

    dist.init_process_group("gloo", init_method=_rendezvous(), rank=0, world_size=1)
    files = glob.glob(os.path.join(folder, "model_world_size_*_rank_*.pt"))
    files.sort(key=lambda f: int(re.search(r"_rank_(\d+)\.pt$", f).group(1)))  # type: ignore[union-attr]
    with ThreadPoolExecutor(min(32, os.cpu_count() or 1)) as pool:
        shards = list(pool.map(lambda f: torch.load(f, map_location="cpu", weights_only=False), files))
    merged = {}
    for key in list(shards[0]):
        first = shards[0][key]
        if not isinstance(first, DTensor):
            merged[key] = first
            continue
        (placement,) = first.placements  # verl: a 1-D FSDP mesh
        parts = [s.pop(key)._local_tensor for s in shards]
        if bf16:
            parts = [p.bfloat16() for p in parts]
        merged[key] = parts[0] if placement.is_replicate() else torch.cat(parts, dim=placement.dim).contiguous()
        del parts
    del shards
    save_file(merged, output)
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", help="the folder to write (or, with --merge, to read)")
    parser.add_argument("merged", nargs="?", help="with --merge: the .safetensors to write")
    parser.add_argument("--gib", type=float, default=2.0, help="approximate model size, GiB")
    parser.add_argument("--world-size", type=int, default=4)
    parser.add_argument("--bf16", action="store_true", help="a bf16 model; with --merge: cast to bf16 as verl does")
    parser.add_argument("--merge", action="store_true", help="run verl's merge of the folder OUT into MERGED")
    args = parser.parse_args(argv)
    if args.merge:
        if not args.merged:
            parser.error("--merge needs the output file")
        verl_merge(args.out, args.merged, args.bf16)
    else:
        write_ranks(args.out, args.gib, args.world_size, args.bf16)
    return 0


if __name__ == "__main__":
    sys.exit(main())
