"""Proving what migrate wrote on each device: bit-exact round trips and strict loads into the target.

Only these checks import torch (and only when asked for a device or a
target); the CPU re-read in verify_compare.py needs none.
"""
from __future__ import annotations

import fnmatch
import os
import sys
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

from ....model import TensorMeta
from ....writers.base import OutTensor
from ....writers.sourcebytes import out_bytes
from .compare import MAX_REPORTED, Advance


def _cuda_devices_present() -> bool:
    """Cheap check before importing torch: without a driver's device nodes there is no CUDA."""
    if "torch" in sys.modules:
        return True
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
        return False
    try:
        names = os.listdir("/dev")
    except OSError:
        return True  # cannot tell without torch
    return any(n.startswith("nvidia") or n == "kfd" for n in names)


def available_devices() -> list[str]:
    """cpu plus every CUDA device torch can use here."""
    devices = ["cpu"]
    if not _cuda_devices_present():
        return devices
    try:
        import torch
    except ImportError:
        return devices
    if torch.cuda.is_available():
        devices += [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    return devices


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
    import torch

    from ....tensors.tensordata import to_torch

    problems: list[str] = []
    for t in expected:
        meta = actual.get(t.key)
        if meta is None or meta.quantizer is not None:  # quantized tensors have CPU kernels only: compared on the CPU
            continue
        x = to_torch(meta).to(device)
        if device.startswith("cuda"):
            torch.cuda.synchronize(torch.device(device))
        back = x.cpu().contiguous()
        got = back.reshape(-1).view(torch.uint8).numpy().tobytes() if back.numel() else b""
        if got != out_bytes(t):
            problems.append(f"{t.key}: changed on a round trip through {device}")
        if advance is not None:
            advance(t.nbytes)
        if len(problems) >= MAX_REPORTED:
            break
    return problems


def _allowed(key: str, globs: Sequence[str]) -> bool:
    return any(fnmatch.fnmatchcase(key, g) for g in globs)


def _to(value: Any, device: str) -> Any:
    if isinstance(value, tuple):
        return tuple(None if v is None else _to(v, device) for v in value)
    return value if value.is_quantized and device == "cpu" else value.to(device)


def load_into_target(module: Any, actual: Mapping[str, TensorMeta], device: str,
                     allow_missing: Sequence[str] = (), advance: Advance | None = None,
                     extras: tuple[Mapping[str, Any], Any] = ({}, None)) -> list[str]:
    """``load_state_dict(strict=True)`` on ``device``, then every loaded value compared back bit for bit.

    Keys matched by ``allow_missing`` may be absent (a new head the model initialises itself).
    ``extras``: the output's non-tensor entries a loader reads (a packed params' dtype) and its
    ``_metadata`` (module versions), handed to load_state_dict as torch.load would.
    """
    import torch

    from ....tensors.quantized import flat_state, packed_layout, torch_state, value_bytes

    module.to(device)
    layout = packed_layout(module.state_dict())
    state = OrderedDict((k, _to(v, device)) for k, v in torch_state(actual, layout).items())
    given = OrderedDict(state, **extras[0])
    if extras[1] is not None:
        given._metadata = extras[1]  # type: ignore[attr-defined]
    try:
        result = module.load_state_dict(given, strict=not allow_missing)
    except RuntimeError as exc:
        lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
        return [f"load_state_dict(strict=True) on {device} failed: " + " ".join(lines[:3])[:600]]
    except Exception as exc:  # noqa: BLE001 - a module's own _load_from_state_dict may raise anything
        return [f"load_state_dict(strict=True) on {device} failed: the target's loader raised "
                f"{type(exc).__name__}: {str(exc)[:300]}"]
    if allow_missing:
        bad_missing = [k for k in result.missing_keys if not _allowed(k, allow_missing)]
        if bad_missing or result.unexpected_keys:
            return [f"load_state_dict on {device}: missing {bad_missing[:MAX_REPORTED]}, "
                    f"unexpected {list(result.unexpected_keys)[:MAX_REPORTED]}"]
    loaded = flat_state(module.state_dict(keep_vars=False))
    if device.startswith("cuda"):
        torch.cuda.synchronize(torch.device(device))
    problems: list[str] = []
    for k, given in flat_state(state).items():
        have = loaded.get(k)
        if have is None:
            continue
        want = (given if given.is_quantized else given.to(have.dtype)).cpu()
        got = have.detach().cpu()
        if tuple(got.shape) != tuple(want.shape):
            problems.append(f"{k}: loaded with shape {list(got.shape)} on {device}")
        elif got.numel() and value_bytes(got) != value_bytes(want):
            problems.append(f"{k}: the value loaded on {device} differs from the file")
        if advance is not None:
            advance(int(got.numel() * got.element_size()))
        if len(problems) >= MAX_REPORTED:
            break
    module.to("cpu")
    return problems
