"""The torch side of proving a migrate output on a device: which devices exist, round trips, target loads.

commands/migrate/verify/ decides what to check and words the findings;
the calls into torch are here. torch is imported only when a device or a
target is checked, and not even to list devices on a machine without CUDA.
"""
from __future__ import annotations

import fnmatch
import os
import sys
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from ...model import TensorMeta

if TYPE_CHECKING:
    import torch

Advance = Callable[[int], None]


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


def cuda_devices() -> list[str]:
    """``cuda:N`` for every CUDA device torch can use here (none without torch)."""
    if not _cuda_devices_present():
        return []
    try:
        import torch
    except ImportError:
        return []
    if not torch.cuda.is_available():
        return []
    return [f"cuda:{i}" for i in range(torch.cuda.device_count())]


def roundtrip_bytes(meta: TensorMeta, device: str) -> bytes:
    """The bytes of ``meta``'s values after a copy to ``device`` and back to the CPU."""
    import torch

    from ..data import to_torch

    x = to_torch(meta).to(device)
    if device.startswith("cuda"):
        torch.cuda.synchronize(torch.device(device))
    back = x.cpu().contiguous()
    return back.reshape(-1).view(torch.uint8).numpy().tobytes() if back.numel() else b""


def _allowed(key: str, globs: Sequence[str]) -> bool:
    return any(fnmatch.fnmatchcase(key, g) for g in globs)


def _to(value: torch.Tensor | tuple[torch.Tensor | None, ...], device: str) -> object:
    if isinstance(value, tuple):
        return tuple(None if v is None else _to(v, device) for v in value)
    return value if value.is_quantized and device == "cpu" else value.to(device)


def load_into_target(module: torch.nn.Module, actual: Mapping[str, TensorMeta], device: str,
                     allow_missing: Sequence[str] = (), advance: Advance | None = None,
                     extras: tuple[Mapping[str, object], object] = ({}, None), limit: int = 5) -> list[str]:
    """``load_state_dict(strict=True)`` on ``device``, then every loaded value compared back bit for bit.

    Keys matched by ``allow_missing`` may be absent (a new head the model initialises itself).
    ``extras``: the output's non-tensor entries a loader reads (a packed params' dtype) and its
    ``_metadata`` (module versions), handed to load_state_dict as torch.load would. At most
    ``limit`` problems are returned.
    """
    import torch

    from ..data import flat_state, packed_layout, torch_state, value_bytes

    module.to(device)
    layout = packed_layout(module.state_dict())
    state = OrderedDict((k, _to(v, device)) for k, v in torch_state(actual, layout).items())
    given: OrderedDict[str, object] = OrderedDict(state, **extras[0])
    if extras[1] is not None:
        given._metadata = extras[1]  # type: ignore[attr-defined]  # torch's own attribute on a state_dict
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
            return [f"load_state_dict on {device}: missing {bad_missing[:limit]}, "
                    f"unexpected {list(result.unexpected_keys)[:limit]}"]
    loaded = flat_state(module.state_dict(keep_vars=False))
    if device.startswith("cuda"):
        torch.cuda.synchronize(torch.device(device))
    problems: list[str] = []
    for k, value in flat_state(state).items():
        have = loaded.get(k)
        if have is None:
            continue
        want = (value if value.is_quantized else value.to(have.dtype)).cpu()
        got = have.detach().cpu()
        if tuple(got.shape) != tuple(want.shape):
            problems.append(f"{k}: loaded with shape {list(got.shape)} on {device}")
        elif got.numel() and value_bytes(got) != value_bytes(want):
            problems.append(f"{k}: the value loaded on {device} differs from the file")
        if advance is not None:
            advance(int(got.numel() * got.element_size()))
        if len(problems) >= limit:
            break
    module.to("cpu")
    return problems
