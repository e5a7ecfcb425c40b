"""Issue 32: TorchScript code that torch.jit.load runs (class ``torchscript-code``), and benign archives.

Real archives (torch.jit.script + torch.jit.save, tests/pickles/script_cases.py)
whose ``__setstate__`` reaches an operator that creates a file: the case's marker,
so the reference loader's torch.jit.load step witnesses the payload run. Reached
directly, through a function of another code file, from a submodule three deep,
from a scripted class held as an attribute, and in the ``ops.aten``, alias,
``getattr`` and string-built-path spellings written into the code by hand;
``torch.save`` at load. The benign archives (math in ``__setstate__``, torch's
layers, quantized models) go to ``benign-feature``.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .generate import Corpus


def add_torchscript(c: Corpus) -> None:
    from tests.pickles import script_cases

    folder = Path(c.folder)
    for name, case in script_cases.hostile(folder, lambda n: c.marker(f"ts_{n}"),
                                           names=script_cases.CREATES_A_FILE).items():
        path = case.path.rename(folder / f"ts_{name}.pt")
        c.add(f"ts_{name}", "torchscript-code", None,
              f"TorchScript archive: {case.spelled} reached at load from {case.function} ({name.replace('_', ' ')})",
              path=str(path), payload=True, calls=(case.spelled,))
    for name, path in script_cases.benign(folder).items():
        target = path.rename(folder / f"ts_benign_{name}.pt")
        c.add(f"ts_benign_{name}", "benign-feature", None,
              f"TorchScript archive that runs only math at load ({name.replace('_', ' ')})", path=str(target))
