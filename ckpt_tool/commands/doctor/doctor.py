"""``ckpt doctor``: is this environment able to run and verify checkpoints on its devices?

Versions alone do not prove a GPU works (a driver mismatch, a busy or
faulty device, MIG without a slice): one real computation per device,
checked against a float64 reference on the CPU, does.
"""
from __future__ import annotations

import importlib.metadata
import platform
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from ...version import __version__

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


@dataclass(frozen=True)
class DoctorReport:
    python: str
    platform: str
    ckpt: str
    torch: str | None
    cuda: str | None  # the CUDA version torch was built with
    cudnn: int | None
    cuda_available: bool
    device_count: int
    packages: dict[str, str | None]
    devices: tuple[DeviceCheck, ...]
    problems: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.torch is not None and not self.problems and all(d.ok for d in self.devices)

    @property
    def verdict(self) -> str:
        if self.ok:
            gpus = [d.device for d in self.devices if d.device != "cpu"]
            return "OK: " + ("every device computed correctly (" + ", ".join(["cpu", *gpus]) + ")"
                             if gpus else "the CPU computed correctly; no GPU is visible")
        failed = [d.device for d in self.devices if not d.ok]
        return "FAILED: " + "; ".join(list(self.problems) + [f"{d} did not compute correctly" for d in failed])

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok, "verdict": self.verdict, "python": self.python, "platform": self.platform,
            "ckpt": self.ckpt, "torch": self.torch, "cuda": self.cuda, "cudnn": self.cudnn,
            "cuda_available": self.cuda_available, "device_count": self.device_count,
            "packages": dict(self.packages), "devices": [d.to_json() for d in self.devices],
            "problems": list(self.problems), "notes": list(self.notes),
        }


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def check_device(torch: Any, device: str) -> DeviceCheck:
    """A seeded matmul and reduction on ``device``, compared with float64 on the CPU."""
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


def run_doctor() -> DoctorReport:
    """Versions, devices, and one checked computation on the CPU and every visible GPU."""
    packages = {m: _version(m) for m in ("safetensors", "numpy", "dill", "click", "tabulate", "deepdiff")}
    base: dict[str, Any] = {"python": sys.version.split()[0], "platform": platform.platform(), "ckpt": __version__,
                            "packages": packages}
    try:
        import torch
    except ImportError as exc:  # the one thing doctor must survive: report it
        return DoctorReport(**base, torch=None, cuda=None, cudnn=None, cuda_available=False, device_count=0,
                            devices=(), problems=(f"torch cannot be imported: {exc}",))
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
    checks = tuple(check_device(torch, d) for d in devices)
    cudnn = None
    try:
        cudnn = torch.backends.cudnn.version() if available else None  # type: ignore[no-untyped-call]
    except Exception:  # noqa: BLE001 - cudnn missing is a note, not a failure
        notes.append("cuDNN is not available")
    return DoctorReport(**base, torch=torch.__version__, cuda=torch.version.cuda, cudnn=cudnn,
                        cuda_available=available, device_count=count, devices=checks,
                        problems=tuple(problems), notes=tuple(notes))


doctor = run_doctor


def clean_temporaries(folder: str, *, dry_run: bool = False) -> Any:
    """``ckpt doctor --clean``: remove the stale temporary outputs of killed runs under ``folder``.

    Returns a staletemp.CleanReport; only temporaries whose writer is proven
    gone are removed (see staletemp.py for the rule).
    """
    import os

    from ...errors import UsageError
    from ...io.atomic.staletemp import clean

    if not os.path.isdir(folder):
        what = "does not exist" if not os.path.lexists(folder) else "is not a folder"
        raise UsageError(f"--clean needs a folder to search: {folder} {what}")
    return clean(folder, recursive=True, dry_run=dry_run)
