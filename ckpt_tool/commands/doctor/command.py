"""``ckpt doctor``: is this environment able to run and verify checkpoints on its devices?

Versions alone do not prove a GPU works (a driver mismatch, a busy or
faulty device, MIG without a slice): one real computation per device,
checked against a float64 reference on the CPU, does.
"""
from __future__ import annotations

import importlib.metadata
import platform
import sys
from dataclasses import dataclass
from typing import Any

from ...tensors.runtime import DeviceCheck, check_device, probe_torch
from ...version import __version__

__all__ = ["DeviceCheck", "DoctorReport", "check_device", "clean_temporaries", "doctor", "run_doctor"]


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


def run_doctor() -> DoctorReport:
    """Versions, devices, and one checked computation on the CPU and every visible GPU."""
    packages = {m: _version(m) for m in ("safetensors", "numpy", "dill", "click", "tabulate", "deepdiff")}
    base: dict[str, Any] = {"python": sys.version.split()[0], "platform": platform.platform(), "ckpt": __version__,
                            "packages": packages}
    env = probe_torch()
    if isinstance(env, str):  # the one thing doctor must survive: report it
        return DoctorReport(**base, torch=None, cuda=None, cudnn=None, cuda_available=False, device_count=0,
                            devices=(), problems=(env,))
    return DoctorReport(**base, torch=env.torch, cuda=env.cuda, cudnn=env.cudnn, cuda_available=env.cuda_available,
                        device_count=env.device_count, devices=env.devices, problems=env.problems, notes=env.notes)


doctor = run_doctor


def clean_temporaries(folder: str, *, dry_run: bool = False) -> Any:
    """``ckpt doctor --clean``: remove the stale temporary outputs of killed runs under ``folder``.

    Returns a staletemp.CleanReport; only temporaries whose writer is proven
    gone are removed (see staletemp.py for the rule).
    """
    import os

    from ...errors import UsageError
    from ...io.atomic import clean

    if not os.path.isdir(folder):
        what = "does not exist" if not os.path.lexists(folder) else "is not a folder"
        raise UsageError(f"--clean needs a folder to search: {folder} {what}")
    return clean(folder, recursive=True, dry_run=dry_run)
