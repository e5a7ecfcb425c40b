"""Judging migrate's casts: values that became inf/NaN fail, values flushed to zero are reported.

The counts were taken while the output was written (tensors/castloss.py, one
pass over each tensor's values); here they are gathered per output tensor
(tied tensors share their one cast) and turned into report entries,
warnings and, for new inf/NaN without ``--allow-overflow``, failures that
stop the output from being published.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ....tensors.numerics import CastLoss
from ....writers import OutTensor

_SHOWN = 5
OVERFLOW_OPTION = "--allow-overflow"


@dataclass(frozen=True)
class CastReport:
    """One cast tensor and what its cast did to the values."""

    key: str
    source_dtype: str
    dtype: str
    numel: int
    loss: CastLoss

    def to_json(self) -> dict[str, object]:
        return {"key": self.key, "from": self.source_dtype, "to": self.dtype, "numel": self.numel,
                "new_nonfinite": self.loss.new_nonfinite, "saturated": self.loss.saturated,
                "flushed_to_zero": self.loss.flushed,
                "subnormal": self.loss.subnormal}


def _sample(items: Sequence[CastReport], field: str) -> str:
    shown = ", ".join(f"{c.key!r} ({getattr(c.loss, field)} of {c.numel})" for c in items[:_SHOWN])
    return shown + (f" and {len(items) - _SHOWN} more" if len(items) > _SHOWN else "")


def cast_reports(tensors: Sequence[OutTensor]) -> tuple[CastReport, ...]:
    """Every cast output tensor with its counts (a tie that was cast once shares that count)."""
    by_view: dict[object, CastLoss] = {}
    for t in tensors:
        if t.cast and t.loss is not None:
            vk = t.view_key()
            if vk is not None:
                by_view.setdefault(vk, t.loss)
    out = []
    for t in tensors:
        if not t.cast:
            continue
        loss = t.loss if t.loss is not None else by_view.get(t.view_key())
        if loss is None:
            raise RuntimeError(f"{t.key}: cast but never counted")  # a writer that bypassed out_bytes: a bug
        out.append(CastReport(t.key, t.source.dtype, t.dtype, t.numel, loss))
    return tuple(out)


def cast_findings(tensors: Sequence[OutTensor], allow_overflow: bool
                  ) -> tuple[tuple[CastReport, ...], list[str], list[str]]:
    """(per-tensor counts, warnings, failures) of the casts of a written output."""
    reports = cast_reports(tensors)
    warnings: list[str] = []
    failures: list[str] = []
    overflow = [c for c in reports if c.loss.overflowed]
    if overflow:
        bad = sum(c.loss.new_nonfinite for c in overflow)
        clamped = sum(c.loss.saturated for c in overflow)
        to = sorted({c.dtype for c in overflow})
        kinds = " and ".join(part for part in (f"turned {bad} finite value(s) into inf/NaN" if bad else "",
                                              f"clamped {clamped} out-of-range value(s) to the largest finite "
                                              "value" if clamped else "") if part)
        what = (f"the cast to {', '.join(to)} {kinds} in {len(overflow)} tensor(s): "
                f"{_sample(overflow, 'overflowed')}")
        if allow_overflow:
            warnings.append(f"{what}; written anyway ({OVERFLOW_OPTION})")
        else:
            failures.append(f"{what}; nothing was written. Keep those tensors in their dtype (a rules file "
                            f"[cast] entry), cast to a dtype with a wider range (bf16), or pass "
                            f"{OVERFLOW_OPTION} to write them anyway")
    flushed = [c for c in reports if c.loss.flushed]
    if flushed:
        warnings.append(f"the cast flushed {sum(c.loss.flushed for c in flushed)} nonzero value(s) to zero in "
                        f"{len(flushed)} tensor(s): {_sample(flushed, 'flushed')}")
    sub = [c for c in reports if c.loss.subnormal]
    if sub:
        warnings.append(f"the cast stored {sum(c.loss.subnormal for c in sub)} normal value(s) as subnormals "
                        f"(reduced precision) in {len(sub)} tensor(s): {_sample(sub, 'subnormal')}")
    return reports, warnings, failures


def share_losses(tensors: Sequence[OutTensor]) -> list[tuple[str, CastLoss]]:
    """(key, counts) of the cast tensors a worker wrote, to send to the process that owns the output."""
    return [(t.key, t.loss) for t in tensors if t.cast and t.loss is not None]


def apply_losses(tensors: Sequence[OutTensor], losses: Mapping[str, CastLoss]) -> None:
    """Counts taken by other processes, onto the owner's tensors of the same keys."""
    for t in tensors:
        if t.cast and t.loss is None and t.key in losses:
            t.loss = losses[t.key]
