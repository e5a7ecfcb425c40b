"""The torch side of ``ckpt doctor``: versions, devices, and one real computation on each.

Versions alone do not prove a GPU works (a driver mismatch, a busy or
faulty device, MIG without a slice): one seeded matmul per device, checked
against a float64 reference on the CPU, does. commands/doctor/command.py
adds the Python side and the verdict.
"""
from __future__ import annotations

import platform
import time
from dataclasses import dataclass, field
from typing import Any

MATRIX = 256
TOLERANCE = 1e-2  # relative; TF32 or reduced-precision matmul kernels stay well inside it


@dataclass(frozen=True)
class DeviceCheck:
    device: str  # "cpu", "cuda:0", "mps"
    name: str
    ok: bool
    detail: str
    seconds: float = 0.0
    properties: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"device": self.device, "name": self.name, "ok": self.ok, "detail": self.detail,
                "seconds": round(self.seconds, 4), "properties": dict(self.properties)}



@dataclass(frozen=True, kw_only=True)
class TorchEnvironment:
    """What the installed torch reports, and how each device it sees computed."""

    torch: str
    cuda: str | None  # the CUDA version torch was built with
    cudnn: int | None
    cuda_available: bool
    device_count: int
    devices: tuple[DeviceCheck, ...]
    problems: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()


def check_device(device: str) -> DeviceCheck:
    """A seeded matmul and reduction on ``device``, compared with float64 on the CPU."""
    import torch

    g = torch.Generator().manual_seed(0)
    a = torch.randn(MATRIX, MATRIX, generator=g)
    b = torch.randn(MATRIX, MATRIX, generator=g)
    reference = (a.double() @ b.double()).relu().sum(dim=0)
    name = device
    props: dict[str, Any] = {}
    start = time.perf_counter()
    try:
        if device.startswith("cuda"):
            index = int(device.split(":")[1])
            p = torch.cuda.get_device_properties(index)
            name = p.name
            props = {"capability": f"{p.major}.{p.minor}", "total_memory": int(p.total_memory),
                     "multiprocessors": int(p.multi_processor_count)}
        elif device == "cpu":
            name = platform.processor() or platform.machine()
            props = {"threads": torch.get_num_threads()}
        x = (a.to(device) @ b.to(device)).relu().sum(dim=0)
        if device.startswith("cuda"):
            torch.cuda.synchronize(device)
        result = x.to("cpu").double()
    except Exception as exc:  # noqa: BLE001 - any failure of the device is the finding we report
        text = str(exc).strip().splitlines()
        return DeviceCheck(device, name, False, f"{type(exc).__name__}: {text[0] if text else ''}",
                           time.perf_counter() - start, props)
    seconds = time.perf_counter() - start
    if not bool(torch.isfinite(result).all()):
        return DeviceCheck(device, name, False, "the result holds NaN/Inf", seconds, props)
    err = float((result - reference).abs().max() / reference.abs().max())
    ok = err < TOLERANCE
    detail = (f"{MATRIX}x{MATRIX} matmul + relu + sum: relative error {err:.1e} vs float64 on the CPU"
              + ("" if ok else f" (over the tolerance {TOLERANCE:g})"))
    return DeviceCheck(device, name, ok, detail, seconds, props)


def probe_torch() -> TorchEnvironment | str:
    """The environment torch sees, each device checked; a str (the message) when torch cannot be imported."""
    try:
        import torch
    except ImportError as exc:
        return f"torch cannot be imported: {exc}"
    problems: list[str] = []
    notes: list[str] = []
    try:
        available = bool(torch.cuda.is_available())
        count = torch.cuda.device_count() if available else 0
    except Exception as exc:  # noqa: BLE001 - a broken driver raises here; that is the diagnosis
        available, count = False, 0
        problems.append(f"CUDA initialisation failed: {type(exc).__name__}: {exc}")
    if torch.version.cuda and not available and not problems:
        notes.append(f"torch is built with CUDA {torch.version.cuda} but no GPU is visible "
                     "(driver missing, CUDA_VISIBLE_DEVICES empty, or no device)")
    devices = ["cpu"] + [f"cuda:{i}" for i in range(count)]
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        devices.append("mps")
    checks = tuple(check_device(d) for d in devices)
    cudnn = None
    try:
        cudnn = torch.backends.cudnn.version() if available else None  # type: ignore[no-untyped-call]
    except Exception:  # noqa: BLE001 - cudnn missing is a note, not a failure
        notes.append("cuDNN is not available")
    return TorchEnvironment(torch=torch.__version__, cuda=torch.version.cuda, cudnn=cudnn, cuda_available=available,
                            device_count=count, devices=checks, problems=tuple(problems), notes=tuple(notes))
