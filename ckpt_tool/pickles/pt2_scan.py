"""The static walk of a torch.export ``.pt2`` archive: every member judged by what a loader does with it.

torch.export.load unpickles the members its configs mark ``use_pickle``
(``torch.load(weights_only=False)``), custom and opaque object constants,
and the sample inputs (``torch.load``, retried with ``weights_only=False``):
those are walked strictly, as pickles that must parse. Raw tensor bytes are
never unpickled and are not walked. Compiled code (AOTInductor) is native
code a loader runs: dangerous. A member outside torch.export's layout, or a
config ckpt cannot read, fails closed: an error, never "safe".
"""
from __future__ import annotations

from typing import Protocol

from ..errors import CkptError
from ..io import Blob
from ..io.zip import Member, member_blob
from ..limits import Limits
from . import severity
from .pt2_layout import (
    ARCHIVE_FORMAT_VALUE,
    CONSTANTS_DIR,
    WEIGHTS_DIR,
    ConfigError,
    MemberKind,
    Payload,
    classify,
    config_members,
    model_names,
    parse_config,
)


class Scanner(Protocol):
    """What this walk needs of pickles/scanner.py's Scanner (which calls it: no import back)."""

    path: str

    @property
    def limits(self) -> Limits: ...

    def error(self, where: str, message: str) -> None: ...

    def finding(self, sev: str, message: str, where: str) -> None: ...

    def member(self, blob: Blob, entry: Member, where: str, depth: int, *, lenient: bool) -> None: ...



def walk_export(scanner: Scanner, blob: Blob, entries: list[Member], root: str, where: str, depth: int) -> None:
    """Walk the members of a .pt2 archive whose folder is ``root``."""
    by_name = {e.name: e for e in entries}
    names = [e.name for e in entries]

    def label(name: str) -> str:
        return f"{where} > {name}" if where else name

    def read(name: str) -> bytes | None:
        try:
            sub = member_blob(blob, by_name[name], scanner.limits.max_pickle_bytes)
            return sub.read(0, sub.length)
        except CkptError as exc:
            scanner.error(label(name), exc.message.replace(f"{scanner.path}: ", ""))
            return None

    if read(root + "archive_format") not in (ARCHIVE_FORMAT_VALUE, None):
        scanner.error(label(root + "archive_format"), "not 'pt2': an archive_format torch.export.load refuses")
    configs: dict[str, list[Payload]] = {WEIGHTS_DIR: [], CONSTANTS_DIR: []}
    for model in model_names(names, root):
        for folder, member in zip((WEIGHTS_DIR, CONSTANTS_DIR), config_members(root, model), strict=True):
            if member not in by_name:
                if root + folder + model + ".pt" not in by_name:  # the legacy layout holds no config
                    scanner.error(label(member), "missing: torch.export.load needs it to read the program")
                continue
            raw = read(member)
            if raw is None:
                continue
            try:
                configs[folder] += parse_config(raw)
            except ConfigError as exc:
                scanner.error(label(member), f"unreadable config ({exc}): which members are pickles is "
                              "unknown, so none is judged safe")
    kinds = classify(names, root, configs)
    unknown = [n for n, k in kinds.items() if k is MemberKind.UNKNOWN]
    for name in unknown:
        scanner.error(label(name), "a member torch.export.save never writes: ckpt cannot tell whether a loader "
                      "unpickles it (not judged safe)")
        scanner.member(blob, by_name[name], where, depth + 1, lenient=True)  # and what it calls, if a pickle
    native = [n for n, k in kinds.items() if k is MemberKind.NATIVE]
    if native:
        shown = ", ".join(native[:3]) + (" ..." if len(native) > 3 else "")
        scanner.finding(severity.DANGEROUS, "compiled code in a .pt2 archive (AOTInductor / ExecuTorch / MTIA: "
                        f"{shown}): loading it runs native code ckpt cannot read", where or "zip")
    for name, kind in kinds.items():
        if kind is MemberKind.PICKLE:
            scanner.member(blob, by_name[name], where, depth + 1, lenient=False)
