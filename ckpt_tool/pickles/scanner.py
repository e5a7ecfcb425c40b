"""The static walk of every pickle in a file's bytes, whatever holds it: the security reading path.

A file is judged by every interpretation a loader might take of its bytes,
not by its name: a torch zip (every pickle member, not only data.pkl, and
when the central directory is broken, every local header), the legacy
format (its sequence of pickles), a plain pickle or dill file, a pickle with
a zip appended (torch reads such files as legacy), a tar, a NumPy ``.npy``
with an object dtype, the byte items of DCP ``.distcp`` files, and bytes
that a pickle hands to ``pickle.loads`` or ``torch.storage._load_from_bytes``.
Nothing here imports a module named in a pickle or calls anything.
"""
from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from ..errors import CkptError, InputError
from ..format_names import Format, Name
from ..io import Blob, is_legacy_magic, npy_pickle_offset, tar_members
from ..io.zip import Member, member_blob, read_directory, sweep_local_headers
from ..limits import DEFAULT_LIMITS, Limits
from ..model import GlobalRef
from . import severity
from .advisories import CVE_2025_32434_SCRIPT, CVE_2025_32434_TAR
from .members import (
    BUILTIN_OP_NAMESPACES,
    classify_members,
    is_safetensors,
    other_members,
    packaged_sources,
    script_calls,
    script_class_is_torchs,
)
from .pt2_layout import archive_root
from .pt2_scan import walk_export
from .severity import Severity
from .walk import BytesRef, Finding, Walk, walk

MAX_DEPTH = 12  # nested pickles inside nested pickles ...
MAX_PICKLES = 64  # consecutive pickles read from one plain pickle file
LEGACY_PICKLES = 5  # magic, protocol, sys_info, the object, storage keys
ERROR: Literal["error"] = "error"  # a file's verdict when it could not be read and nothing dangerous was found
Verdict = Severity | Literal["error"]


class Found(Name):
    """What a file's bytes are when they are no reader's Format (scan reads more than ckpt loads)."""

    ZIP = "zip"  # a zip that is no torch archive, or one appended to a pickle
    TAR = "tar"
    GGUF = "gguf"  # llama.cpp's format: named, not read (an error verdict, never safe)
    DCP_DATA = "dcp-data"  # a ``.distcp`` file of a DCP folder, read by the items its ``.metadata`` lists
    FOLDER = "folder"
    NONE = "none"  # nothing scan could read


ScanFormat = Format | Found  # what ``scan`` reports per file


@dataclass
class PickleScan:
    """One pickle's globals, for readers that scan a single member (formats.torchzip)."""

    where: str
    globals: list[GlobalRef] = field(default_factory=list)
    error: str | None = None
    findings: list[Finding] = field(default_factory=list)

    @property
    def verdict(self) -> Severity:
        return severity.worst([g.severity for g in self.globals] + [f.severity for f in self.findings])


def scan_pickle_bytes(data: bytes, where: str) -> PickleScan:
    """Walk one in-memory pickle (and the pickles nested in it)."""
    scanner = Scanner("", DEFAULT_LIMITS)
    scanner.pickles(Blob.from_bytes(data), where, 0, limit=1, strict=True)
    return PickleScan(where, list(scanner.globals), scanner.errors[0] if scanner.errors else None,
                      list(scanner.findings))


class Scanner:
    """Collects what one file's pickles reference while its bytes are dispatched by format."""

    def __init__(self, path: str, limits: Limits, *,
                 npy_offset: Callable[[Blob], int | None] = npy_pickle_offset) -> None:
        self.path = path
        self.limits = limits
        # where a .npy object array's pickle starts: callers hand in NumPy's own reading
        # (tensors/numpy_reads.py); the default is the literal, fail-closed parse
        self.npy_offset = npy_offset
        self.format: ScanFormat = Found.NONE
        self.globals: list[GlobalRef] = []
        self.findings: list[Finding] = []
        self.errors: list[str] = []
        self.walked = 0
        self.torchscript = False
        self._seen: set[tuple[str, str, str]] = set()
        self.storage_keys: set[str] = set()  # storages the walked pickles name (the others are walked too)

    @property
    def verdict(self) -> Verdict:
        """The worst severity found; "error" when the file could not be read and nothing dangerous was found."""
        worst = severity.worst([g.severity for g in self.globals] + [f.severity for f in self.findings])
        return ERROR if self.errors and worst != severity.DANGEROUS else worst

    def error(self, where: str, message: str) -> None:
        parts = [p for p in (self.path, where) if p]
        self.errors.append(": ".join([*parts, message]))

    def finding(self, sev: str, message: str, where: str) -> None:
        self.findings.append(Finding(sev, message, where))

    # -- dispatch --------------------------------------------------------------
    def top_level(self, blob: Blob, path: str) -> None:
        head = blob.read(0, 512)
        if head.startswith(b"PK\x03\x04"):
            n = int.from_bytes(head[26:28], "little")
            # np.savez names every member NAME.npy (each walked as a .npy: object arrays are pickles)
            self.format = Format.NPZ if head[30:30 + n].endswith(b".npy") else Format.TORCH_ZIP
            self.zip(blob, "", 0)
            return
        if head.startswith(b"GGUF"):
            self.format = Found.GGUF
            self.error("", "a GGUF file (llama.cpp / ggml's format): ckpt does not read GGUF yet, so nothing in it "
                       "was judged")
            return
        if is_safetensors(head, blob.length):
            self.format = Format.SAFETENSORS  # the caller validates the header
            self.beside_safetensors(blob)
            return
        if head.startswith(b"\x93NUMPY"):
            self.format = Format.NUMPY
            self.npy(blob, os.path.basename(path), 0)
            return
        members = tar_members(blob)
        if members is not None:
            self.format = Found.TAR  # torch tries tar before the legacy pickles; scan both readings
            self.finding(severity.SAFE, CVE_2025_32434_TAR, "tar")
            for name, sub in members:
                self.blob(sub, name, 1, lenient=True)
        legacy = is_legacy_magic(head)
        found_pickle = self.pickles(blob, "", 0, limit=LEGACY_PICKLES if legacy else MAX_PICKLES, strict=True)
        if found_pickle and self.format == Found.NONE:
            self.format = Format.TORCH_LEGACY if legacy else Format.PICKLE
        # A zip appended to a pickle: torch reads the pickle, zip readers the zip.
        if self.format != Found.TAR:
            found = self.zip_by_directory(blob, "", 0, quiet=True)
            if found and self.format == Found.NONE:
                self.format = Found.ZIP

    def beside_safetensors(self, blob: Blob) -> None:
        """The other readings of a safetensors file: torch.load reads any file not named ``*.safetensors``
        as a tar, then as a sequence of pickles (pickle.load as one), whatever safetensors sees in it.

        A header length whose bytes start a pickle (or a tar) is no accident: such a polyglot is
        never written by a tool, and what its pickles call is judged like any other pickle's.
        """
        before = len(self.globals) + len(self.findings)
        members = tar_members(blob)
        if members is not None:
            self.finding(severity.SAFE, CVE_2025_32434_TAR, "tar")
            for name, sub in members:
                self.blob(sub, name, 1, lenient=True)
        probe = Scanner(self.path, self.limits, npy_offset=self.npy_offset)
        probe.pickles(blob, "", 0, limit=MAX_PICKLES, strict=False)
        # A header length's bytes start a pickle by chance 1 time in a few: an extension code (0x82-0x84)
        # that breaks on the next byte names nothing a loader would reach. A reading counts when its
        # pickle ends, or when it names a global before it breaks (a loader runs what comes before).
        if probe.walked and (not probe.errors or any(g.module != "?" for g in probe.globals)):
            for g in probe.globals:
                if (g.module, g.name, g.where) not in self._seen:
                    self._seen.add((g.module, g.name, g.where))
                    self.globals.append(g)
            self.findings.extend(probe.findings)
            self.errors.extend(probe.errors)
            self.walked += probe.walked
        if len(self.globals) + len(self.findings) > before:
            self.finding(severity.SUSPICIOUS, "valid safetensors that torch.load (for any name but *.safetensors) "
                         f"reads as a {'tar' if members is not None else 'pickle'} instead: a polyglot file, "
                         "judged by the worst of its readings", "")

    def blob(self, blob: Blob, where: str, depth: int, *, lenient: bool) -> None:
        """Bytes found inside something else: a member, an embedded payload."""
        if depth > MAX_DEPTH:
            self.finding(severity.DANGEROUS, "pickles nested too deeply to follow", where)
            return
        head = blob.read(0, 16)
        if head.startswith(b"PK\x03\x04"):
            self.zip(blob, where, depth)
        elif head.startswith(b"\x93NUMPY"):
            self.npy(blob, where, depth)
        else:
            head = blob.read(0, 256)
            legacy = is_legacy_magic(head)  # a nested torch file, whatever opcodes spell its magic number
            # every consecutive pickle, even in a member: a magic number torch computes by a call (int("...")) is
            # no spelling to recognise, and the pickles after it run all the same
            limit = LEGACY_PICKLES if legacy else MAX_PICKLES
            if not self.pickles(blob, where, depth, limit=limit, strict=not lenient) and not lenient:
                self.error(where, "not a readable pickle")

    # -- pickles ---------------------------------------------------------------
    def pickles(self, blob: Blob, where: str, depth: int, *, limit: int, strict: bool) -> bool:
        """Walk consecutive pickles at the start of ``blob``; False if the first is not one."""
        stream = blob.stream()
        offset = 0
        for i in range(limit):
            label = where if i == 0 else f"{where + ' ' if where else ''}pickle #{i + 1} at offset {offset}"
            stream.seek(offset)
            w = walk(stream, label, size=blob.length, on_embedded=self._on_embedded(blob, label, depth))
            reached = w.reached or bool(w.findings)
            if not (w.complete or reached or (strict and i == 0 and w.plausible)):
                if i == 0:
                    return False
                break  # trailing bytes that are not a pickle (legacy storages, padding)
            self.record(w)
            if not w.complete:
                self.error(label, f"pickle is corrupt or truncated: {w.error}")
                break
            offset = w.end or 0
            if offset >= blob.length:
                break
        return True

    def record(self, w: Walk) -> None:
        self.walked += 1
        for g in w.globals:
            sev = g.severity
            if self.torchscript and g.module.split(".")[0] == "__torch__":
                # TorchScript classes come from the archive's code/, never an import; a custom C++ class
                # (torch.classes.NS) outside torch's own is an extension's, whose __setstate__ runs at load
                sev = severity.SAFE if script_class_is_torchs(g.module) else severity.DANGEROUS
            key = (g.module, g.name, g.where)
            if key not in self._seen:
                self._seen.add(key)
                self.globals.append(GlobalRef(g.module, g.name, sev, g.where))
        self.findings.extend(w.findings)
        self.storage_keys |= w.storage_keys

    def _on_embedded(self, blob: Blob, where: str, depth: int) -> Callable[[object, str], None]:
        def follow(payload: object, loader: str) -> None:
            self.embedded(blob, payload, loader, where, depth)

        return follow

    def embedded(self, blob: Blob, payload: object, loader: str, where: str, depth: int) -> None:
        label = f"{where} > {loader}(...)" if where else f"{loader}(...)"
        if isinstance(payload, BytesRef):
            sub = blob.sub(payload.offset, payload.length)
        elif isinstance(payload, bytes):
            sub = Blob.from_bytes(payload)
        else:
            return
        if sub.length == 0:
            return
        self.blob(sub, label, depth + 1, lenient=False)

    # -- zip -------------------------------------------------------------------
    def zip(self, blob: Blob, where: str, depth: int) -> None:
        if not self.zip_by_directory(blob, where, depth, quiet=False):
            self.sweep_zips(blob, where, depth)

    def zip_by_directory(self, blob: Blob, where: str, depth: int, *, quiet: bool) -> bool:
        try:
            entries = read_directory(blob)
        except InputError as exc:
            if not quiet:
                self.error(where, f"{exc.message}; scanned its local file headers instead")
            return False
        self.zip_entries(blob, entries, where, depth)
        return True

    def sweep_zips(self, blob: Blob, where: str, depth: int) -> None:
        self.zip_entries(blob, sweep_local_headers(blob), where, depth, swept=True)

    def zip_entries(self, blob: Blob, entries: list[Member], where: str, depth: int, swept: bool = False) -> None:
        names = [e.name for e in entries]
        is_script = any("/code/" in n or n.startswith("code/") or n.endswith("constants.pkl") for n in names)
        if is_script and depth == 0:
            if not self.torchscript:
                self.finding(severity.SAFE, CVE_2025_32434_SCRIPT, where or "zip")
            self.torchscript = True
            if self.format == Format.TORCH_ZIP:
                self.format = Format.TORCHSCRIPT
        for sev, message in classify_members(names, swept):
            self.finding(sev, message, where or "zip")
        if any(n == ".data/extern_modules" or n.endswith("/.data/extern_modules") for n in names):
            self.package(names, where)
        if is_script:
            self.script_code(blob, entries, where)
        export_root = archive_root(names)
        if export_root is not None:  # torch.export .pt2: each member judged by what torch.export.load does with it
            if self.format == Format.TORCH_ZIP and depth == 0:
                self.format = Format.TORCH_EXPORT
            walk_export(self, blob, entries, export_root, where, depth)
            return
        pickles = [e for e in entries if e.name.endswith(".pkl")]
        known = set(self.storage_keys)
        self.storage_keys = set()
        for entry in pickles:  # first: they say which storages exist
            self.member(blob, entry, where, depth + 1 if where else depth, lenient=False)
        named, self.storage_keys = self.storage_keys, known | self.storage_keys
        for entry in other_members(entries, named):
            self.member(blob, entry, where, depth + 1, lenient=True)

    def called(self, module: str, name: str, where: str) -> None:
        """A callable that no pickle names but a loader runs (an operator, a packaged module): dangerous."""
        key = (module, name, where)
        if key not in self._seen:
            self._seen.add(key)
            self.globals.append(GlobalRef(module, name, severity.DANGEROUS, where))

    def package(self, names: list[str], where: str) -> None:
        """torch.package: PackageImporter imports the modules packaged as sources, running their code.

        Each packaged ``.py`` is named as a call of ``MODULE.<module>`` (what
        an import of it runs); the archive's pickles are walked as any other.
        """
        sources = packaged_sources(names)
        shown = ", ".join(n for _, n in sources[:5]) + (" ..." if len(sources) > 5 else "")
        self.finding(severity.DANGEROUS, "a torch.package archive (.data/extern_modules): loading it with "
                     "torch.package.PackageImporter imports the Python modules packaged in it and runs them"
                     + (f" ({shown})" if sources else ""), where or "zip")
        for module, n in sources:
            self.called(module, "<module>", f"{where} > {n}" if where else n)

    def script_code(self, blob: Blob, entries: list[Member], where: str) -> None:
        """TorchScript source (``code/**.py``): the operators it calls outside torch's own namespaces.

        TorchScript runs this code, ``__setstate__`` at torch.jit.load and
        ``forward`` on every call, and ``ops.NS.OP`` dispatches to whatever
        native library registered ``NS`` in the process: code ckpt cannot
        see. An unknown callable is dangerous (an archive saved with only
        torch's own operators names none).
        """
        from .script import judge_code, read_code  # ast and the op table: only for TorchScript archives

        texts, errors = read_code(blob, entries, self.limits.max_pickle_bytes)
        for name, message in errors.items():
            self.error(f"{where} > {name}" if where else name, message.replace(f"{self.path}: ", ""))
        calls: dict[tuple[str, str], str] = {}
        for name, text in texts.items():
            for call in script_calls(text):
                calls.setdefault(call, f"{where} > {name}" if where else name)
        for f in judge_code(texts):  # the code torch.jit.load runs, op by op (pickles/script/)
            module, _, op = f.spelled.rpartition(".")
            self.called(module or "TorchScript", op, f"{where} > {f.where}" if where else f.where)
            self.finding(severity.DANGEROUS, f.message, where or "zip")
        for (module, name), label in sorted(calls.items()):
            self.called(module, name, label)
        if calls:
            shown = ", ".join(f"{m}.{n}" for m, n in sorted(calls)[:5])
            self.finding(severity.DANGEROUS, f"TorchScript code calls {shown}: operators outside torch's built-in "
                         f"namespaces ({', '.join(sorted(BUILTIN_OP_NAMESPACES))}), native code of whatever library "
                         "registered them, run at load (__setstate__) or on a call", where or "zip")

    def member(self, blob: Blob, entry: Member, where: str, depth: int, *, lenient: bool) -> None:
        label = f"{where} > {entry.name}" if where else entry.name
        try:
            sub = member_blob(blob, entry, self.limits.max_pickle_bytes)
        except CkptError as exc:
            self.error(label, exc.message.replace(f"{self.path}: ", ""))
            return
        self.blob(sub, label, depth, lenient=lenient)

    # -- other containers --------------------------------------------------------
    def npy(self, blob: Blob, where: str, depth: int) -> None:
        try:
            offset = self.npy_offset(blob)
        except InputError as exc:
            self.error(where, exc.message)
            return
        if offset is not None:  # an object array: its data is a pickle np.load(allow_pickle=True) runs
            self.blob(blob.sub(offset, blob.length - offset), f"{where} (object array)".strip(), depth + 1,
                      lenient=False)

    def dcp_items(self, blob: Blob, regions: list[Any]) -> None:
        """Each item torch.load reads back: byte items unrestricted, tensors with weights_only."""
        for r in regions:
            where = f"{r.fqn} @ {r.offset}"
            if r.offset < 0 or r.length < 0 or r.offset + r.length > blob.length:
                self.error(where, f"item lies past the end of the file ({blob.length} bytes)")
                continue
            if r.transformed:
                self.finding(severity.SUSPICIOUS, "item is stored transformed (e.g. compressed); not scanned",
                             where)
                continue
            sub = blob.sub(r.offset, r.length)
            if r.is_bytes:
                self.blob(sub, where, 1, lenient=False)
            elif sub.read(0, 4) == b"PK\x03\x04":
                self.zip(sub, where, 1)
