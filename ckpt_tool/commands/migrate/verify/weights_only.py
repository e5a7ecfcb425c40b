"""Proving a ``--sanitize`` output loads with ``torch.load(weights_only=True)``, in a fresh process.

A fresh interpreter, because the process that wrote the file may hold
allowlisted globals (``add_safe_globals``) or imported classes that a
deployment's loader would not have; torch is only imported there.
"""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tempfile

TIMEOUT_S = 600
_CODE = (
    "import sys, warnings\n"
    "warnings.simplefilter('ignore')\n"
    "import torch\n"
    "torch.load(sys.argv[1], weights_only=True, map_location='cpu')\n"
)


def load_weights_only(path: str, timeout: float = TIMEOUT_S) -> tuple[str, str | None]:
    """(outcome, problem): ("passed", None), ("failed", why) or ("not checked: ...", None) without torch."""
    if importlib.util.find_spec("torch") is None:
        return "not checked: torch is not installed", None
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_FORCE_")}
    try:
        r = subprocess.run([sys.executable, "-c", _CODE, os.path.abspath(path)], capture_output=True, text=True,
                           timeout=timeout, env=env, cwd=tempfile.gettempdir(), check=False)
    except subprocess.TimeoutExpired:
        return "failed", f"torch.load(weights_only=True) of the output did not finish in {timeout:.0f} s"
    except OSError as exc:
        return f"not checked: {exc.strerror}", None
    if r.returncode == 0:
        return "passed", None
    lines = [ln.strip() for ln in r.stderr.strip().splitlines() if ln.strip()]
    why = next((ln for ln in reversed(lines) if "Error" in ln or "error" in ln), lines[-1] if lines else "")
    return "failed", f"torch.load(weights_only=True) refused the output: {why[:400]}"


__all__ = ["load_weights_only"]
