"""Proving what migrate wrote on each device: which devices to use, and bit-exact round trips.

The calls into torch (listing CUDA devices, copying to a device and back,
strict loads into the target) are tensors/devices.py; only they import
torch, and only when asked for a device or a target. The CPU re-read in
compare.py needs none.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

from ....model import TensorMeta
from ....tensors.runtime import devices as torch_devices
from ....writers import OutTensor, out_bytes
from .compare import MAX_REPORTED, Advance


def available_devices() -> list[str]:
    """cpu plus every CUDA device torch can use here."""
    return ["cpu", *torch_devices.cuda_devices()]


def resolve_devices(requested: Sequence[str] | None) -> tuple[list[str], dict[str, str]]:
    """(devices to verify on, status of those that cannot be). An explicit unavailable device is an error."""
    from ....errors import UsageError

    have = available_devices()
    if not requested:
        status = {} if any(d.startswith("cuda") for d in have) else {"cuda": "not available"}
        return have, status
    chosen: list[str] = []
    for dev in requested:
        d = dev.strip().lower()
        if d == "cuda":
            cudas = [x for x in have if x.startswith("cuda:")]
            if not cudas:
                raise UsageError("--device cuda: CUDA is not available on this machine "
                                 "(torch.cuda.is_available() is False); run `ckpt doctor` for details")
            chosen += cudas
        elif d == "cpu" or d in have:
            chosen.append(d)
        elif d.startswith("cuda"):
            raise UsageError(f"--device {dev}: not available here (available: {', '.join(have)})")
        else:
            raise UsageError(f"--device {dev}: expected cpu, cuda or cuda:N")
    return list(dict.fromkeys(chosen)), {}


def roundtrip_device(actual: Mapping[str, TensorMeta], expected: Sequence[OutTensor], device: str,
                     advance: Advance | None = None) -> list[str]:
    """Each output tensor copied to ``device`` and back must keep every bit."""
    problems: list[str] = []
    for t in expected:
        meta = actual.get(t.key)
        if meta is None or meta.quantizer is not None:  # quantized tensors have CPU kernels only: compared on the CPU
            continue
        if torch_devices.roundtrip_bytes(meta, device) != out_bytes(t):
            problems.append(f"{t.key}: changed on a round trip through {device}")
        if advance is not None:
            advance(t.nbytes)
        if len(problems) >= MAX_REPORTED:
            break
    return problems

