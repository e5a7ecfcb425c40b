"""``ckpt inspect``: what is in a checkpoint, from metadata alone (stats on request)."""
from __future__ import annotations

import contextlib
import os
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from operator import attrgetter
from typing import TYPE_CHECKING, Any

from ...errors import InputError
from ...formats import (
    DEFAULT_SOURCE,
    DeclaredQuantization,
    Keyed,
    Limited,
    Predicting,
    SourceOptions,
    TpRulesFile,
    Unpickling,
    Unstacking,
    declared,
)
from ...io import is_url, url_bytes
from ...io.remote import counts_remote
from ...keys import detect_prefixes
from ...model import Checkpoint, Deferred, SubclassMeta, TensorMeta, is_contiguous_layout, json_safe, unread
from ...progress import NO_PROGRESS, Progress
from ..inputs import CheckpointInput, is_path, open_input
from ..keywords import Counted, options_of, source_of, verb
from ..loads_check import WeightsOnlyReport, assess
from .facts import NO_FACTS, SourceFacts, source_facts

if TYPE_CHECKING:
    from ...tensors.numerics import TensorStats


@dataclass(frozen=True)
class InspectReport:
    checkpoint: Checkpoint
    prefixes: tuple[str, ...]
    dtype_counts: dict[str, int]
    notes: dict[str, tuple[str, ...]]
    stats: dict[str, TensorStats] | None = None
    file_bytes: int = 0
    warnings: tuple[str, ...] = field(default=())
    weights_only: WeightsOnlyReport | None = None  # None: nothing to predict from (weights_only/verdict.py)
    remote: dict[str, int] | None = None  # requests and bytes fetched, for a URL
    quantization: DeclaredQuantization | None = None  # what the checkpoint declares (formats/quantization.py)
    facts: SourceFacts = NO_FACTS  # the run it comes from, as the readers recorded it (facts.py); not in JSON

    @property
    def not_read(self) -> list[tuple[str, Deferred]]:
        """(dotted key, value) of the metadata values left unread (a DCP folder's bytes items)."""
        return unread(self.checkpoint.metadata)

    def to_json(self, *, tensors: bool = True) -> dict[str, Any]:
        """The --json document; ``tensors=False`` leaves the tensor list empty (render.inspect writes it)."""
        c = self.checkpoint
        rows = self._tensor_rows() if tensors else []
        out = {
            "path": c.path,
            "format": c.format,
            "layout": c.layout,
            "framework": c.framework,
            "state_dict_key": c.state_dict_key,
            "candidates": [{"key": x.key, "tensors": x.tensors, "chosen": x.chosen} for x in c.candidates],
            "tensors": rows,
            "tensor_count": len(c.tensors),
            "total_numel": c.total_numel,
            "total_nbytes": c.total_nbytes,
            "file_bytes": self.file_bytes,
            "dtypes": self.dtype_counts,
            "metadata_keys": sorted(str(k) for k in c.metadata),
            "metadata": json_safe(dict(c.metadata)),
            "metadata_not_read": [{"key": k, "kind": d.kind, "nbytes": d.nbytes, "file": d.file}
                                  for k, d in self.not_read],
            "prefixes": list(self.prefixes),
            "references": [
                {"module": r.module, "name": r.name, "severity": r.severity, "where": r.where}
                for r in c.references
            ],
            "warnings": list(self.warnings),
            "weights_only": self.weights_only.to_json() if self.weights_only is not None else None,
            "quantization": self.quantization.to_json() if self.quantization is not None else None,
        }
        if self.remote is not None:
            out["remote"] = dict(self.remote)
        return out

    def _tensor_rows(self) -> list[dict[str, Any]]:
        """One JSON object per tensor, with its notes, subclass and --stats figures."""
        c = self.checkpoint
        notes = self.notes
        # one comprehension: this runs once per tensor, 200,000 times in some files
        rows: list[dict[str, Any]] = [
            {
                "key": t.key, "dtype": t.dtype, "shape": list(t.shape), "numel": t.numel,
                "nbytes": t.nbytes, "stride": list(t.strides),
                "storage_offset": t.storage_offset, "device": t.device, "notes": list(notes.get(t.key, ())),
            }
            for t in c.tensors
        ]
        for row, t in zip(rows, c.tensors, strict=True):
            if t.subclass is not None:
                row["subclass"] = subclass_json(t.subclass)
        if self.stats is not None:
            for row in rows:
                s = self.stats.get(row["key"])
                if s is not None:
                    row["stats"] = {"min": s.min, "max": s.max, "mean": s.mean, "std": s.std,
                                    "nan": s.nan, "inf": s.inf}
        return rows



def subclass_json(sub: SubclassMeta) -> dict[str, Any]:
    """A tensor subclass in inspect's JSON: its class, layout and inner tensors (by attribute name)."""
    return {"class": sub.qualname, "layout": sub.layout, "inner": [
        {"name": name, "dtype": t.dtype, "shape": list(t.shape), "numel": t.numel, "nbytes": t.nbytes}
        for name, t in sub.inner]}


_LAYOUT = attrgetter("shape", "stride")
_DEVICE = attrgetter("device")


def layout_notes(tensors: Iterable[TensorMeta]) -> dict[str, tuple[str, ...]]:
    """Per-tensor notes: non-contiguous, channels_last, shared storage, saved device, quantizer."""
    from ...formats.checkpoint import quantizer_note

    tensors, by_storage = _noted(list(tensors))
    notes: dict[str, tuple[str, ...]] = {}
    for t in tensors:
        n: list[str] = []
        if t.stride is not None and not t.is_contiguous:
            n.append("channels_last" if t.is_channels_last else "non-contiguous")
        group = by_storage.get(t.storage_id) if t.storage_id is not None else None
        if group is not None and len(group) > 1:
            others = [k for k in group if k != t.key][:3]
            if others:
                n.append("shares storage with " + ", ".join(others))
        if t.device != "cpu":
            n.append(f"saved on {t.device}")
        if t.quantizer is not None:
            n.append(quantizer_note(t.quantizer))
        if t.subclass is not None:
            n.append(t.subclass.describe())
        if n:
            notes[t.key] = tuple(n)
    return notes


def _noted(tensors: list[TensorMeta]) -> tuple[list[TensorMeta], dict[Any, list[str]]]:
    """The tensors that may get a note, and the keys of each storage when some storage is shared.

    In the common case (no shared storage) only odd layouts, devices, quantizers and subclasses get a
    note, and each distinct layout is checked once: 200,000 tensors are not each looked at in Python.
    """
    ids = [t.storage_id for t in tensors]
    if len(set(ids)) != len(ids):  # some storage is shared (or saved without data)
        by_storage: dict[Any, list[str]] = {}
        for t in tensors:
            sid = t.storage_id
            if sid is not None:
                by_storage.setdefault(sid, []).append(t.key)
        return tensors, by_storage
    return _odd_ones(tensors), {}


def _odd_ones(tensors: list[TensorMeta]) -> list[TensorMeta]:
    """The tensors of odd layout or device, quantized or of a subclass (each distinct layout checked once)."""
    odd = {ss for ss in set(map(_LAYOUT, tensors)) if not is_contiguous_layout(*ss)}
    if odd or set(map(_DEVICE, tensors)) != {"cpu"}:
        return [t for t in tensors if t.device != "cpu" or (t.shape, t.stride) in odd or t.quantizer
                or t.subclass]
    return [t for t in tensors if t.quantizer is not None or t.subclass is not None]


@dataclass(frozen=True, kw_only=True)
class InspectOptions:
    """inspect's own options (how the source is read is the SourceOptions beside them)."""

    stats: bool = False  # read tensor data: min/max/mean/std and NaN/Inf counts


PLAIN_INSPECT = InspectOptions()


@dataclass(frozen=True)
class InspectCall(InspectOptions, Counted, TpRulesFile, Unstacking, Predicting, Limited, Unpickling, Keyed):
    """Describe a checkpoint. Reads tensor bytes only when ``stats`` is true (tensors read go to ``progress``).

    ``torch_version`` picks the torch whose weights_only rules the prediction
    applies (default: the installed torch, else the newest known). ``tp_rules`` names a TOML file
    saying how tensor-parallel shards merge (formats/deepspeed/tprules.py, docs/consolidate.md).
    ``unstack_layers`` gives a Megatron torch_dist checkpoint's stacked layers their per-layer names.
    """

    path: CheckpointInput


def _called(call: InspectCall) -> InspectReport:
    return inspect_input(call.path, source_of(call), options_of(InspectOptions, call), call.progress)


inspect = verb("inspect", InspectCall, _called)  # the Python verb: keyword arguments (commands/keywords.py)


@counts_remote("path")
def inspect_input(path: CheckpointInput, source: SourceOptions = DEFAULT_SOURCE,
                  options: InspectOptions = PLAIN_INSPECT, progress: Progress = NO_PROGRESS) -> InspectReport:
    """Describe a checkpoint. Reads tensor bytes only when ``options.stats`` (tensors read go to ``progress``).

    ``source.torch_version`` picks the torch whose weights_only rules the prediction
    applies (default: the installed torch, else the newest known).
    """
    if is_path(path):
        _refuse_unread(os.fspath(path))
    ckpt = open_input(path, source)  # a path, or (Python) a state dict or module
    stats = options.stats
    per_tensor = None
    if stats:
        per_tensor = {}
        progress.start("reading tensors", len(ckpt.tensors))
        try:
            for t in ckpt.tensors:
                if t.storage is not None:
                    per_tensor[t.key] = _stats(t)
                progress.advance(1)
        finally:
            progress.done()
            ckpt.close()  # the files reading opened; reading again reopens them
    p = os.fspath(path) if is_path(path) else ckpt.path
    size = ckpt.total_nbytes if not is_path(path) else url_bytes(p) if is_url(p) else _path_bytes(p)
    return InspectReport(
        checkpoint=ckpt,
        prefixes=tuple(detect_prefixes(ckpt.keys)),
        dtype_counts=dict(Counter(t.dtype for t in ckpt.tensors).most_common()),
        notes=layout_notes(ckpt.tensors),
        stats=per_tensor,
        file_bytes=size,
        warnings=ckpt.warnings,
        weights_only=assess(ckpt, source.torch_version),
        quantization=declared(ckpt),
        facts=source_facts(ckpt),
    )


def _stats(t: TensorMeta) -> TensorStats:
    """--stats: the numerics module is imported only when values are read."""
    from ...tensors.numerics import compute_stats

    return compute_stats(t)


def _refuse_unread(path: str) -> None:
    """A local folder with a part that cannot be read is an error naming it: nothing unread is safe,
    and a silent inspect must never stand for a folder it did not see whole (scan and gate agree)."""
    if is_url(path) or not os.path.isdir(path):
        return
    from ...io import first_unreadable

    problem = first_unreadable(path)
    if problem is not None:
        raise InputError(problem.message)


def _path_bytes(path: str) -> int:
    if os.path.isdir(path):
        total = 0
        for root, _, files in os.walk(path):
            for f in files:
                with contextlib.suppress(OSError):  # a file removed while walking counts for nothing
                    total += os.path.getsize(os.path.join(root, f))
        return total
    try:
        return os.path.getsize(path)
    except OSError:
        return 0
