"""The static walk's findings joined to a reader's result: one set of findings for every command.

A reader unpickles with the restricted unpickler, which knows which globals
a pickle names but not how it uses them, nor what hides in members and
nested blobs it never reads. The static walk (pickles/scanner.py, what
``ckpt scan`` runs) knows both. When a file gives any reason to look (a
global outside the allowlist, an archive member torch.save never writes, a
TorchScript archive, a read that failed), the walk runs too and its
verdicts join the reader's, so inspect, diff, migrate, gate and scan report
the same calls for the same file. A plain state_dict gives no reason: its
fast path is untouched.
"""
from __future__ import annotations

import os
import re
from dataclasses import replace
from typing import TYPE_CHECKING

from ...errors import CkptError, InputError, LimitExceeded
from ...format_names import Format
from ...io import Blob, is_url, isdir, open_bytes
from ...limits import Limits
from ...model import GlobalRef
from ...pickles import severity
from ...pickles.torch_rules import SMALL_PICKLE
from ..interface import Loaded

if TYPE_CHECKING:
    from ...pickles import Scanner


def walk_file(path: str, limits: Limits) -> Scanner | None:
    """The static walk of one regular file or URL (None for folders and unreadable paths)."""
    from ...pickles import Scanner  # the walker is a 20 ms import: only when a file gives reason
    from ...tensors.data import npy_pickle_offset

    if not is_url(path) and not os.path.isfile(path):
        return None
    if is_url(path) and isdir(path):  # a folder behind a URL (answered without a request): no file to walk
        return None
    try:
        data = open_bytes(path)
    except CkptError:
        return None
    try:
        scanner = Scanner(path, limits, npy_offset=npy_pickle_offset)
        if data.size:
            scanner.top_level(Blob.from_source(data), path)
        return scanner
    finally:
        data.close()


def needs_walk(loaded: Loaded, path: str = "") -> bool:
    """Whether the file gives a reason to walk it; a plain state_dict (the fast path) gives none.

    A DCP folder always does (its ``.metadata`` and bytes items are pickles
    that torch.distributed.checkpoint unpickles unrestricted), and so does a
    safetensors file whose name torch.load does not hand to safetensors: it
    reads the same bytes as a tar, then as pickles (a polyglot's other readings).
    """
    return (loaded.metadata.get("unexpected_members") is not None or loaded.format in (Format.TORCHSCRIPT, Format.DCP,
                                                                                        Format.TORCH_EXPORT)
            or (loaded.format == Format.SAFETENSORS and not path.endswith(".safetensors"))
            or any(r.severity != severity.SAFE for r in loaded.references) or _items_set_on_non_dict(loaded))


def walk_dcp(path: str, limits: Limits) -> Scanner | None:
    """A DCP folder's pickles as FileSystemReader meets them: ``.metadata`` (pickle.load), each bytes item
    (torch.load(weights_only=False)); tensor items are torch.load(weights_only=True)'d (scan walks those too)."""
    from ..dcp import METADATA, dcp_regions

    if is_url(path):  # a remote folder is answered from .metadata alone (one request); scan walks it whole
        return None
    folder = path if os.path.isdir(path) else os.path.dirname(path)
    meta = os.path.join(folder, METADATA)
    scanner = walk_file(meta, limits)
    if scanner is None:
        return None
    regions = dcp_regions(meta, limits) or {}
    for rel, items in sorted(regions.items()):
        wanted = [r for r in items if r.is_bytes]
        if not wanted:
            continue
        try:
            data = open_bytes(os.path.join(folder, rel))
        except CkptError:
            continue  # a missing shard: the reader says so
        try:
            scanner.dcp_items(Blob.from_source(data), wanted)
        finally:
            data.close()
    return scanner


_ADVISORY = re.compile(r"CVE-\d{4}-\d{4,}")
_ITEM_TAKERS = frozenset([("collections", "OrderedDict"), ("collections", "Counter")])


def _items_set_on_non_dict(loaded: Loaded) -> bool:
    """A small pickle whose SETITEM(S) may hit a list, tuple or tensor (CVE-2026-24747): the walk decides.

    Only pickles the weights_only prediction keeps and walks exactly anyway
    (``wo_input.SMALL_PICKLE``, a few ms); a torch.save state_dict sets items
    on dicts alone and is never walked for it.
    """
    wo = loaded.weights_only
    for p in getattr(wo, "pickles", ()):
        if p.data is None or len(p.data) > SMALL_PICKLE:
            continue
        for target in p.facts().setitems:
            if target.kind != "dict" and not (target.kind == "call" and target.name in _ITEM_TAKERS):
                return True
    return False


def join_walk(loaded: Loaded, path: str, limits: Limits) -> Loaded:
    """The reader's result with its globals judged as the walk does, and what only the walk saw added.

    The walk sees the same pickles with more context (how each global is used:
    called, or dill's closure idiom), so its verdict on a global wins.
    """
    scanner = walk_dcp(path, limits) if loaded.format == Format.DCP else walk_file(path, limits)
    if scanner is None:
        return loaded
    judged: dict[tuple[str, str], GlobalRef] = {}
    for g in scanner.globals:
        key = (g.module, g.name)
        if key not in judged or severity.ORDER[g.severity] > severity.ORDER[judged[key].severity]:
            judged[key] = g
    refs = []
    for r in loaded.references:
        seen = judged.pop((r.module, r.name), None)
        refs.append(r if seen is None else GlobalRef(r.module, r.name, seen.severity, r.where))
    refs.extend(g for g in judged.values() if g.severity != severity.SAFE)
    if loaded.format == Format.TORCHSCRIPT:
        _refuse_what_jit_refuses(scanner, path)
    dangerous = tuple(f"dangerous{f' ({f.where})' if f.where else ''}: {f.message} (NOT executed)"
                      for f in scanner.findings if f.severity == severity.DANGEROUS)
    return replace(loaded, references=tuple(refs), warnings=loaded.warnings + dangerous)


# The pickles torch.jit.load unpickles: its unpickler resolves only TorchScript's own types and builders.
_JIT_PICKLES = ("/data.pkl", "/constants.pkl")


def _refuse_what_jit_refuses(scanner: Scanner, path: str) -> None:
    """torch.jit.load refuses an archive whose data.pkl or constants.pkl names a global it cannot resolve:
    so does ckpt (loader parity), naming the calls (NOT executed)."""
    calls = sorted({f"{g.module}.{g.name} ({g.where})" for g in scanner.globals
                    if g.severity == severity.DANGEROUS and g.where.endswith(_JIT_PICKLES)})
    if calls:
        raise InputError("torch.jit.load refuses this TorchScript archive: its pickles name globals outside "
                         f"TorchScript's types: {', '.join(calls[:5])} (dangerous, NOT executed by ckpt)", path)


def name_calls(path: str, exc: InputError, limits: Limits) -> InputError:
    """A read that failed: name what a loader would have called before it failed (torch runs those)."""
    if isinstance(exc, LimitExceeded):
        return exc
    scanner = walk_dcp(path, limits) if not is_url(path) and os.path.isdir(path) else walk_file(path, limits)
    if scanner is None:
        return exc
    calls = sorted({f"{g.module}.{g.name}" for g in scanner.globals if g.severity == severity.DANGEROUS})
    if not calls and any(f.severity == severity.DANGEROUS for f in scanner.findings):
        calls = [next(f.message for f in scanner.findings if f.severity == severity.DANGEROUS)]
    if not calls:
        return exc
    message = exc.message.removeprefix(f"{path}: ")
    named = " ".join(calls[:5])
    advisories = sorted({m for f in scanner.findings for m in _ADVISORY.findall(f.message) if m not in named})
    shaped = f"; the file has the shape of {', '.join(advisories)}" if advisories else ""
    return InputError(f"{message}; before that point a loader would call {', '.join(calls[:5])} "
                      f"(dangerous, NOT executed by ckpt){shaped}", path)
