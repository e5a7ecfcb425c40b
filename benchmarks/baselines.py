"""What a user could run instead of ckpt: each baseline as one whole python process.

    python3 benchmarks/baselines.py OPERATION ARGS...

Every operation does the work completely (tensor data is touched where the
operation needs data), so its wall time and peak memory are comparable with
the ckpt command beside it in RESULTS.md.
"""
from __future__ import annotations

import json
import os
import sys
from typing import Any, Callable, Iterator


def _shard_files(path: str) -> list[str]:
    """The safetensors files of a file, an index.json or a folder holding one."""
    if os.path.isdir(path):
        index = [f for f in os.listdir(path) if f.endswith(".index.json")]
        if not index:
            return sorted(os.path.join(path, f) for f in os.listdir(path) if f.endswith(".safetensors"))
        path = os.path.join(path, index[0])
    if path.endswith(".index.json"):
        with open(path) as f:
            weight_map = json.load(f)["weight_map"]
        folder = os.path.dirname(path)
        return [os.path.join(folder, name) for name in sorted(set(weight_map.values()))]
    return [path]


def _is_safetensors(path: str) -> bool:
    return os.path.isdir(path) or path.endswith((".safetensors", ".index.json"))


def torch_load(path: str) -> None:
    """torch.load with its defaults (weights_only=True): every byte is read into memory."""
    import torch

    sd = torch.load(path, map_location="cpu")
    print(len(sd))


def torch_load_mmap(path: str) -> None:
    """torch.load(mmap=True) and list every key, dtype and shape (the metadata question)."""
    import torch

    sd = torch.load(path, map_location="cpu", mmap=True)
    print(sum(1 for k, v in sd.items() if (k, v.dtype, tuple(v.shape))))


def safe_open_shapes(path: str) -> None:
    """safetensors safe_open: list every key, dtype and shape without reading data."""
    from safetensors import safe_open

    n = 0
    for file in _shard_files(path):
        with safe_open(file, framework="numpy") as f:
            for k in f.keys():
                s = f.get_slice(k)
                n += bool((k, s.get_dtype(), tuple(s.get_shape())))
    print(n)


def load_file_touch(path: str) -> None:
    """safetensors load_file, then touch every tensor (load_file maps lazily: FACTS.md)."""
    from safetensors.torch import load_file

    total = 0
    for file in _shard_files(path):
        sd = load_file(file)
        for v in sd.values():
            total += v.clone().numel()  # a copy in memory, like torch.load's
    print(total)


def _tensors(path: str) -> Iterator[tuple[str, Any]]:
    """(key, tensor) from a .pth (torch.load mmap) or safetensors (safe_open), lazily."""
    if _is_safetensors(path):
        from safetensors import safe_open

        for file in _shard_files(path):
            with safe_open(file, framework="pt") as f:
                for k in f.keys():
                    yield k, f.get_tensor(k)
    else:
        import torch

        yield from torch.load(path, map_location="cpu", mmap=True).items()


def _shapes(path: str) -> dict[str, tuple[str, tuple[int, ...]]]:
    if _is_safetensors(path):
        from safetensors import safe_open

        out = {}
        for file in _shard_files(path):
            with safe_open(file, framework="pt") as f:
                for k in f.keys():
                    s = f.get_slice(k)
                    out[k] = (s.get_dtype(), tuple(s.get_shape()))
        return out
    import torch

    return {k: (str(v.dtype), tuple(v.shape)) for k, v in torch.load(path, map_location="cpu", mmap=True).items()}


def diff_keys(a: str, b: str) -> None:
    """Keys and shapes of A and B compared the plain way (torch.load mmap / safe_open)."""
    sa, sb = _shapes(a), _shapes(b)
    missing = sorted(set(sb) - set(sa))
    unexpected = sorted(set(sa) - set(sb))
    mismatch = [k for k in sa.keys() & sb.keys() if sa[k][1] != sb[k][1]]
    print(len(missing), len(unexpected), len(mismatch))


def diff_values(a: str, b: str) -> None:
    """Per-tensor max |A - B| in float32, tensor by tensor (torch.load mmap + safe_open)."""
    import torch

    other = dict(_tensors(b))
    worst = 0.0
    for k, x in _tensors(a):
        y = other.get(k)
        if y is not None and y.shape == x.shape:
            worst = max(worst, float((x.float() - y.float()).abs().max()) if x.numel() else 0.0)
    print(worst)
    del torch


def nan_check(*paths: str) -> None:
    """Every tensor of every file checked for NaN/Inf with torch.isfinite."""
    import torch

    bad = 0
    for path in paths:
        for _, t in _tensors(path):
            if t.is_floating_point() and not bool(torch.isfinite(t).all()):
                bad += 1
    print(bad)


def naive_migrate(src: str, out: str, strip: str) -> None:
    """torch.load + strip prefix + safetensors save_file + full re-read + torch.equal per tensor."""
    import torch
    from safetensors.torch import load_file, save_file

    sd = torch.load(src, map_location="cpu")
    new = {(k[len(strip):] if k.startswith(strip) else k): v.contiguous() for k, v in sd.items()}
    save_file(new, out)
    back = load_file(out)
    if set(back) != set(new) or not all(torch.equal(back[k], v) for k, v in new.items()):
        raise SystemExit("naive migrate: verification failed")
    print(len(back))


def fickling_scan(path: str) -> None:
    """fickling's analysis of a torch zip's data.pkl (its CLI reads plain pickles only)."""
    from pathlib import Path

    from fickling.analysis import check_safety
    from fickling.pytorch import PyTorchModelWrapper

    print(check_safety(PyTorchModelWrapper(Path(path)).pickled).severity)


OPERATIONS: dict[str, Callable[..., None]] = {
    "torch-load": torch_load,
    "torch-load-mmap": torch_load_mmap,
    "safe-open-shapes": safe_open_shapes,
    "load-file-touch": load_file_touch,
    "diff-keys": diff_keys,
    "diff-values": diff_values,
    "nan-check": nan_check,
    "naive-migrate": naive_migrate,
    "fickling-scan": fickling_scan,
}


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in OPERATIONS:
        print(f"usage: baselines.py {{{','.join(OPERATIONS)}}} ARGS...", file=sys.stderr)
        return 2
    OPERATIONS[argv[0]](*argv[1:])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
