"""``ckpt gate``: the pre-deploy checks a CI job runs on a checkpoint, each reported pass/fail.

Every check runs on every file (a failure does not hide the others), so one
CI run shows everything that is wrong. Only the NaN/Inf check reads tensor
data, one tensor at a time; everything else works on metadata.
"""
from __future__ import annotations

import hashlib
import json
import os
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Callable

from ..errors import CkptError, UsageError
from ..model import Checkpoint, TensorMeta
from ..pickles import severity
from ..pickles.unpickler import DEFAULT_LIMITS, Limits
from .policy import Policy

CHECKS = ("loads_safely", "matches_target", "no_nan_inf", "dtype_policy", "file_size", "required_metadata",
          "sha256", "warnings")
# dtypes nobody is surprised by; anything else is a warning (--strict fails on it)
USUAL_DTYPES = frozenset(["float32", "float16", "bfloat16", "float64", "int64", "int32", "int16", "int8",
                          "uint8", "bool"])
_CHUNK = 4 << 20  # bytes of a contiguous tensor checked for NaN/Inf at a time (tensordata.RAW_CHUNK)


@dataclass(frozen=True)
class Check:
    name: str
    passed: bool
    detail: str
    skipped: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "passed": self.passed, "detail": self.detail, "skipped": self.skipped}


@dataclass(frozen=True)
class FileGate:
    path: str
    checks: tuple[Check, ...]
    error: str | None = None  # the file could not be read: checks that needed it did not run

    @property
    def passed(self) -> bool:
        return self.error is None and all(c.passed for c in self.checks)

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "passed": self.passed, "error": self.error,
                "checks": [c.to_json() for c in self.checks]}


@dataclass(frozen=True)
class GateReport:
    files: tuple[FileGate, ...]
    policy: Policy = field(default_factory=Policy)

    @property
    def passed(self) -> bool:
        return all(f.passed for f in self.files)

    @property
    def exit_code(self) -> int:
        """0 all passed, 2 a file could not be read, else 1."""
        if any(f.error for f in self.files):
            return 2
        return 0 if self.passed else 1

    def to_json(self) -> dict[str, Any]:
        return {"passed": self.passed, "files": [f.to_json() for f in self.files], "policy": self.policy.to_json()}


Progress = Callable[[str, int, int], None]  # (path, tensors done, tensors in total)


def gate(
    paths: Sequence[str | os.PathLike[str]],
    *,
    target: str | None = None,
    target_kwargs: Mapping[str, Any] | None = None,
    policy: Policy | None = None,
    key: str | None = None,
    strict: bool | None = None,
    nan_check: bool | None = None,
    allowed_float_dtypes: Sequence[str] | None = None,
    max_file_size: int | str | None = None,
    required_metadata: Sequence[str] | None = None,
    sha256: str | None = None,
    limits: Limits = DEFAULT_LIMITS,
    progress: Progress | None = None,
) -> GateReport:
    """Check each path against the policy; arguments that are not None override it."""
    if not paths:
        raise UsageError("give at least one checkpoint to gate")
    pol = (policy or Policy()).with_overrides(
        target=target, target_kwargs=dict(target_kwargs) if target_kwargs is not None else None, key=key,
        strict=strict, nan_check=nan_check,
        allowed_float_dtypes=tuple(allowed_float_dtypes) if allowed_float_dtypes else None,
        max_file_size=max_file_size, required_metadata=tuple(required_metadata) if required_metadata else None,
        sha256=sha256,
    )
    if pol.sha256 is not None and len(paths) > 1:
        raise UsageError("a single sha256 pin needs a single PATH; pin several files in the policy's [sha256] table")
    built = None
    if pol.target is not None:
        from ..tensors.target import build_target

        built = build_target(pol.target, dict(pol.target_kwargs or {}))
    files = [_gate_one(os.fspath(p), pol, built, limits, progress) for p in paths]
    return GateReport(tuple(files), pol)


def _gate_one(path: str, pol: Policy, built: Any, limits: Limits, progress: Progress | None) -> FileGate:
    checks = [_loads_safely(path, pol, limits)]
    try:
        from ..formats import load

        ckpt = load(path, key=pol.key, limits=limits)
    except CkptError as exc:
        checks.append(Check("readable", False, exc.message))
        return FileGate(path, tuple(checks), exc.message)
    try:
        checks.append(_matches_target(path, ckpt, pol, built))
        checks.append(_no_nan_inf(path, ckpt, pol, progress))
        checks.append(_dtype_policy(ckpt, pol))
        checks.append(_file_size(path, pol))
        checks.append(_required_metadata(ckpt, pol))
        checks.append(_sha256(path, pol))
        checks.append(_warnings(ckpt, pol))
    except CkptError as exc:  # data unreadable mid-way (truncated storage): the file is corrupt
        checks.append(Check("readable", False, exc.message))
        return FileGate(path, tuple(checks), exc.message)
    finally:
        ckpt.close()
    return FileGate(path, tuple(checks))


def _skip(name: str, why: str) -> Check:
    return Check(name, True, f"skipped: {why}", skipped=True)


def _listing(items: Sequence[str], limit: int = 5) -> str:
    shown = ", ".join(items[:limit])
    return shown + (f" and {len(items) - limit} more" if len(items) > limit else "")


# ------------------------------------------------------------------ the checks


def _loads_safely(path: str, pol: Policy, limits: Limits) -> Check:
    from .scan import scan

    report = scan([path], strict=pol.strict, limits=limits)
    dangerous: list[str] = []
    suspicious: list[str] = []
    errors: list[str] = []
    pickles = 0
    for f in report.files:
        pickles += f.pickles
        errors.extend(f.errors)
        for g in f.globals:
            item = f"{g.qualname} ({g.where})" if g.where else g.qualname
            (dangerous if g.severity == severity.DANGEROUS else suspicious
             if g.severity == severity.SUSPICIOUS else []).append(item)
        for x in f.findings:
            (dangerous if x.severity == severity.DANGEROUS else suspicious).append(x.message)
    if dangerous:
        return Check("loads_safely", False, "dangerous references (never executed): " + _listing(dangerous))
    if errors:
        return Check("loads_safely", False, "could not be scanned completely: " + _listing(errors, 2))
    if suspicious:
        text = ("unknown pickled classes that torch.load(weights_only=True) refuses: "
                + _listing(sorted(set(suspicious))))
        return Check("loads_safely", not pol.strict, text + ("" if pol.strict else " (fails with --strict)"))
    return Check("loads_safely", True, f"no dangerous references ({pickles} pickle(s) scanned)")


def _matches_target(path: str, ckpt: Checkpoint, pol: Policy, built: Any) -> Check:
    if built is None:
        return _skip("matches_target", "no target (--target or the policy's target)")
    from ..keys.infer import suggest
    from .diff import _attribute_prefixes, compare_tensors

    missing, unexpected, shape_mm, dtype_mm = compare_tensors(ckpt.tensors, built.tensors, lazy=built.lazy)
    if pol.ignore_target_dtype:
        dtype_mm = []
    if not (missing or unexpected or shape_mm or dtype_mm):
        return Check("matches_target", True, f"all {len(built.tensors)} keys of {pol.target} match "
                                             "(names, shapes, dtypes)")
    parts = []
    if missing:
        parts.append(f"missing {len(missing)}: {_listing(missing)}")
    if unexpected:
        parts.append(f"unexpected {len(unexpected)}: {_listing(unexpected)}")
    if shape_mm:
        parts.append(f"shape mismatch {len(shape_mm)}: "
                     + _listing([f"{m.key} {m.a} in the checkpoint, {m.b} in the target" for m in shape_mm]))
    if dtype_mm:
        parts.append(f"dtype mismatch {len(dtype_mm)}: "
                     + _listing([f"{m.key} {m.a} vs {m.b}" for m in dtype_mm]))
    detail = "; ".join(parts)
    if missing or unexpected or shape_mm:
        suggestion = suggest(ckpt.tensors, built.tensors, target_prefixes=_attribute_prefixes(built.module),
                             lazy=built.lazy)
        if suggestion is not None:
            kwargs = json.dumps(dict(pol.target_kwargs)) if pol.target_kwargs else None
            fix = suggestion.command(path, key=pol.key, target=pol.target, target_kwargs=kwargs)
            how = "fixes every key" if suggestion.complete else f"reconciles {suggestion.reconciled} key(s)"
            detail += f". Fix ({how}): {fix}"
    return Check("matches_target", False, detail)


def _no_nan_inf(path: str, ckpt: Checkpoint, pol: Policy, progress: Progress | None) -> Check:
    if not pol.nan_check:
        return _skip("no_nan_inf", "--no-nan-check")
    candidates = [t for t in ckpt.tensors if t.is_floating or t.dtype.startswith("complex")]
    if not candidates:
        return Check("no_nan_inf", True, "no floating-point tensors")
    bad: list[str] = []
    no_data: list[str] = []
    counted = _nonfinite_counts([t for t in candidates if t.storage is not None])
    for i, t in enumerate(candidates):
        if t.storage is None:
            no_data.append(t.key)
        else:
            _, nan, inf = next(counted)
            if nan or inf:
                what = ", ".join(p for p in (f"{nan} NaN" if nan else "", f"{inf} Inf" if inf else "") if p)
                bad.append(f"{t.key} ({what})")
        if progress is not None:
            progress(path, i + 1, len(candidates))
    note = f"; {len(no_data)} tensor(s) hold no data (meta device)" if no_data else ""
    if bad:
        return Check("no_nan_inf", False, f"{len(bad)} of {len(candidates)} floating tensors hold NaN/Inf: "
                                          + _listing(bad) + note)
    return Check("no_nan_inf", True, f"{len(candidates) - len(no_data)} floating tensors, all finite{note}")


def _nonfinite_counts(tensors: list[TensorMeta]) -> Iterator[tuple[TensorMeta, int, int]]:
    """(tensor, NaN count, Inf count) per tensor, in order.

    Contiguous tensors are read chunk by chunk by worker threads, one per
    core, each bit-testing the chunk it read (tensordata.check_reads), so the
    check runs at about the speed of reading the file.
    """
    from ..tensors.tensordata import all_finite, check_reads, group_reads

    # Small tensors (200,000 of them in some files) are read in the calling thread and
    # bit-tested a batch at a time: a thread hand-off and a NumPy call per tensor cost more
    # than reading it. A batch that holds a NaN or Inf is counted tensor by tensor.
    small = {id(t): t for t in tensors if t.is_contiguous and 0 < t.nbytes < _SMALL_TENSOR}
    small_counts = _small_nonfinite_counts(list(small.values()))
    streamed = [t for t in tensors if t.is_contiguous and t.numel and id(t) not in small]
    reads, owner = group_reads([(t,) for t in streamed], _CHUNK)

    def check(i: int, raw: Any) -> tuple[int, int]:
        dtype = streamed[owner[i]].dtype
        return (0, 0) if all_finite(raw, dtype) else _count_chunk(raw, dtype)

    chunks = check_reads(reads, check, chunk_bytes=_CHUNK)
    counts = Counter(owner)  # chunks per streamed tensor
    done = 0  # streamed tensors counted so far
    try:
        for t in tensors:
            if id(t) in small:
                yield (t, *small_counts[id(t)])
                continue
            if not (t.is_contiguous and t.numel):
                yield (t, *count_nonfinite(t))  # a strided view is gathered whole; an empty one holds nothing
                continue
            nan = inf = 0
            for _ in range(counts[done]):
                n, i = next(chunks)
                nan, inf = nan + n, inf + i
            done += 1
            yield t, nan, inf
    finally:
        chunks.close()


_SMALL_TENSOR = 256 << 10  # bytes: smaller contiguous tensors are checked in batches


def _small_nonfinite_counts(tensors: list[TensorMeta]) -> dict[int, tuple[int, int]]:
    """id(tensor) -> (NaN count, Inf count) for small contiguous tensors, batched by dtype."""
    from ..tensors.tensordata import all_finite, tensor_bytes

    out: dict[int, tuple[int, int]] = {}
    by_dtype: dict[str, list[TensorMeta]] = {}
    for t in tensors:
        by_dtype.setdefault(t.dtype, []).append(t)
    for dtype, group in by_dtype.items():
        start = 0
        while start < len(group):
            batch: list[TensorMeta] = []
            size = 0
            while start < len(group) and (not batch or size < _CHUNK):
                batch.append(group[start])
                size += group[start].nbytes
                start += 1
            raws = [tensor_bytes(t) for t in batch]
            if all_finite(b"".join(raws), dtype):
                out.update((id(t), (0, 0)) for t in batch)
            else:
                for t, raw in zip(batch, raws):
                    out[id(t)] = (0, 0) if all_finite(raw, dtype) else _count_chunk(raw, dtype)
    return out


def _count_chunk(raw: Any, dtype: str) -> tuple[int, int]:
    """(NaN count, Inf count) of raw little-endian ``dtype`` values, with torch."""
    import torch

    from ..tensors.tensordata import torch_dtype

    x = torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(torch_dtype(dtype))
    if x.dtype.is_floating_point and x.element_size() == 1:  # float8: no isnan kernels everywhere
        x = x.to(torch.float32)
    return int(torch.isnan(x).sum()), int(torch.isinf(x).sum())


def count_nonfinite(t: TensorMeta, buffer: bytearray | None = None) -> tuple[int, int]:
    """(NaN count, Inf count), reading a contiguous tensor in chunks, a strided one whole.

    Each chunk is first tested bit by bit (tensordata.all_finite: ~5 GB/s, no
    torch import); only a chunk that holds a NaN or Inf is counted with torch
    (torch.isfinite runs at ~0.4 GB/s).
    """
    from ..tensors.tensordata import all_finite, iter_raw

    nan = inf = 0
    if buffer is None or len(buffer) < min(_CHUNK, t.nbytes):
        buffer = bytearray(min(_CHUNK, t.nbytes))
    for raw in iter_raw(t, _CHUNK, buffer):
        if not all_finite(raw, t.dtype):
            n, i = _count_chunk(raw, t.dtype)
            nan, inf = nan + n, inf + i
    return nan, inf


def _dtype_policy(ckpt: Checkpoint, pol: Policy) -> Check:
    if pol.allowed_float_dtypes is None and pol.allowed_dtypes is None:
        return _skip("dtype_policy", "no allowed dtypes (--allow-dtype or the policy)")
    offending: dict[str, list[str]] = {}
    for t in ckpt.tensors:
        if (pol.allowed_dtypes is not None and t.dtype not in pol.allowed_dtypes) or (
            pol.allowed_float_dtypes is not None and t.is_floating and t.dtype not in pol.allowed_float_dtypes
        ):
            offending.setdefault(t.dtype, []).append(t.key)
    allowed = ", ".join(pol.allowed_dtypes or pol.allowed_float_dtypes or ())
    scope = "tensors" if pol.allowed_dtypes is not None else "floating tensors"
    if offending:
        parts = [f"{dt}: {len(keys)} tensor(s) ({_listing(keys, 3)})" for dt, keys in offending.items()]
        return Check("dtype_policy", False, "; ".join(parts) + f" — allowed for {scope}: {allowed}")
    counts = Counter(t.dtype for t in ckpt.tensors)
    return Check("dtype_policy", True, f"all {scope} in {allowed} ("
                 + ", ".join(f"{k} x{v}" for k, v in counts.most_common()) + ")")


def _file_size(path: str, pol: Policy) -> Check:
    if pol.max_file_size is None:
        return _skip("file_size", "no limit (--max-size or the policy's max_file_size)")
    from ..units import human_bytes

    size = path_bytes(path)
    verdict = "<=" if size <= pol.max_file_size else ">"
    return Check("file_size", size <= pol.max_file_size,
                 f"{human_bytes(size)} ({size:,} bytes) {verdict} the limit of {human_bytes(pol.max_file_size)}")


def path_bytes(path: str) -> int:
    """A file's size, or the total of every file under a folder (a sharded set, a DCP folder)."""
    if path.endswith(".index.json") and os.path.isfile(path):
        path = os.path.dirname(path) or "."
    if os.path.isdir(path):
        return sum(os.path.getsize(os.path.join(root, f)) for root, _, files in os.walk(path) for f in files)
    return os.path.getsize(path)


def _required_metadata(ckpt: Checkpoint, pol: Policy) -> Check:
    if not pol.required_metadata:
        return _skip("required_metadata", "no required keys (--require-metadata or the policy)")
    missing = [k for k in pol.required_metadata if not _has_metadata(ckpt.metadata, k)]
    if missing:
        have = sorted(str(k) for k in _metadata_keys(ckpt.metadata))
        return Check("required_metadata", False, f"missing {_listing(missing)} (the checkpoint has: "
                     + (_listing(have, 8) if have else "no metadata") + ")")
    return Check("required_metadata", True, "present: " + ", ".join(pol.required_metadata))


def _metadata_keys(meta: Mapping[str, Any]) -> list[str]:
    keys = [str(k) for k in meta if k != "__metadata__"]
    inner = meta.get("__metadata__")
    if isinstance(inner, Mapping):
        keys += [str(k) for k in inner]
    return keys


def _has_metadata(meta: Mapping[str, Any], dotted: str) -> bool:
    """A top-level key, a dotted path into nested metadata, or a safetensors ``__metadata__`` entry."""
    for root in (meta, meta.get("__metadata__")):
        if not isinstance(root, Mapping):
            continue
        if dotted in root:
            return True
        obj: Any = root
        for part in dotted.split("."):
            if isinstance(obj, Mapping) and part in obj:
                obj = obj[part]
            elif isinstance(obj, list) and part.isdigit() and int(part) < len(obj):
                obj = obj[int(part)]
            else:
                break
        else:
            return True
    return False


def _sha256(path: str, pol: Policy) -> Check:
    pin = pol.sha256 or pol.pin_for(path)
    if pin is None:
        return _skip("sha256", "no pin (--sha256 or the policy's [sha256] table)")
    if os.path.isdir(path):
        return Check("sha256", False, "a sha256 pin is for one file; this is a folder")
    digest = sha256_file(path)
    if digest == pin:
        return Check("sha256", True, f"sha256 {digest} matches the pin")
    return Check("sha256", False, f"sha256 is {digest}, the pin is {pin}")


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def strict_warnings(ckpt: Checkpoint, pol: Policy) -> list[str]:
    """Every warning inspect prints, plus unusual dtypes and layouts and oversized metadata."""
    from .inspect import layout_notes

    out = list(ckpt.warnings)
    unusual = Counter(t.dtype for t in ckpt.tensors if t.dtype not in USUAL_DTYPES)
    if unusual:
        out.append("unusual dtypes: " + ", ".join(f"{k} x{v}" for k, v in unusual.items()))
    notes = layout_notes(ckpt.tensors)
    odd_layout = sorted(k for k, n in notes.items() if any(x in ("non-contiguous", "channels_last") for x in n))
    if odd_layout:
        out.append(f"{len(odd_layout)} tensor(s) with an unusual layout (non-contiguous or channels_last): "
                   + _listing(odd_layout, 3))
    size = len(json.dumps(ckpt.metadata, default=str))
    if size > pol.max_metadata_bytes:
        out.append(f"metadata is {size:,} bytes as JSON, over {pol.max_metadata_bytes:,} "
                   "(optimizer state or logs shipped with the weights?)")
    return out


def _warnings(ckpt: Checkpoint, pol: Policy) -> Check:
    found = strict_warnings(ckpt, pol)
    if not found:
        return Check("warnings", True, "none")
    text = f"{len(found)} warning(s): " + " | ".join(found)
    return Check("warnings", not pol.strict, text if pol.strict else text + " (fails with --strict)")
