"""Real TorchScript archives (torch.jit.script + torch.jit.save) whose code runs at torch.jit.load.

HOSTILE cases reach an operator with a side effect from ``__setstate__``
(directly, through a function of another code file, from a submodule three
deep, from a scripted class held as an attribute, or in a spelling written
into the archive's code by hand: ``ops.aten.NAME``, an alias, ``getattr``);
BENIGN ones only store, reshape and compute. Each builder writes the archive
and returns what torch.jit.load does when it loads it: the file it creates
(``creates``) or the RNG seed it sets (``seed``). tests/pickles/test_script_code.py
checks torch really does it, in a subprocess, and that ckpt names it.
"""
from __future__ import annotations

import math
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from tests.pickles.script_helpers import make_file, scale


@dataclass(frozen=True)
class Case:
    path: Path
    spelled: str  # how ckpt names the call ("torch.from_file")
    function: str  # the function that holds it ("__torch__.X.__setstate__"), its suffix
    creates: Path | None = None
    seed: int | None = None


class FromFile(nn.Module):
    def __init__(self, target: str) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(2))
        self.target = target

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.w

    @torch.jit.export
    def __getstate__(self) -> tuple[torch.Tensor, bool, str]:
        return (self.w, self.training, self.target)

    @torch.jit.export
    def __setstate__(self, s: tuple[torch.Tensor, bool, str]) -> None:
        self.training = s[1]
        self.target = s[2]
        self.w = torch.from_file(s[2], True, 4)


class ViaHelper(FromFile):
    @torch.jit.export
    def __setstate__(self, s: tuple[torch.Tensor, bool, str]) -> None:
        self.training = s[1]
        self.target = s[2]
        self.w = make_file(s[2], 4)


class Seeds(FromFile):
    @torch.jit.export
    def __setstate__(self, s: tuple[torch.Tensor, bool, str]) -> None:
        self.training = s[1]
        self.target = s[2]
        self.w = s[0]
        torch.manual_seed(4321)


class Layers(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.reshaper = Benign()
        self.layers = nn.ModuleList([nn.Linear(3, 3), nn.LayerNorm(3), nn.Conv2d(1, 1, 3), nn.BatchNorm2d(1),
                                     nn.LSTM(3, 3), nn.MultiheadAttention(4, 2), nn.TransformerEncoderLayer(4, 2)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.reshaper(x)


@torch.jit.script
class Maker:
    def __init__(self) -> None:
        self.t = torch.zeros(1)

    def prepare(self, path: str) -> torch.Tensor:
        self.t = torch.from_file(path, True, 4)
        return self.t


class CallsClassMethod(FromFile):
    """__setstate__ constructs a scripted class and calls its method, which calls the op."""

    @torch.jit.export
    def __setstate__(self, s: tuple[torch.Tensor, bool, str]) -> None:
        self.training = s[1]
        self.target = s[2]
        self.w = Maker().prepare(s[2])


class Wrap(nn.Module):
    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x)


@torch.jit.script
class Holder:
    def __init__(self, target: str) -> None:
        self.target = target
        self.t = torch.zeros(1)

    def __getstate__(self) -> tuple[str, int]:
        return (self.target, 0)

    def __setstate__(self, s: tuple[str, int]) -> None:
        self.target = s[0]
        self.t = torch.from_file(s[0], True, 4)


class HoldsClass(nn.Module):
    def __init__(self, target: str) -> None:
        super().__init__()
        self.h = Holder(target)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.h.t


class Benign(nn.Module):
    """__setstate__ that only stores, reshapes and computes (held beside nested layers torch ships)."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(2, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x

    @torch.jit.export
    def __getstate__(self) -> tuple[torch.Tensor, bool]:
        return (self.w, self.training)

    @torch.jit.export
    def __setstate__(self, s: tuple[torch.Tensor, bool]) -> None:
        w = s[0].reshape(3, 2).t().contiguous()
        self.w = nn.functional.relu(w) + scale(w).clamp(min=0.0)
        if w.dim() == 2 and len(w.shape) == 2:
            print("loaded", w.size(0))
        self.training = s[1]


class ControlFlow(nn.Module):
    """__setstate__ with what TorchScript prints for no_grad, assert, raise, loops, comprehensions, Optional."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(4))
        self.d: dict[str, int] = {"a": 1}
        self.o: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x

    @torch.jit.export
    def __getstate__(self) -> tuple[torch.Tensor, bool, dict[str, int]]:
        return (self.w, self.training, self.d)

    @torch.jit.export
    def __setstate__(self, s: tuple[torch.Tensor, bool, dict[str, int]]) -> None:
        with torch.no_grad():
            w = s[0].clone()
            w.mul_(2.0)
        self.w = w
        assert w.numel() == 4, "bad"
        if w.numel() != 4:
            raise RuntimeError(f"size {w.numel()}")
        d = s[2]
        for k, v in d.items():
            d[k] = v + 1
        self.d = d
        xs = [i * 2 for i in range(3)]
        total = sum(xs) + int(math.sqrt(16.0)) + len(xs)
        o = self.o
        if o is not None:
            o = o + total + torch.rand(2).to(torch.float64).view(-1)
        self.o = o
        if isinstance(o, torch.Tensor) and ("k" + str(total)).startswith("k"):
            self.training = s[1]
        self.training = s[1]


def _save(module: nn.Module, path: Path) -> Path:
    torch.jit.save(torch.jit.script(module), str(path))
    return path


def _edit(src: Path, dst: Path, line: str) -> Path:
    """Write ``line`` into FromFile.__setstate__ by hand (torch.jit.load compiles the archive's source)."""
    with zipfile.ZipFile(src) as zi, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as zo:
        for name in zi.namelist():
            data = zi.read(name)
            if name.endswith(".py") and "/code/" in name and b"self.w = torch.from_file" in data:
                text = data.decode()
                head, _, tail = text.partition("    self.w = torch.from_file(")
                data = (head + "    " + line + "\n" + tail.split("\n", 1)[1]).encode()
            zo.writestr(name, data)
    return dst


# Spellings written into FromFile.__setstate__ by hand: (line, how ckpt names the call).
EDITS: dict[str, tuple[str, str]] = {
    "ops_aten_spelling": ("self.w = ops.aten.from_file((s)[2], True, 4)", "ops.aten.from_file"),
    "alias": ("f = torch.from_file\n    self.w = f((s)[2], True, 4)", "torch.from_file"),
    "getattr_literal": ('self.w = getattr(torch, "from_file")((s)[2], True, 4)', "torch.from_file"),
    "string_built_path": ('self.w = torch.from_file((s)[2] + "", True, 4)', "torch.from_file"),
    "torch_save": ("torch.save(self.w, (s)[2])\n    self.w = (s)[0]", "torch.save"),
}
# The cases that create a file (the others set process state): what a marker file can witness.
CREATES_A_FILE = ("setstate_from_file", "helper_in_other_file", "submodule_3_deep", "scripted_class_attribute",
                  "method_of_scripted_class", *EDITS)


def hostile(d: Path, target: Callable[[str], str] | None = None,
            names: tuple[str, ...] | None = None) -> dict[str, Case]:
    """Write the hostile archives into ``d`` as ``NAME.pt``; ``target(NAME)`` is the file each payload creates."""
    where = target or (lambda name: str(d / f"made_{name}"))
    builders: dict[str, tuple[Callable[[str], nn.Module], str, str]] = {
        "setstate_from_file": (FromFile, "torch.from_file", "FromFile.__setstate__"),
        "helper_in_other_file": (ViaHelper, "torch.from_file", "script_helpers.make_file"),
        "submodule_3_deep": (lambda t: Wrap(Wrap(Wrap(FromFile(t)))), "torch.from_file", "FromFile.__setstate__"),
        "scripted_class_attribute": (HoldsClass, "torch.from_file", "Holder.__setstate__"),
        "manual_seed": (Seeds, "torch.manual_seed", "Seeds.__setstate__"),
        "method_of_scripted_class": (CallsClassMethod, "torch.from_file", "Maker.prepare"),
    }
    out = {}
    for name, (make, spelled, function) in builders.items():
        if names is None or name in names:
            seed = 4321 if name == "manual_seed" else None
            out[name] = Case(_save(make(where(name)), d / f"{name}.pt"), spelled, function,
                             creates=None if seed else Path(where(name)), seed=seed)
    for name, (line, spelled) in EDITS.items():
        if names is None or name in names:
            base = _save(FromFile(where(name)), d / f"{name}.base.pt")
            out[name] = Case(_edit(base, d / f"{name}.pt", line), spelled, "FromFile.__setstate__",
                             creates=Path(where(name)))
            base.unlink()
    return out


def benign(d: Path) -> dict[str, Path]:
    import torch.ao.quantization as tq

    dyn = tq.quantize_dynamic(nn.Sequential(nn.Linear(4, 4), nn.LSTM(4, 4)), {nn.Linear, nn.LSTM}, dtype=torch.qint8)
    static = nn.Sequential(tq.QuantStub(), nn.Conv2d(1, 2, 3), nn.ReLU(), nn.Linear(6, 3), tq.DeQuantStub()).eval()
    static.qconfig = tq.get_default_qconfig("fbgemm")  # type: ignore[assignment]
    tq.prepare(static, inplace=True)
    static(torch.randn(2, 1, 5, 8))
    tq.convert(static, inplace=True)
    builders: dict[str, Callable[[], nn.Module]] = {
        "setstate_math_nested_layers": Layers, "setstate_control_flow": ControlFlow,
        "quantized_dynamic": lambda: dyn, "quantized_static": lambda: static,
    }
    return {name: _save(make(), d / f"b_{name}.pt") for name, make in builders.items()}
