"""What the names of an archive's members say, before any byte of them is read.

The scanner (pickles/scanner.py) asks these: which members may hold a
pickle, which names torch.save never writes, which modules a torch.package
archive packages, and which operators TorchScript code calls.
"""
from __future__ import annotations

import re
from collections import Counter

from ..io import safetensors_header_length
from ..io.zip import Member
from . import severity

_ODD_NAME = re.compile(r"(^/|^[A-Za-z]:|\\|\x00|(^|/)\.\.(/|$)|^$)")

# Operator namespaces torch itself defines; TorchScript code prints a call as ``ops.NS.NAME(...)``.
BUILTIN_OP_NAMESPACES = frozenset(["aten", "prim", "quantized", "_quantized", "prepacked"])
_SCRIPT_OP = re.compile(r"(?<![\w.])(?:torch\.)?ops\.([A-Za-z_]\w*)\.([A-Za-z_]\w*)")

# Custom C++ class namespaces torch registers itself (``__torch__.torch.classes.NS.Class`` in TorchScript pickles).
BUILTIN_CLASS_NAMESPACES = frozenset(["quantized", "c10d", "vulkan", "rnn", "sparse", "mkldnn", "metal", "profiler",
                                      "cuda", "xnnpack", "onednn"])


def script_class_is_torchs(module: str) -> bool:
    """A TorchScript pickle's ``__torch__`` class: from the archive's code/, or a C++ class torch registers."""
    parts = module.split(".")
    if parts[1:3] != ["torch", "classes"]:
        return True
    return len(parts) > 3 and parts[3] in BUILTIN_CLASS_NAMESPACES


# Small text records torch.save writes beside data.pkl: never pickles.
_TEXT_RECORDS = frozenset(["version", ".format_version", ".storage_alignment", "byteorder", "serialization_id"])


def other_members(entries: list[Member], storages: set[str]) -> list[Member]:
    """Every member besides the pickles that may hold one, judged by what it is, not by its name.

    A protocol-0 pickle has no magic byte and its name may say ``notes.txt``,
    so every member is walked (leniently: bytes that are no pickle end the walk
    at once), except torch.save's own text records and the storages the
    pickles name: raw tensor bytes torch never unpickles. A storage no pickle
    names is no storage of torch.save's: it is walked like any other member.
    """
    out = []
    for e in entries:
        name = e.name
        parts = name.replace("\\", "/").split("/")
        if name.endswith((".pkl", "/")) or parts[-1] in _TEXT_RECORDS:
            continue
        if len(parts) >= 2 and parts[-2] == "data" and parts[-1] in storages:
            continue
        out.append(e)
    return out


def classify_members(names: list[str], swept: bool) -> list[tuple[severity.Severity, str]]:
    """Findings about the names themselves: path tricks and duplicates never appear in torch.save."""
    out = []
    odd = [n for n in names if _ODD_NAME.search(n)]
    if odd:
        out.append((severity.SUSPICIOUS,
                    "odd archive member names (torch.save never writes them): "
                    + ", ".join(repr(n) for n in odd[:5]) + (" ..." if len(odd) > 5 else "")))
    if not swept:
        dup = [n for n, k in Counter(names).items() if k > 1]
        if dup:
            out.append((severity.SUSPICIOUS,
                        "duplicate archive members (readers disagree on which one counts): "
                        + ", ".join(repr(n) for n in dup[:5])))
    return out


def is_safetensors(head: bytes, size: int) -> bool:
    n = safetensors_header_length(head)
    return n is not None and n <= size - 8


def script_calls(text: str) -> list[tuple[str, str]]:
    """(``torch.ops.NS``, NAME) for every operator TorchScript source calls outside torch's own namespaces."""
    return [(f"torch.ops.{m.group(1)}", m.group(2)) for m in _SCRIPT_OP.finditer(text)
            if m.group(1) not in BUILTIN_OP_NAMESPACES]


def packaged_sources(names: list[str]) -> list[tuple[str, str]]:
    """(module, member) for each Python source a torch.package archive packages (``.data/`` records aside)."""
    folder = names[0].split("/", 1)[0] + "/" if names and "/" in names[0] else ""
    out = []
    for n in names:
        inner = n[len(folder):] if n.startswith(folder) else n
        if n.endswith(".py") and not inner.startswith(".data/"):
            out.append((inner[:-3].replace("/", ".").removesuffix(".__init__"), n))
    return out
