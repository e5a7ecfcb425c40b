"""``ckpt diff``: what happens when A's weights are loaded where B is expected.

Key, shape and dtype differences follow ``load_state_dict`` and come from
metadata alone; when both sides are checkpoints nothing here imports torch.
``values=True`` streams tensor pairs one at a time (compare_values) and is
the only path that reads tensor bytes. A ``--target`` is a module built on
the meta device (target.py), which of course imports torch.
"""
from __future__ import annotations

import math
from collections import Counter, OrderedDict
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from ..errors import UsageError
from ..model import Checkpoint, TensorMeta, json_safe, shapes_compatible
from ..pickles.unpickler import DEFAULT_LIMITS, Limits

if TYPE_CHECKING:
    from ..keys.infer import Suggestion

# Metadata a reader adds about the file's layout, not about its contents: not diffed.
LAYOUT_METADATA = {"sharded": ("shards", "shard_format", "metadata")}
_MAX_METADATA_ITEMS = 2000


@dataclass(frozen=True)
class Mismatch:
    """One key whose shape (or dtype) differs: ``a`` is what A holds, ``b`` what B expects."""

    key: str
    a: Any  # shape list or dtype string
    b: Any


@dataclass(frozen=True)
class ValueDiff:
    """How far A's values are from B's for one key, judged like torch.allclose(equal_nan=True)."""

    key: str
    max_abs: float
    max_rel: float
    nan_a: int
    nan_b: int
    inf_a: int
    inf_b: int
    passed: bool
    mismatched: int = 0  # elements outside atol + rtol * |b|
    numel: int = 0
    compared_as: str = ""  # the dtype both sides were compared in

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key, "max_abs": _json_float(self.max_abs), "max_rel": _json_float(self.max_rel),
            "passed": self.passed, "mismatched": self.mismatched, "numel": self.numel,
            "nan_a": self.nan_a, "nan_b": self.nan_b, "inf_a": self.inf_a, "inf_b": self.inf_b,
            "compared_as": self.compared_as,
        }


def _json_float(x: float) -> float | str:
    """JSON has no NaN/Infinity: those become the strings "nan", "inf" (as in inspect)."""
    if math.isnan(x) or math.isinf(x):
        return str(x)
    return x


@dataclass(frozen=True)
class DiffReport:
    """Everything ``ckpt diff`` found; ``equal`` decides the exit code."""

    a: str
    b: str
    missing: tuple[str, ...]
    unexpected: tuple[str, ...]
    shape_mismatch: tuple[Mismatch, ...]
    dtype_mismatch: tuple[Mismatch, ...]
    value_mismatch: tuple[ValueDiff, ...]
    values: tuple[ValueDiff, ...]
    metadata_diff: dict[str, Any]
    suggestion: Suggestion | None
    warnings: tuple[str, ...]
    b_kind: str = "checkpoint"  # or "target"
    a_format: str = ""
    b_format: str = ""
    a_count: int = 0
    b_count: int = 0
    compared_values: bool = False
    atol: float = 1e-8
    rtol: float = 1e-5
    fail_on_metadata: bool = False
    key: str | None = None
    key_b: str | None = None
    target_kwargs: Mapping[str, Any] = field(default_factory=dict)
    plain_tensor_attributes: tuple[str, ...] = ()

    @property
    def metadata_differs(self) -> bool:
        return any(self.metadata_diff.get(k) for k in ("changed", "only_a", "only_b"))

    @property
    def equal(self) -> bool:
        """No difference that affects loading: keys, shapes, dtypes and (when compared) values.

        Metadata differences (epoch, optimizer, ...) count only with
        ``fail_on_metadata``: they never change what load_state_dict does.
        """
        differs = self.missing or self.unexpected or self.shape_mismatch or self.dtype_mismatch or self.value_mismatch
        return not differs and not (self.fail_on_metadata and self.metadata_differs)

    def migrate_command(self, output: str | None = None) -> str | None:
        """The ``ckpt migrate`` command that applies the suggestion to A, or None."""
        if self.suggestion is None:
            return None
        target = kwargs = None
        # --target makes migrate verify a strict load: only for a rewrite that leaves no key difference
        if self.b_kind == "target" and self.suggestion.complete:
            import json

            target = self.b
            kwargs = json.dumps(dict(self.target_kwargs)) if self.target_kwargs else None
        return self.suggestion.command(self.a, output, key=self.key, target=target, target_kwargs=kwargs)

    def to_json(self) -> dict[str, Any]:
        suggestion = None
        if self.suggestion is not None:
            suggestion = self.suggestion.to_json()
            suggestion["command"] = self.migrate_command()
        return {
            "equal": self.equal,
            "a": self.a,
            "b": self.b,
            "b_kind": self.b_kind,
            "a_format": self.a_format,
            "b_format": self.b_format,
            "a_tensors": self.a_count,
            "b_tensors": self.b_count,
            "missing": list(self.missing),
            "unexpected": list(self.unexpected),
            "shape_mismatch": [{"key": m.key, "a": m.a, "b": m.b} for m in self.shape_mismatch],
            "dtype_mismatch": [{"key": m.key, "a": m.a, "b": m.b} for m in self.dtype_mismatch],
            "value_mismatch": [v.to_json() for v in self.value_mismatch],
            "values_compared": self.compared_values,
            "values": [v.to_json() for v in self.values] if self.compared_values else None,
            "atol": self.atol,
            "rtol": self.rtol,
            "metadata_diff": self.metadata_diff,
            "suggestion": suggestion,
            "plain_tensor_attributes": list(self.plain_tensor_attributes),
            "warnings": list(self.warnings),
        }


def compare_tensors(
    a: Sequence[TensorMeta], b: Sequence[TensorMeta], *, lazy: Iterable[str] = ()
) -> tuple[list[str], list[str], list[Mismatch], list[Mismatch]]:
    """(missing, unexpected, shape_mismatch, dtype_mismatch) for A loaded where B is expected.

    As ``load_state_dict(strict=False)``: missing keys in B's order,
    unexpected keys in A's order, and the size mismatches it raises for
    (a one-element 1-d tensor loads into a 0-d one; lazy parameters take
    any shape). dtypes are compared too, although load_state_dict casts.
    """
    a_map = {t.key: t for t in a}
    b_keys = {t.key for t in b}
    lazy = set(lazy)
    missing = [t.key for t in b if t.key not in a_map]
    unexpected = [t.key for t in a if t.key not in b_keys]
    shape_mismatch: list[Mismatch] = []
    dtype_mismatch: list[Mismatch] = []
    for tb in b:
        ta = a_map.get(tb.key)
        if ta is None:
            continue
        if tb.key not in lazy and not shapes_compatible(ta.shape, tb.shape):
            shape_mismatch.append(Mismatch(tb.key, list(ta.shape), list(tb.shape)))
        if ta.dtype != tb.dtype and tb.key not in lazy:
            dtype_mismatch.append(Mismatch(tb.key, ta.dtype, tb.dtype))
    return missing, unexpected, shape_mismatch, dtype_mismatch


# ------------------------------------------------------------------ metadata


def metadata_diff(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
    """Differences in non-tensor entries, found with deepdiff, as JSON-safe lists.

    ``changed``: paths whose value differs (``a``, ``b``); ``only_a`` /
    ``only_b``: paths present on one side only. Paths are dotted
    (``optimizer.param_groups.0.lr``); list order matters.
    """
    quick = _flat_metadata_diff(a, b)
    if quick is not None:
        return quick
    if _identical(a, b):  # the same nested metadata on both sides (a file against its copy)
        return {"changed": [], "only_a": [], "only_b": []}
    from deepdiff import DeepDiff

    tree = DeepDiff(dict(a), dict(b), view="tree", verbose_level=2, threshold_to_diff_deeper=0,
                    ignore_private_variables=False)
    changed: list[dict[str, Any]] = []
    only_a: list[dict[str, Any]] = []
    only_b: list[dict[str, Any]] = []
    for kind, levels in tree.items():
        for level in levels:
            path = _dotted(level.path(output_format="list"))
            if kind in ("values_changed", "type_changes"):
                changed.append({"path": path, "a": json_safe(level.t1), "b": json_safe(level.t2)})
            elif kind in ("dictionary_item_removed", "iterable_item_removed", "attribute_removed",
                          "set_item_removed"):
                only_a.append({"path": path, "value": json_safe(level.t1)})
            elif kind in ("dictionary_item_added", "iterable_item_added", "attribute_added", "set_item_added"):
                only_b.append({"path": path, "value": json_safe(level.t2)})
            else:  # repetition changes and the like: show both sides
                changed.append({"path": path, "a": json_safe(level.t1), "b": json_safe(level.t2)})
    for items in (changed, only_a, only_b):
        items.sort(key=lambda x: x["path"])
        del items[_MAX_METADATA_ITEMS:]
    return {"changed": changed, "only_a": only_a, "only_b": only_b}


_SCALARS = (str, int, float, bool, type(None))


def _flat_metadata_diff(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, Any] | None:
    """What DeepDiff reports when every key present on both sides holds a scalar; else None.

    The common case (a safetensors ``__metadata__`` on one side only, equal
    epochs) then needs no deepdiff import, which costs more than the whole
    metadata diff of a multi-GB pair.
    """
    if not all(type(k) is str for k in (*a, *b)):
        return None
    common = [k for k in a if k in b]
    if not all(type(a[k]) in _SCALARS and type(b[k]) in _SCALARS for k in common):
        return None
    # a type change (1 vs 1.0, True vs 1) counts as a change, as in DeepDiff; so does NaN vs NaN
    changed = [{"path": k, "a": json_safe(a[k]), "b": json_safe(b[k])} for k in common
               if type(a[k]) is not type(b[k]) or a[k] != b[k]]
    only_a = [{"path": k, "value": json_safe(v)} for k, v in a.items() if k not in b]
    only_b = [{"path": k, "value": json_safe(v)} for k, v in b.items() if k not in a]
    for items in (changed, only_a, only_b):
        items.sort(key=lambda x: x["path"])
        del items[_MAX_METADATA_ITEMS:]
    return {"changed": changed, "only_a": only_a, "only_b": only_b}


def _identical(x: Any, y: Any) -> bool:
    """True only where DeepDiff would report nothing: same types, equal values, no NaN, all the way down.

    Anything else (sets, other objects, a NaN, 1 against 1.0) is False and
    left to DeepDiff, so this can only save its import (~0.2 s), never
    change an answer.
    """
    if type(x) is not type(y):
        return False
    if type(x) in (dict, OrderedDict):
        return x.keys() == y.keys() and all(_identical(v, y[k]) for k, v in x.items())
    if type(x) in (list, tuple):
        return len(x) == len(y) and all(map(_identical, x, y))
    return type(x) in _SCALARS and x == y  # a NaN is not equal to itself: False


def _dotted(parts: Sequence[Any]) -> str:
    return ".".join(str(p) for p in parts) or "<root>"


def content_metadata(ckpt: Checkpoint) -> dict[str, Any]:
    """The checkpoint's metadata without what only describes the file layout (shard lists)."""
    skip = LAYOUT_METADATA.get(ckpt.format, ())
    return {str(k): v for k, v in ckpt.metadata.items() if k not in skip}


# ------------------------------------------------------------------ values

# Elements per step of the value comparison: bounds the temporaries (~25 MiB in all) at any tensor size.
_CHUNK = 1 << 18


def compare_values(
    pairs: Sequence[tuple[TensorMeta, TensorMeta]], *, atol: float, rtol: float,
    progress: Callable[[str], None] | None = None,
) -> tuple[list[ValueDiff], list[str]]:
    """(one ValueDiff per pair, keys skipped because a side holds no data).

    Each pair is read chunk by chunk (tensordata.iter_chunks) and compared
    as it is read, so peak memory is a few chunks, whatever the tensor sizes
    (a strided view is gathered whole first).
    """
    results: list[ValueDiff | None] = []
    skipped: list[str] = []
    later: list[int] = []  # indices into results: pairs compared value by value, with torch, at the end
    slots: dict[int, tuple[TensorMeta, TensorMeta]] = {}
    started = False  # torch is being imported in the background
    # Pairs of one dtype and shape are first compared where worker threads
    # read them (_quick_diffs): an identical, all-finite pair (most of a
    # near-identical checkpoint) costs a memcmp and a bit test, a differing
    # fp16/32/64 pair NumPy's arithmetic on the same chunks, no torch. The
    # other pairs wait until that pass is done, while torch is imported on
    # another thread (1-2 s here, otherwise added to the total).
    quick = [(ta, tb) for ta, tb in pairs if _bytewise(ta, tb)]
    verdicts = _quick_diffs(quick, atol=atol, rtol=rtol)
    pending = iter(quick)
    next_quick = next(pending, None)
    restore: list[int] = []
    try:
        for ta, tb in pairs:
            if ta.storage is None or tb.storage is None:
                skipped.append(ta.key)
                continue
            if next_quick is not None and next_quick[0] is ta and next_quick[1] is tb:
                next_quick = next(pending, None)
                found = next(verdicts)
                if found is not None:
                    results.append(found)
                    if progress is not None:
                        progress(ta.key)
                    continue
            if not started and not _numpy_comparable(ta, tb):
                started = True
                _import_torch_in_background()
            later.append(len(results))
            results.append(None)
            slots[len(results) - 1] = (ta, tb)
        for i in later:
            ta, tb = slots[i]
            quick_diff = _numpy_pair(ta, tb, atol=atol, rtol=rtol) if _numpy_comparable(ta, tb) else None
            results[i] = quick_diff or compare_pair(ta, tb, atol=atol, rtol=rtol, _threads=restore)
            if progress is not None:
                progress(ta.key)
    finally:
        verdicts.close()
        if restore:
            import torch

            torch.set_num_threads(restore[0])
    return [r for r in results if r is not None], skipped


_NUMPY_FLOATS = {"float16": "<f2", "float32": "<f4", "float64": "<f8"}


def _numpy_comparable(ta: TensorMeta, tb: TensorMeta) -> bool:
    """Both sides are floats NumPy holds natively, stored contiguously: _numpy_pair can try them."""
    return (ta.dtype in _NUMPY_FLOATS and tb.dtype in _NUMPY_FLOATS and ta.numel == tb.numel
            and ta.is_contiguous and tb.is_contiguous)


class _NumpyCompare:
    """compare_pair's finite path for float16/32/64 chunks, in NumPy (no torch import).

    The same operations in the same dtype (_compare_dtype) as compare_pair,
    so the figures are identical. ``chunk`` returns None for a chunk that
    holds a NaN or Inf (or whose difference overflows): compare_pair then
    handles the pair, with its equal_nan and Inf rules.
    """

    def __init__(self, ta: TensorMeta, tb: TensorMeta, *, atol: float, rtol: float) -> None:
        import numpy as np

        self.key, self.numel = ta.key, ta.numel
        self.cd = _compare_dtype(ta.dtype, tb.dtype)
        self.ct = np.dtype(_NUMPY_FLOATS[self.cd])
        self.fa, self.fb = np.dtype(_NUMPY_FLOATS[ta.dtype]), np.dtype(_NUMPY_FLOATS[tb.dtype])
        self.same_dtype = ta.dtype == tb.dtype
        self.dtype = ta.dtype
        self.atol, self.rtol = self.ct.type(atol), self.ct.type(rtol)
        self.acc = _Acc()

    def chunk(self, ra: Any, rb: Any) -> _Acc | None:
        """One chunk of each side (the same elements) compared on its own; None: NaN/Inf, leave it to torch.

        Thread-safe (it changes nothing): chunks of one pair may be compared
        on several threads and their results merged in order (``merge``).
        """
        import numpy as np

        from ..tensors.tensordata import all_finite, same_bytes

        acc = _Acc()
        if self.same_dtype and same_bytes(ra, rb):
            return acc if all_finite(ra, self.dtype) is not False else None
        fa, fb, ct = self.fa, self.fb, self.ct
        n = len(ra) // fa.itemsize
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            for first in range(0, n, _CHUNK):  # pieces that stay in the CPU cache
                count = min(_CHUNK, n - first)
                xa = np.frombuffer(ra, dtype=fa, count=count, offset=first * fa.itemsize).astype(ct)
                yb = np.frombuffer(rb, dtype=fb, count=count, offset=first * fb.itemsize).astype(ct)
                ad = np.abs(np.subtract(xa, yb, out=xa), out=xa)
                top = float(ad.max())
                if not math.isfinite(top):
                    return None
                acc.max_abs = max(acc.max_abs, top)
                ref = np.abs(yb, out=yb)
                bound = np.multiply(ref, self.rtol)
                bound += self.atol
                acc.bad += int(np.count_nonzero(ad > bound))
                # max |a-b|/|b|: 0/0 (NaN) counts as equal, x/0 as inf; fmax skips NaNs
                rel = float(np.fmax.reduce(np.divide(ad, ref, out=bound)))
                if rel == rel:
                    acc.max_rel = max(acc.max_rel, rel)
        return acc

    def merge(self, part: _Acc) -> None:
        acc = self.acc
        acc.max_abs = max(acc.max_abs, part.max_abs)
        acc.max_rel = max(acc.max_rel, part.max_rel)
        acc.bad += part.bad

    def result(self) -> ValueDiff:
        acc = self.acc
        return ValueDiff(self.key, acc.max_abs, acc.max_rel, 0, 0, 0, 0, acc.bad == 0, acc.bad, self.numel, self.cd)


def _numpy_pair(ta: TensorMeta, tb: TensorMeta, *, atol: float, rtol: float) -> ValueDiff | None:
    """compare_pair's result for finite float16/32/64 values (_NumpyCompare), reading the pair here."""
    from ..tensors.tensordata import iter_raw

    compare = _NumpyCompare(ta, tb, atol=atol, rtol=rtol)
    for ra, rb in zip(iter_raw(ta, _CHUNK * compare.fa.itemsize), iter_raw(tb, _CHUNK * compare.fb.itemsize)):
        part = compare.chunk(ra, rb)
        if part is None:
            return None
        compare.merge(part)
    return compare.result()


def _import_torch_in_background() -> None:
    """Start importing torch on a daemon thread; ``import torch`` later waits for it to finish."""
    import sys
    import threading

    if "torch" not in sys.modules:
        threading.Thread(target=__import__, args=("torch",), name="ckpt-import-torch", daemon=True).start()


def _bytewise(ta: TensorMeta, tb: TensorMeta) -> bool:
    return (ta.storage is not None and tb.storage is not None and ta.dtype == tb.dtype and ta.shape == tb.shape
            and ta.numel > 0 and ta.is_contiguous and tb.is_contiguous)


def _quick_diffs(pairs: list[tuple[TensorMeta, TensorMeta]], *, atol: float,
                 rtol: float) -> Generator[ValueDiff | None, None, None]:
    """Per pair (same dtype and shape, contiguous), in order: its ValueDiff, or None to leave it to the caller.

    Worker threads read both sides chunk by chunk and check each chunk where
    they read it (tensordata.check_reads). A pair whose bytes are identical
    and finite gets a zero ValueDiff; a differing fp16/32/64 pair is
    compared with NumPy on the same chunks (_NumpyCompare), so it is never
    read twice. A pair with NaN/Inf, or of another dtype, that differs gets
    None at its first such chunk (its remaining chunks are passed over).
    """
    from ..tensors.tensordata import all_finite, check_reads, group_reads, same_bytes

    # Small pairs (200,000 of them in some files) are read here and bit-tested in
    # batches: a thread hand-off and a NumPy call per pair would cost more than the bytes.
    small = _small_verdicts([p for p in pairs if p[0].nbytes < _SMALL_PAIR])
    large = [(ta, tb) for ta, tb in pairs if ta.nbytes >= _SMALL_PAIR]
    numeric = [_NumpyCompare(ta, tb, atol=atol, rtol=rtol) if _numpy_comparable(ta, tb) else None
               for ta, tb in large]
    reads, owner = group_reads(large)
    counts = Counter(owner)  # chunks per large pair
    given_up: set[int] = set()  # large pairs already left to the caller

    def check(i: int, a: Any, b: Any) -> _Acc | None:
        compare = numeric[owner[i]]
        if compare is not None:
            return compare.chunk(a, b)
        return _Acc() if same_bytes(a, b) and all_finite(a, large[owner[i]][0].dtype) is not False else None

    results = check_reads(reads, check, skip=lambda i: owner[i] in given_up)
    p = 0
    try:
        for ta, tb in pairs:
            if ta.nbytes < _SMALL_PAIR:
                yield _zero_diff(ta, tb) if small[id(ta), id(tb)] else None
                continue
            compare = numeric[p]
            ok = True
            for _ in range(counts[p]):
                part = next(results)
                if not ok:
                    continue
                if part is None:
                    ok = False
                    given_up.add(p)
                elif compare is not None:
                    compare.merge(part)
            yield (compare.result() if compare is not None else _zero_diff(ta, tb)) if ok else None
            p += 1
    finally:
        results.close()


def _zero_diff(ta: TensorMeta, tb: TensorMeta) -> ValueDiff:
    """The ValueDiff of a pair that holds the same bytes, none of them NaN or Inf."""
    return ValueDiff(ta.key, 0.0, 0.0, 0, 0, 0, 0, True, 0, ta.numel, _compare_dtype(ta.dtype, tb.dtype))


_SMALL_PAIR = 256 << 10  # bytes: pairs of smaller tensors are tested in batches, without the worker threads


def _small_verdicts(pairs: list[tuple[TensorMeta, TensorMeta]]) -> dict[tuple[int, int], bool]:
    """Per (id(a), id(b)) of small pairs: True if the bytes are the same and none is NaN/Inf (tested per batch)."""
    from ..tensors.tensordata import RAW_CHUNK, all_finite, tensor_bytes

    out: dict[tuple[int, int], bool] = {}
    pending: dict[str, list[tuple[tuple[int, int], bytes]]] = {}  # dtype -> identical pairs awaiting the bit test
    sizes: dict[str, int] = {}

    def flush(dtype: str) -> None:
        batch = pending.pop(dtype, [])
        sizes.pop(dtype, None)
        if batch and all_finite(b"".join(raw for _, raw in batch), dtype) is not False:
            out.update((key, True) for key, _ in batch)
        else:
            out.update((key, all_finite(raw, dtype) is not False) for key, raw in batch)

    for ta, tb in pairs:
        raw = tensor_bytes(ta)
        key = (id(ta), id(tb))
        if raw != tensor_bytes(tb):
            out[key] = False
            continue
        pending.setdefault(ta.dtype, []).append((key, raw))
        sizes[ta.dtype] = sizes.get(ta.dtype, 0) + len(raw)
        if sizes[ta.dtype] >= RAW_CHUNK:
            flush(ta.dtype)
    for dtype in list(pending):
        flush(dtype)
    return out


def _compare_dtype(a: str, b: str) -> str:
    """bf16 vs fp32 compares in fp32; anything with fp64 or an integer in fp64; complex in complex128."""
    from .. import dtypes

    kinds = {dtypes.lookup(a).kind, dtypes.lookup(b).kind}
    if "complex" in kinds:
        return "complex128"
    if "float64" in (a, b) or not kinds & {"float"}:
        return "float64"
    if kinds - {"float"}:  # a float against an integer: fp64 holds both exactly (up to 2**53)
        return "float64"
    return "float32"


def compare_pair(ta: TensorMeta, tb: TensorMeta, *, atol: float, rtol: float,
                 _threads: list[int] | None = None) -> ValueDiff:
    """Max |a-b|, max |a-b|/|b|, NaN/Inf counts and allclose(a, b, rtol, atol, equal_nan=True).

    NaNs in the same place are equal (a checkpoint equals itself); a NaN
    against a number, or an Inf against anything but the same Inf, is an
    infinite difference and fails. Relative difference is against B (the
    expected side), as in torch.allclose: 0 where both are 0, inf where only B is.
    ``_threads`` (compare_values): torch is set to one thread on first use and
    the previous count is recorded there, for the caller to restore.
    """
    import torch

    from ..tensors.tensordata import iter_chunks

    if _threads is not None and not _threads:
        # One thread: on chunks this small, OpenMP workers spin-waiting for a busy
        # CPU cost 40x (measured: 10 s vs 0.2 s for 32M elements on a loaded 2-core machine).
        _threads.append(torch.get_num_threads())
        torch.set_num_threads(1)

    cd = _compare_dtype(ta.dtype, tb.dtype)
    dt = getattr(torch, cd)
    same_dtype = ta.dtype == tb.dtype
    is_float = ta.is_floating or tb.is_floating or "complex" in (ta.dtype[:7], tb.dtype[:7])
    acc = _Acc()
    for xs, ys in zip(iter_chunks(ta, _CHUNK), iter_chunks(tb, _CHUNK)):
        if same_dtype and torch.equal(xs.view(torch.uint8), ys.view(torch.uint8)):
            # bit-identical (the common case when checking a conversion): only count NaN/Inf
            if is_float and not bool(torch.isfinite(xs).all()):
                n, i = int(torch.isnan(xs).sum()), int(torch.isinf(xs).sum())
                acc.nan_a, acc.nan_b, acc.inf_a, acc.inf_b = acc.nan_a + n, acc.nan_b + n, acc.inf_a + i, acc.inf_b + i
            continue
        xa, yb = xs.to(dt), ys.to(dt)
        ad = torch.sub(xa, yb).abs_() if not xa.is_complex() else (xa - yb).abs()
        top = float(ad.max()) if ad.numel() else 0.0  # NaN if any element is: max propagates NaN
        if is_float and math.isfinite(top):
            acc.max_abs = max(acc.max_abs, top)
            _finite_chunk(acc, ad, yb, atol, rtol)
        else:
            _general_chunk(acc, xs, ys, xa, yb, ad, not is_float, atol, rtol)
    return ValueDiff(ta.key, acc.max_abs, acc.max_rel, acc.nan_a, acc.nan_b, acc.inf_a, acc.inf_b, acc.bad == 0,
                     acc.bad, ta.numel, cd)


@dataclass
class _Acc:
    max_abs: float = 0.0
    max_rel: float = 0.0
    nan_a: int = 0
    nan_b: int = 0
    inf_a: int = 0
    inf_b: int = 0
    bad: int = 0


def _finite_chunk(acc: _Acc, ad: Any, yb: Any, atol: float, rtol: float) -> None:
    """Both sides finite here (max |a-b| is): the few passes a plain allclose needs (max_abs is done)."""
    import torch

    ref = yb.abs()
    acc.bad += int(torch.count_nonzero(ad > torch.mul(ref, rtol).add_(atol)))
    rel = torch.nan_to_num_(ad.div_(ref), nan=0.0, posinf=math.inf)  # 0/0: equal; x/0: inf
    acc.max_rel = max(acc.max_rel, float(rel.max()))


def _general_chunk(acc: _Acc, xs: Any, ys: Any, xa: Any, yb: Any, ad: Any, exact_ints: bool,
                   atol: float, rtol: float) -> None:
    """NaN, Inf or integers in this chunk: equal_nan, same-signed Inf equal, anything else non-finite fails."""
    import torch

    xnan, ynan = torch.isnan(xa), torch.isnan(yb)
    acc.nan_a += int(xnan.sum())
    acc.nan_b += int(ynan.sum())
    acc.inf_a += int(torch.isinf(xa).sum())
    acc.inf_b += int(torch.isinf(yb).sum())
    same = (xs == ys) if exact_ints else ((xa == yb) | (xnan & ynan))
    zero = torch.zeros((), dtype=ad.dtype)
    diff = torch.where(same, zero, ad)
    diff = torch.where(torch.isnan(diff), torch.full((), math.inf, dtype=diff.dtype), diff)
    if exact_ints:  # int64 beyond 2**53: unequal even where fp64 cannot tell
        diff = torch.where(~same & (diff == 0), torch.ones((), dtype=diff.dtype), diff)
    ref = yb.abs()
    finite = torch.isfinite(xa) & torch.isfinite(yb)
    acc.bad += int(((diff > ref * rtol + atol) | (~same & ~finite)).sum())
    if diff.numel():
        acc.max_abs = max(acc.max_abs, float(diff.max()))
        rel = torch.where(diff == 0, zero, diff / ref)
        acc.max_rel = max(acc.max_rel, float(rel.max()))


# ------------------------------------------------------------------ the command


def diff(
    a: str,
    b: str | None = None,
    *,
    target: str | None = None,
    target_kwargs: dict[str, Any] | None = None,
    key: str | None = None,
    key_b: str | None = None,
    unsafe: bool = False,
    values: bool = False,
    atol: float = 1e-8,
    rtol: float = 1e-5,
    progress: Callable[[str], None] | None = None,
    fail_on_metadata: bool = False,
    limits: Limits = DEFAULT_LIMITS,
    on_start: Callable[[int], None] | None = None,
) -> DiffReport:
    """Compare checkpoint ``a`` with checkpoint ``b`` or with a ``target`` module spec.

    ``key`` selects A's state_dict (and B's, unless ``key_b`` is given).
    ``values`` compares the data of every common key of equal shape,
    reading one tensor pair at a time; ``on_start`` gets the number of
    pairs before the first is read, ``progress`` each key after it is done.
    """
    import os

    from ..formats import load

    if (b is None) == (target is None):
        raise UsageError("give either a second checkpoint B or --target SPEC (exactly one)")
    if values and target is not None:
        raise UsageError("--values compares two checkpoints; a --target module built on the meta device holds no values")
    if key_b is not None and target is not None:
        raise UsageError("--key-b selects inside a second checkpoint B; a --target module has no container")
    if atol < 0 or rtol < 0 or math.isnan(atol) or math.isnan(rtol):
        raise UsageError("--atol and --rtol must be non-negative numbers")
    a = os.fspath(a)
    ckpt_a = load(a, key=key, unsafe=unsafe, limits=limits)
    warnings = [f"A: {w}" for w in ckpt_a.warnings]
    lazy: tuple[str, ...] = ()
    plain: tuple[str, ...] = ()
    ckpt_b: Checkpoint | None = None
    if target is not None:
        from ..tensors.target import build_target

        built = build_target(target, target_kwargs)
        b_label, b_tensors, b_format = target, list(built.tensors), f"nn.Module built on {built.device}"
        lazy, plain = built.lazy, built.plain_tensor_attributes
        warnings += list(built.warnings)  # each already says "target ..."
        target_prefixes = _attribute_prefixes(built.module)
    else:
        b_label = os.fspath(cast(str, b))  # not None: checked above
        ckpt_b = load(b_label, key=key_b if key_b is not None else key, unsafe=unsafe, limits=limits)
        b_tensors, b_format = list(ckpt_b.tensors), ckpt_b.format
        warnings += [f"B: {w}" for w in ckpt_b.warnings]
        target_prefixes = []
    try:
        missing, unexpected, shape_mm, dtype_mm = compare_tensors(ckpt_a.tensors, b_tensors, lazy=lazy)
        suggestion = None
        if missing or unexpected or shape_mm:
            from ..keys.infer import suggest  # rules and scoring: only when the keys do not line up

            suggestion = suggest(ckpt_a.tensors, b_tensors, target_prefixes=target_prefixes, lazy=lazy)
        meta: dict[str, Any] = {"changed": [], "only_a": [], "only_b": []}
        if ckpt_b is not None:
            meta = metadata_diff(content_metadata(ckpt_a), content_metadata(ckpt_b))
        value_diffs: list[ValueDiff] = []
        if values and ckpt_b is not None:
            bad_shape = {m.key for m in shape_mm}
            b_map = ckpt_b.by_key
            pairs = [(t, b_map[t.key]) for t in ckpt_a.tensors if t.key in b_map and t.key not in bad_shape]
            if on_start is not None:
                on_start(len(pairs))
            value_diffs, skipped = compare_values(pairs, atol=atol, rtol=rtol, progress=progress)
            if skipped:
                warnings.append(f"{len(skipped)} tensor(s) hold no data and were not compared: "
                                + ", ".join(skipped[:5]))
    finally:
        ckpt_a.close()
        if ckpt_b is not None:
            ckpt_b.close()
    return DiffReport(
        a=a, b=b_label, missing=tuple(missing), unexpected=tuple(unexpected),
        shape_mismatch=tuple(shape_mm), dtype_mismatch=tuple(dtype_mm),
        value_mismatch=tuple(v for v in value_diffs if not v.passed), values=tuple(value_diffs),
        metadata_diff=meta, suggestion=suggestion, warnings=tuple(warnings),
        b_kind="target" if target is not None else "checkpoint", a_format=ckpt_a.format, b_format=b_format,
        a_count=len(ckpt_a.tensors), b_count=len(b_tensors), compared_values=bool(values),
        atol=atol, rtol=rtol, fail_on_metadata=fail_on_metadata, key=key, key_b=key_b,
        target_kwargs=dict(target_kwargs or {}), plain_tensor_attributes=plain,
    )


def _attribute_prefixes(module: Any) -> list[str]:
    """``name.`` for each direct child of the target that holds all of its state (a wrapper's ``model.``)."""
    children = [name for name, _ in module.named_children()]
    if len(children) == 1 and not list(module.named_parameters(recurse=False)):
        return [children[0] + "."]
    return []
