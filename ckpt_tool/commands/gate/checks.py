"""The checks of ``ckpt gate``, one function each, returning a pass/fail/skipped Check.

Each check takes the loaded checkpoint (or the path) and the Policy and
never raises for a finding: a finding is a failed Check. Only
check_no_nan_inf reads tensor data (nonfinite.py).
"""
from __future__ import annotations

import hashlib
import json
import os
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ...io import dirname, is_url, isdir, open_bytes, url_bytes
from ...model import Checkpoint, with_inner
from ...pickles import severity
from ...progress import Progress
from ...tensors.numerics import nonfinite_counts
from .names import CheckName
from .policy import Policy

# dtypes nobody is surprised by; anything else is a warning (--strict fails on it)
USUAL_DTYPES = frozenset(["float32", "float16", "bfloat16", "float64", "int64", "int32", "int16", "int8",
                          "uint8", "bool"])


@dataclass(frozen=True)
class Check:
    name: CheckName
    passed: bool
    detail: str
    skipped: bool = False
    # passed, with something a stricter policy fails on (a dtype the load casts; a warning --strict fails on)
    warning: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "passed": self.passed, "detail": self.detail, "skipped": self.skipped,
                "warning": self.warning}


def skipped(name: CheckName, why: str) -> Check:
    return Check(name, True, f"skipped: {why}", skipped=True)


def listing(items: Sequence[str], limit: int = 5) -> str:
    shown = ", ".join(items[:limit])
    return shown + (f" and {len(items) - limit} more" if len(items) > limit else "")


# ------------------------------------------------------------------ the checks


def check_matches_target(path: str, ckpt: Checkpoint, pol: Policy, built: Any) -> Check:
    """Strict loading into the target: names and shapes must match; a dtype difference is a warning.

    ``load_state_dict`` copies into the target's parameters, casting, so a
    bf16 file loads into an fp32 module (migrate's strict check agrees). The
    policy decides: ``require_target_dtype`` (``--require-dtype``) or
    ``--strict`` fail on it, ``ignore_target_dtype`` does not mention it.
    """
    name = CheckName.MATCHES_TARGET
    if built is None:
        return skipped(name, "no target (--target or the policy's target)")
    from ...keys import suggest
    from ..diff import compare_tensors

    missing, unexpected, shape_mm, dtype_mm = compare_tensors(ckpt.tensors, built.tensors, lazy=built.lazy)
    if pol.ignore_target_dtype:
        dtype_mm = []
    dtypes_fail = bool(dtype_mm) and (pol.require_target_dtype or pol.strict)
    dtype_text = (f"dtype differs for {len(dtype_mm)}: "
                  + listing([f"{m.key} {m.a} in the checkpoint, {m.b} in the target" for m in dtype_mm]))
    if not (missing or unexpected or shape_mm):
        if not dtype_mm:
            what = "names and shapes" if pol.ignore_target_dtype else "names, shapes, dtypes"
            return Check(name, True, f"all {len(built.tensors)} keys of {built.spec} match ({what})")
        if dtypes_fail:
            why = "--require-dtype" if pol.require_target_dtype else "--strict"
            return Check(name, False, f"names and shapes match; {dtype_text} (fails with {why}; load_state_dict "
                                      "would cast them to the target's dtypes)")
        return Check(name, True, f"all {len(built.tensors)} keys of {built.spec} match names and shapes; warning: "
                                 f"{dtype_text}, which load_state_dict casts to the target's dtypes (fails with "
                                 "--require-dtype or --strict; policy ignore_target_dtype = true accepts them)",
                     warning=True)
    parts = []
    if missing:
        parts.append(f"missing {len(missing)}: {listing(missing)}")
    if unexpected:
        parts.append(f"unexpected {len(unexpected)}: {listing(unexpected)}")
    if shape_mm:
        parts.append(f"shape mismatch {len(shape_mm)}: "
                     + listing([f"{m.key} {m.a} in the checkpoint, {m.b} in the target" for m in shape_mm]))
    if dtype_mm:
        parts.append(dtype_text + ("" if dtypes_fail else " (a warning: load_state_dict casts)"))
    detail = "; ".join(parts)
    suggestion = suggest(ckpt.tensors, built.tensors, target_prefixes=built.attribute_prefixes, lazy=built.lazy)
    if suggestion is not None:
        kwargs = json.dumps(dict(pol.target_kwargs)) if pol.target_kwargs else None
        fix = suggestion.command(path, key=pol.key, target=built.spec, target_kwargs=kwargs)
        how = "fixes every key" if suggestion.complete else f"reconciles {suggestion.reconciled} key(s)"
        detail += f". Fix ({how}): {fix}"
    return Check(name, False, detail)


def check_no_nan_inf(path: str, ckpt: Checkpoint, pol: Policy, progress: Progress) -> Check:
    if not pol.nan_check:
        return skipped(CheckName.NO_NAN_INF, "--no-nan-check")
    candidates = [t for t in with_inner(ckpt.tensors) if t.is_floating or t.dtype.startswith("complex")]
    if not candidates:
        return Check(CheckName.NO_NAN_INF, True, "no floating-point tensors")
    bad: list[str] = []
    no_data: list[str] = []
    counted = nonfinite_counts([t for t in candidates if t.storage is not None])
    progress.start(f"NaN/Inf {path}", len(candidates))
    try:
        for t in candidates:
            if t.storage is None:
                no_data.append(t.key)
            else:
                _, nan, inf = next(counted)
                if nan or inf:
                    what = ", ".join(p for p in (f"{nan} NaN" if nan else "", f"{inf} Inf" if inf else "") if p)
                    bad.append(f"{t.key} ({what})")
            progress.advance(1)
    finally:
        progress.done()
    note = f"; {len(no_data)} tensor(s) hold no data (meta device)" if no_data else ""
    if bad:
        return Check(CheckName.NO_NAN_INF, False, f"{len(bad)} of {len(candidates)} floating tensors hold NaN/Inf: "
                                          + listing(bad) + note)
    return Check(CheckName.NO_NAN_INF, True, f"{len(candidates) - len(no_data)} floating tensors, all finite{note}")



def check_dtype_policy(ckpt: Checkpoint, pol: Policy) -> Check:
    if pol.allowed_float_dtypes is None and pol.allowed_dtypes is None:
        return skipped(CheckName.DTYPE_POLICY, "no allowed dtypes (--allow-dtype or the policy)")
    offending: dict[str, list[str]] = {}
    for t in ckpt.tensors:
        if (pol.allowed_dtypes is not None and t.dtype not in pol.allowed_dtypes) or (
            pol.allowed_float_dtypes is not None and t.is_floating and t.dtype not in pol.allowed_float_dtypes
        ):
            offending.setdefault(t.dtype, []).append(t.key)
    allowed = ", ".join(pol.allowed_dtypes or pol.allowed_float_dtypes or ())
    scope = "tensors" if pol.allowed_dtypes is not None else "floating tensors"
    if offending:
        parts = [f"{dt}: {len(keys)} tensor(s) ({listing(keys, 3)})" for dt, keys in offending.items()]
        return Check(CheckName.DTYPE_POLICY, False, "; ".join(parts) + f" — allowed for {scope}: {allowed}")
    counts = Counter(t.dtype for t in ckpt.tensors)
    return Check(CheckName.DTYPE_POLICY, True, f"all {scope} in {allowed} ("
                 + ", ".join(f"{k} x{v}" for k, v in counts.most_common()) + ")")


def check_file_size(path: str, pol: Policy) -> Check:
    if pol.max_file_size is None:
        return skipped(CheckName.FILE_SIZE, "no limit (--max-size or the policy's max_file_size)")
    from ...units import human_bytes

    size = path_bytes(path)
    verdict = "<=" if size <= pol.max_file_size else ">"
    return Check(CheckName.FILE_SIZE, size <= pol.max_file_size,
                 f"{human_bytes(size)} ({size:,} bytes) {verdict} the limit of {human_bytes(pol.max_file_size)}")


def path_bytes(path: str) -> int:
    """A file's size, or the total of every file under a folder (a sharded set, a DCP folder)."""
    if is_url(path):
        return url_bytes(dirname(path) if path.endswith(".index.json") else path)
    if path.endswith(".index.json") and os.path.isfile(path):
        path = os.path.dirname(path) or "."
    if os.path.isdir(path):
        return sum(os.path.getsize(os.path.join(root, f)) for root, _, files in os.walk(path) for f in files)
    return os.path.getsize(path)


def check_required_metadata(ckpt: Checkpoint, pol: Policy) -> Check:
    if not pol.required_metadata:
        return skipped(CheckName.REQUIRED_METADATA, "no required keys (--require-metadata or the policy)")
    missing = [k for k in pol.required_metadata if not _has_metadata(ckpt.metadata, k)]
    if missing:
        have = sorted(str(k) for k in _metadata_keys(ckpt.metadata))
        return Check(CheckName.REQUIRED_METADATA, False, f"missing {listing(missing)} (the checkpoint has: "
                     + (listing(have, 8) if have else "no metadata") + ")")
    return Check(CheckName.REQUIRED_METADATA, True, "present: " + ", ".join(pol.required_metadata))


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


def check_sha256(path: str, pol: Policy) -> Check:
    pin = pol.sha256 or pol.pin_for(path)
    if pin is None:
        return skipped(CheckName.SHA256, "no pin (--sha256 or the policy's [sha256] table)")
    if isdir(path):
        return Check(CheckName.SHA256, False, "a sha256 pin is for one file; this is a folder")
    digest = sha256_file(path)
    if digest == pin:
        return Check(CheckName.SHA256, True, f"sha256 {digest} matches the pin")
    return Check(CheckName.SHA256, False, f"sha256 is {digest}, the pin is {pin}")


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    if is_url(path):  # read by parts, like tensor data
        with open_bytes(path) as data:
            for offset in range(0, data.size, 8 << 20):
                h.update(data.read_data(offset, min(8 << 20, data.size - offset)))
        return h.hexdigest()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def strict_warnings(ckpt: Checkpoint, pol: Policy) -> list[str]:
    """Every warning inspect prints, plus unusual dtypes and layouts and oversized metadata."""
    from ..inspect import layout_notes

    out = _lifted(ckpt, pol.weights_only_allow)
    unusual = Counter(t.dtype for t in ckpt.tensors if t.dtype not in USUAL_DTYPES)
    if unusual:
        out.append("unusual dtypes: " + ", ".join(f"{k} x{v}" for k, v in unusual.items()))
    notes = layout_notes(ckpt.tensors)
    odd_layout = sorted(k for k, n in notes.items() if any(x in ("non-contiguous", "channels_last") for x in n))
    if odd_layout:
        out.append(f"{len(odd_layout)} tensor(s) with an unusual layout (non-contiguous or channels_last): "
                   + listing(odd_layout, 3))
    size = len(json.dumps(ckpt.metadata, default=str))
    if size > pol.max_metadata_bytes:
        out.append(f"metadata is {size:,} bytes as JSON, over {pol.max_metadata_bytes:,} "
                   "(optimizer state or logs shipped with the weights?)")
    return out


def _lifted(ckpt: Checkpoint, allow: Sequence[str]) -> list[str]:
    """The checkpoint's warnings, less those about globals the policy allows (``--allow-global``)."""
    allowed = {n for n in allow if severity.allowable(n)}
    if not allowed:
        return list(ckpt.warnings)
    from ...formats.checkpoint import reference_warnings
    from ...model import GlobalRef

    refs = list(ckpt.references)
    old = set(reference_warnings(refs))
    kept = [w for w in ckpt.warnings if w not in old and not any(
        f": {verb} {n}," in w or f": passes {n} to " in w for n in allowed for verb in ("calls", "constructs"))]
    return kept + reference_warnings([GlobalRef(r.module, r.name, severity.SAFE, r.where)
                                      if r.qualname in allowed else r for r in refs])


def check_warnings(ckpt: Checkpoint, pol: Policy) -> Check:
    found = strict_warnings(ckpt, pol)
    if not found:
        return Check(CheckName.WARNINGS, True, "none")
    text = f"{len(found)} warning(s): " + " | ".join(found)
    return Check(CheckName.WARNINGS, not pol.strict, text if pol.strict else text + " (fails with --strict)",
                 warning=not pol.strict)
