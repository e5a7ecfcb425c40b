"""Issue 32: benign files written by the training libraries' own code (tests/helpers/third_party_writers.py).

Class ``benign-library``: the Trainer's checkpoint folder files, accelerate's ``save_state`` (with a registered
custom object), a Lightning ``.ckpt`` with an OmegaConf hyper-parameter, an mmengine Runner checkpoint and a
pytorch-ignite ``Checkpoint``. None runs code; ckpt must not flag any (the other scanners' counts sit beside it
in docs/security.md). A library that is not installed adds no case.

The writers train with the libraries (seconds of imports), so the class is built only where ``CKPT_CORPUS_LIBRARIES``
is set (``security_table --regenerate`` sets it); in the suite, tests/formats/test_third_party.py checks the same
files (scan, gate, inspect, an audited torch.load).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .generate import Corpus

_FILES = (".pt", ".pth", ".bin", ".pkl", ".ckpt", ".safetensors")
_TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_WRITERS = os.path.join(_TESTS, "helpers", "third_party_writers.py")


def add_libraries(c: Corpus) -> None:
    if not os.environ.get("CKPT_CORPUS_LIBRARIES"):
        return
    out = os.path.join(c.support, "libraries")
    os.makedirs(out, exist_ok=True)
    proc = subprocess.run([sys.executable, _WRITERS, out], capture_output=True, text=True, timeout=600, check=False,
                          cwd=out)
    if proc.returncode != 0:
        raise RuntimeError(f"tests/helpers/third_party_writers.py failed: {proc.stderr[-2000:]}")
    written = json.loads(proc.stdout.strip().splitlines()[-1])
    for writer, folder in sorted(written.items()):
        if not isinstance(folder, str):
            continue  # {"skipped": reason}: the library is not installed
        for root, _, names in sorted(os.walk(folder)):
            for name in sorted(names):
                if not name.endswith(_FILES):
                    continue
                path = os.path.join(root, name)
                rel = os.path.relpath(path, folder).replace(os.sep, "_").replace(".", "_").replace("-", "_")
                c.add(f"lib_{writer}_{rel}", "benign-library", None, f"{writer}: {os.path.relpath(path, folder)} as "
                      "the library's own saving code wrote it", path=path)
