"""``ckpt scan``: find every pickle in the inputs and list what it would import, never running it.

A file is judged by every interpretation a loader might take of its bytes,
not by its name: a torch zip (every pickle member, not only data.pkl, and
when the central directory is broken, every local header), the legacy
format (its sequence of pickles), a plain pickle or dill file, a pickle with
a zip appended (torch reads such files as legacy), a tar, a NumPy ``.npy``
with an object dtype, DCP ``.metadata`` and the byte items of its ``.distcp``
files, and bytes that a pickle hands to ``pickle.loads`` or
``torch.storage._load_from_bytes``. safetensors headers are validated.

Nothing unread is safe: a folder that cannot be listed or a file that cannot
be opened is an error naming it (io/tree.py walks folders); symbolic links
are followed once and listed. A file with nothing to scan (empty, or no
checkpoint data) is an error when named, skipped and named with
``--skip-other``; inside a folder it is skipped and named, except an empty
file with a checkpoint's name (a truncated checkpoint), which is an error
unless ``--skip-other``.
"""
from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ...errors import CkptError, InputError
from ...exit_codes import outcome_code
from ...format_names import Format
from ...formats import ReadOptions, SourceOptions, read_file
from ...formats.checkpoint import build_checkpoint as build
from ...formats.dcp import ItemRegion, dcp_regions
from ...formats.hf import read_index
from ...io import Blob, Link, basename, dirname, is_url, isdir, isfile, join, listdir, open_bytes, walk
from ...io.remote import counts_remote, with_remote
from ...limits import DEFAULT_LIMITS, Limits
from ...model import GlobalRef
from ...pickles import ERROR, Found, ScanFormat, Scanner, Verdict, severity
from ...pickles.walk import Finding
from ...tensors.data import npy_pickle_offset


@dataclass(frozen=True)
class FileScan:
    """The verdict on one file: the globals its pickles name and what else they do."""

    path: str
    format: ScanFormat
    verdict: Verdict  # safe, suspicious, dangerous, or error (could not be read, nothing dangerous found)
    globals: tuple[GlobalRef, ...] = ()
    findings: tuple[Finding, ...] = ()
    errors: tuple[str, ...] = ()
    pickles: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "format": self.format,
            "verdict": self.verdict,
            "pickles": self.pickles,
            "globals": [{"module": g.module, "name": g.name, "severity": g.severity, "where": g.where}
                        for g in self.globals],
            "findings": [{"severity": f.severity, "message": f.message, "where": f.where} for f in self.findings],
            "errors": list(self.errors),
        }


EMPTY, NOTHING = "empty file (0 bytes)", "holds no pickle, zip, tar, NumPy or safetensors data"
# names an empty file cannot have without being a truncated checkpoint (an error inside folders too)
CHECKPOINT_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt", ".safetensors", ".pkl", ".pickle", ".dill", ".distcp",
                       ".metadata", ".npy", ".npz", ".tar", ".zip", ".joblib")


@dataclass(frozen=True)
class ScanReport:
    files: tuple[FileScan, ...]
    skipped: tuple[str, ...] = ()  # files with nothing to scan, in folders or passed with --skip-other
    strict: bool = False
    remote: dict[str, int] | None = None  # requests and bytes, when a path was a URL
    skip_reasons: tuple[str, ...] = ()  # why each of ``skipped`` was skipped (EMPTY or NOTHING), in order
    links: tuple[Link, ...] = ()  # symbolic links met in folders, and what the walk did with each

    def skipped_files(self) -> list[dict[str, str]]:
        reasons = list(self.skip_reasons) + [NOTHING] * (len(self.skipped) - len(self.skip_reasons))
        return [{"path": p, "reason": r} for p, r in zip(self.skipped, reasons, strict=False)]

    @property
    def counts(self) -> dict[str, int]:
        out = {severity.SAFE: 0, severity.SUSPICIOUS: 0, severity.DANGEROUS: 0, ERROR: 0}
        for f in self.files:
            out[f.verdict] += 1
        return out

    @property
    def exit_code(self) -> int:
        """1 on a dangerous file (--strict: also suspicious), else 2 on an unreadable one, else 0."""
        bad = {severity.DANGEROUS} | ({severity.SUSPICIOUS} if self.strict else set())
        found = any(f.verdict in bad or any(g.severity in bad for g in f.globals) for f in self.files)
        return outcome_code(dangerous=found, unreadable=any(f.errors for f in self.files))

    def to_json(self) -> dict[str, Any]:
        return with_remote({
            "files": [f.to_json() for f in self.files],
            "skipped": list(self.skipped),
            "skipped_files": self.skipped_files(),
            "links": [link.to_json() for link in self.links],
            "counts": self.counts,
            "strict": self.strict,
            "passed": self.exit_code == 0,
        }, self.remote)


# Formats a reader exists for: each file of these is also read, as inspect would read it.
_READABLE: frozenset[ScanFormat] = frozenset([Format.TORCH_ZIP, Format.TORCHSCRIPT, Format.TORCH_LEGACY, Format.PICKLE,
                                              Format.SAFETENSORS, Found.TAR, Found.ZIP,
                                              Format.TORCH_EXPORT])


def lift(fs: FileScan, allowed: frozenset[str]) -> FileScan:
    """``--allow-global``: the named globals count as inert, wherever they are called or constructed.

    Exactly those globals: their entries become safe and the findings about
    them (``constructs mylab.Net, ...``) go; a global known by name to run
    code (os.system, builtins.eval) is never lifted, nor a finding about no
    global (a computed STACK_GLOBAL, an extension code).
    """
    allowed = frozenset(n for n in allowed if severity.allowable(n))
    if not allowed:
        return fs
    globals_ = tuple(GlobalRef(g.module, g.name, severity.SAFE, g.where) if g.qualname in allowed else g
                     for g in fs.globals)
    findings = tuple(f for f in fs.findings if not (f.glob and f.glob in allowed))
    worst = severity.worst([g.severity for g in globals_] + [f.severity for f in findings])
    verdict = ERROR if fs.errors and worst != severity.DANGEROUS else worst
    return replace(fs, globals=globals_, findings=findings, verdict=verdict)


@dataclass(frozen=True, kw_only=True)
class ScanOptions:
    """scan's own options (the readers' limits are the SourceOptions beside them)."""

    strict: bool = False  # suspicious files fail too
    skip_other: bool = False  # a named file with nothing to scan is skipped, not an error
    allow_globals: Sequence[str] = ()  # "module.name" counted as inert (see ``lift``)


@counts_remote("paths")
def scan_paths(paths: Sequence[str | os.PathLike[str]], source: SourceOptions, options: ScanOptions) -> ScanReport:
    """Scan files and folders (recursively) for pickles and judge what they would import.

    A file named explicitly that holds nothing to scan (no pickle, zip, tar,
    NumPy or safetensors data, or nothing at all) is an error, unless
    ``skip_other`` (for hooks that pass every file of a commit); inside
    folders such files are skipped (see the module docstring for empty ones).
    A folder or file that cannot be read is an error, never skipped.
    """
    report = _scan(paths, strict=options.strict, limits=source.limits, skip_other=options.skip_other)
    if not options.allow_globals:
        return report
    allowed = frozenset(options.allow_globals)
    return replace(report, files=tuple(lift(f, allowed) for f in report.files))


def _scan(paths: Sequence[str | os.PathLike[str]], *, strict: bool, limits: Limits,
          skip_other: bool) -> ScanReport:
    walked = _Walked()
    for raw in paths:
        path = os.fspath(raw)
        if isdir(path):
            if is_url(path):
                in_folder, skip = scan_url_folder(path, limits)
                walked.files.extend(in_folder)
                walked.skip(skip)
            else:
                scan_local_folder(path, limits, walked, skip_other)
        elif path.endswith(".index.json") and isfile(path):
            walked.files.extend(_scan_shards(path, limits))
        elif basename(path) == ".metadata" and not is_url(path) and isfile(path):
            walked.files.extend(_scan_dcp_metadata(path, limits))
        else:
            found = scan_file(path, limits=limits, explicit=not skip_other, skip_other=skip_other)
            if found is None:
                walked.skip([path])
            else:
                walked.files.append(found)
    if not walked.files and not skip_other:  # a hook given only other files has nothing to do: not an error
        where = ", ".join(os.fspath(p) for p in paths)
        raise InputError(f"{where}: nothing to scan: no pickle, zip, tar, NumPy or safetensors data "
                         f"({len(walked.skipped)} file(s) skipped); nothing scanned is never 'safe'")
    return ScanReport(tuple(walked.files), tuple(walked.skipped), strict,
                      skip_reasons=tuple(walked.reasons), links=tuple(walked.links))


@dataclass
class _Walked:
    """What scan gathers over its inputs."""

    files: list[FileScan] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    links: list[Link] = field(default_factory=list)

    def skip(self, paths: Sequence[str]) -> None:
        for p in paths:
            self.skipped.append(p)
            self.reasons.append(_skip_reason(p))


def _skip_reason(path: str) -> str:
    if path.endswith("/"):  # scan_url_folder's sub-folders
        return "a sub-folder behind a URL (only the files directly in a URL folder are scanned)"
    if is_url(path):
        return NOTHING
    try:
        return EMPTY if os.path.getsize(path) == 0 else NOTHING
    except OSError:
        return NOTHING


def scan_local_folder(path: str, limits: Limits, walked: _Walked, skip_other: bool = False) -> None:
    """Every file under a local folder; a folder or file that cannot be read is an error FileScan."""
    tree = walk(path)
    walked.links.extend(tree.links)
    for u in tree.unreadable:
        walked.files.append(FileScan(u.path, Found.FOLDER if u.kind == "folder" else Found.NONE, ERROR,
                                     errors=(u.message,)))
    for folder, names in tree.folders:
        in_folder: list[Any] = []
        skip: list[str] = []
        _scan_names(folder, names, os.path.join, limits, in_folder, skip, skip_other)
        walked.files.extend(in_folder)
        walked.skip(skip)


def _scan_shards(index: str, limits: Limits) -> list[FileScan]:
    """The shards a ``*.index.json`` names (the index itself is JSON: nothing to scan)."""
    try:
        weight_map = read_index(index)["weight_map"]
    except CkptError as exc:
        return [FileScan(index, Found.NONE, ERROR, errors=(exc.message,))]
    folder = dirname(index) if is_url(index) else os.path.dirname(index)
    shards = list(dict.fromkeys(weight_map.values()))
    return [scan_file(join(folder, s), limits=limits) or _nothing(join(folder, s)) for s in shards]


def _scan_dcp_metadata(meta: str, limits: Limits) -> list[FileScan]:
    """A DCP ``.metadata`` given alone: it, and every data file it names, by the items it lists."""
    out = [scan_file(meta, limits=limits) or _nothing(meta)]
    folder = os.path.dirname(meta)
    for rel, items in sorted((dcp_regions(meta, limits) or {}).items()):
        data = os.path.join(folder, rel)
        if os.path.isfile(data):  # a missing one: reading .metadata said so (a partial set is an error)
            out.append(scan_file(data, limits=limits, regions=items) or _nothing(data))
    return out


def _nothing(path: str) -> FileScan:
    return FileScan(path, Found.NONE, ERROR, errors=(
        f"{path}: holds no pickle, zip, tar, NumPy or safetensors data: nothing ckpt can scan",))


def scan_file(path: str, *, limits: Limits = DEFAULT_LIMITS, explicit: bool = True,
              hint: str | None = None, regions: list[Any] | None = None,
              skip_other: bool = False) -> FileScan | None:
    """Scan one file; None when it holds nothing to scan (only when not ``explicit``).

    An empty file is skipped with ``skip_other``; otherwise it is an error
    when ``explicit`` or when its name is a checkpoint's (a truncated file).

    ``regions`` (the items of a DCP data file, from its ``.metadata``) and
    ``hint`` (Found.DCP_DATA: a data file whose metadata is unreadable) come from
    the folder walk.
    """
    scanner = Scanner(path, limits, npy_offset=npy_pickle_offset)
    try:
        src = open_bytes(path)
    except CkptError as exc:
        return FileScan(path, Found.NONE, ERROR, errors=(exc.message,))
    try:
        size = src.size
        blob = Blob.from_source(src)
        if size == 0:
            if skip_other or not (explicit or path.lower().endswith(CHECKPOINT_SUFFIXES)):
                return None
            scanner.errors.append(f"{path}: {EMPTY}: nothing to scan" + (
                "" if explicit else "; a checkpoint's name with nothing in it (truncated?): --skip-other skips it"))
        elif regions is not None:
            scanner.format = Found.DCP_DATA
            scanner.dcp_items(blob, regions)
        elif hint == Found.DCP_DATA:
            scanner.format = Found.DCP_DATA
            scanner.sweep_zips(blob, basename(path), 0)
        else:
            scanner.top_level(blob, path)
            if scanner.format in _READABLE:
                _check_readable(scanner, path, limits)
    except CkptError as exc:  # a URL that failed mid-way (a timeout, a changed file)
        scanner.errors.append(exc.message)
    finally:
        src.close()
    if scanner.format == Found.NONE and not scanner.errors and not explicit:
        return None
    if scanner.format == Found.NONE and not scanner.errors:
        return _nothing(path)
    return _file_scan(scanner, path)




def _check_readable(scanner: Scanner, path: str, limits: Limits) -> None:
    """Read the file with the one reader every command uses: what it refuses, the scan cannot call safe.

    The static walk says what a loader would import or call; the reader says
    whether a loader can read the file at all (loader parity: a file torch
    and safetensors refuse is an error here too, never "safe").
    """
    try:
        # the scanner walked it already; a rank file of a larger save is read as safetensors reads it
        loaded = read_file(path, ReadOptions(limits=limits, walk=False, part_as_saved=True))
    except CkptError as exc:
        scanner.errors.append(exc.message if exc.message.startswith(path) else f"{path}: {exc.message}")
        return
    try:
        build(loaded, path, None, limits)  # what inspect refuses beyond the read (a view past its storage)
    except CkptError as exc:
        scanner.errors.append(exc.message if exc.message.startswith(path) else f"{path}: {exc.message}")
    finally:
        for source in loaded.sources:
            source.close()


def scan_folder(path: str, limits: Limits) -> tuple[list[Any], list[str]]:
    """Scan every file under a local ``path`` (hidden ones too); list those that hold nothing to scan.

    Unreadable folders and files are error FileScans among the first list.
    """
    walked = _Walked()
    scan_local_folder(path, limits, walked)
    return list(walked.files), list(walked.skipped)


def scan_url_folder(url: str, limits: Limits) -> tuple[list[Any], list[str]]:
    """The files directly in a folder behind a URL (one listing; no recursion into subfolders)."""
    files: list[Any] = []
    skipped: list[str] = []
    names = listdir(url)
    subfolders = [n for n in names if isdir(join(url, n))]
    skipped.extend(join(url, n) + "/" for n in subfolders)
    _scan_names(url, [n for n in names if n not in subfolders], join, limits, files, skipped)
    return files, skipped


def _scan_names(root: str, names: list[str], join_path: Callable[[str, str], str], limits: Limits,
                files: list[Any], skipped: list[str], skip_other: bool = False) -> None:
    """Scan the files ``names`` of one folder: a DCP folder's data files by the items its .metadata lists."""
    regions: dict[str, list[ItemRegion]] | None = None
    if ".metadata" in names:
        regions = dcp_regions(join_path(root, ".metadata"), limits)
    for name in names:
        full = join_path(root, name)
        if name.endswith(".index.json"):  # the index is JSON, but the files it names must stay in the folder
            try:
                read_index(full, limits.max_header_bytes)
            except CkptError as exc:
                files.append(FileScan(full, Found.NONE, ERROR, errors=(exc.message,)))
                continue
        if name.endswith(".distcp") and ".metadata" in names:
            if regions is not None:
                result = scan_file(full, limits=limits, regions=regions.get(name, []))
            else:  # the metadata could not be read: look for embedded archives everywhere
                result = scan_file(full, limits=limits, hint=Found.DCP_DATA)
        else:
            result = scan_file(full, limits=limits, explicit=False, skip_other=skip_other)
        if result is None:
            skipped.append(full)
        else:
            files.append(result)


def _file_scan(scanner: Scanner, path: str) -> FileScan:
    return FileScan(path, scanner.format, scanner.verdict, tuple(scanner.globals), tuple(scanner.findings),
                    tuple(scanner.errors), scanner.walked)
