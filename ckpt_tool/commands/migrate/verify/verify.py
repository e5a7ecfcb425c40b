"""The one verifier of what migrate wrote: a bit-for-bit re-read, then strict loads on each device.

verify_output re-reads a written output with ckpt's own readers
(reread.py) and runs the byte comparisons (compare.py), then the checks on
each device (prove_on_devices: devices.py, and tensors/devices.py for the
target loads). Every output goes through it before it is published, however
many processes wrote it: what was compared before (by an EarlyCheck while
the file was written, or by each process for its share) is handed over as
``proven`` and not compared again where it lies.
"""
from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ....errors import CkptError
from ....keys import Plan
from ....limits import Limits
from ....model import TensorMeta
from ....progress import Progress
from ....writers import OutTensor, Reread
from .compare import MAX_REPORTED, compare_keys, compare_state_dict, compare_tree, tensor_keys, tensors_in
from .devices import roundtrip_device
from .reread import by_key, close_output, open_output, unreadable

if TYPE_CHECKING:
    from ....formats import Loaded

Extras = tuple[Mapping[str, object], object]  # a loader's non-tensor entries, and the state_dict's _metadata


def missing_from_output(plan: Plan, keys: Collection[str]) -> list[str]:
    """Every source tensor the rules keep must be in the re-read output, under its new key.

    A source tensor may be absent only when the user's own rules dropped it
    (--drop, a rules file; --key chose the state_dict): those are the plan's
    dropped entries. Anything else missing is named.
    """
    have = set(keys)
    lost = [e for e in plan.entries if e.output is not None and e.output not in have]
    problems = [f"source tensor {e.source!r} is missing from the output"
                + (f" (it should be {e.output!r})" if e.output != e.source else "") for e in lost[:MAX_REPORTED]]
    if len(lost) > MAX_REPORTED:
        problems.append(f"... and {len(lost) - MAX_REPORTED} more source tensors missing")
    return problems


@dataclass(frozen=True, kw_only=True)
class Expected:
    """What a written output must hold, as planned, and what of it was already compared bit for bit."""

    reread: Reread  # how its writer says it is read back (writers/interface.py)
    tensors: Sequence[OutTensor]
    pickled_root: object = None  # a torch zip: the tree pickled, compared whole with the re-read one
    sd_key: str = ""  # ... and where its state_dict is in it ("" for the root)
    plan: Plan | None = None  # every source tensor the rules keep must be in the output (missing_from_output)
    proven: Mapping[str, tuple[int, int]] = field(default_factory=dict)  # key -> (file offset, bytes) compared


@dataclass(frozen=True, kw_only=True)
class DeviceChecks:
    """Where a re-read output is proven besides the CPU's comparison, and the target loaded there."""

    devices: Sequence[str] = ("cpu",)
    target: str | None = None
    target_kwargs: Mapping[str, object] | None = None
    allow_missing: Sequence[str] = ()


def verify_output(path: str, expected: Expected, checks: DeviceChecks, *, limits: Limits,
                  progress: Progress) -> tuple[dict[str, bool], list[str]]:
    """Re-read a written (temporary) output with ckpt's readers and prove it on every device.

    Returns (device -> passed, the first problems). An output that cannot be
    read back is a failed verification, not an error. ``expected.proven``
    tensors were compared before: their bytes are not compared again when the
    reader places them where they were compared.
    """
    try:
        loaded = open_output(path, limits)
    except CkptError as exc:
        progress.done()
        return {"cpu": False}, [unreadable(exc.message)]
    try:
        return _verify_loaded(loaded, path, expected, checks, progress)
    finally:
        close_output(loaded)


def _verify_loaded(loaded: Loaded, path: str, expected: Expected, checks: DeviceChecks,
                   progress: Progress) -> tuple[dict[str, bool], list[str]]:
    p = progress
    ck = None
    try:
        p.start("verifying", sum(t.nbytes for t in expected.tensors))
        extras: Extras = ({}, None)
        actual: Mapping[str, TensorMeta]
        if expected.reread == "tree":
            problems, actual, extras = _compare_tree(loaded, path, expected, checks, p)
        else:
            if expected.reread == "checkpoint":
                from ....formats.checkpoint import build_checkpoint as build

                ck = build(loaded, path)
                actual = ck.by_key
            else:
                actual = by_key(loaded)  # the safetensors readers hold TensorMetas by key
            problems = (missing_from_output(expected.plan, actual) if expected.plan is not None else []) + \
                compare_state_dict(expected.tensors, actual, p.advance, expected.proven)
        p.done()
        if problems:
            return {"cpu": False}, problems
        cpu_only = any(t.source.quantizer is not None for t in expected.tensors)  # quantized kernels: the CPU only
        return prove_on_devices(actual, expected.tensors, checks, progress=p, extras=extras, cpu_only=cpu_only,
                                results={"cpu": True})
    finally:
        for source in ck.sources if ck is not None else ():
            if not any(source is s for s in loaded.sources):  # the reader's own are closed with it
                source.close()


def _compare_tree(loaded: Loaded, path: str, expected: Expected, checks: DeviceChecks,
                  progress: Progress) -> tuple[list[str], Mapping[str, TensorMeta], Extras]:
    """A torch zip: everything pickled (structure, metadata values and every tensor's bytes), then its
    state_dict's keys; (problems, its tensors for the device checks, the target's extras)."""
    from ....formats.checkpoint import resolve_key

    problems = compare_tree(expected.pickled_root, loaded.root, progress.advance)
    held = resolve_key(loaded.root, expected.sd_key, path) if expected.sd_key else loaded.root
    keys = tensor_keys(held)
    if expected.plan is not None:
        problems = missing_from_output(expected.plan, keys) + problems
    if not problems:
        problems = compare_keys(expected.tensors, keys)
    actual = tensors_in(held) if list(checks.devices) != ["cpu"] or checks.target else {}
    extras: Extras = ({}, None)
    if checks.target:
        from ....tensors.data import load_extras

        extras = load_extras(held)
    return problems, actual, extras


def prove_on_devices(actual: Mapping[str, TensorMeta], tensors: Sequence[OutTensor], checks: DeviceChecks, *,
                     progress: Progress, results: dict[str, bool], extras: Extras = ({}, None),
                     cpu_only: bool = False) -> tuple[dict[str, bool], list[str]]:
    """The output, already re-read and compared on the CPU, copied to each device and back and loaded into
    the target there (on the CPU only when ``cpu_only``); stops at the first device that fails."""
    from ....tensors.runtime import load_into_target

    module = None
    p, target = progress, checks.target
    for device in checks.devices:
        if device == "cpu" and not target:
            continue  # the re-read ran on the CPU
        if target and module is None:
            from ....tensors.target import build_target

            kwargs = checks.target_kwargs
            module = build_target(target, dict(kwargs) if kwargs is not None else None, meta=False).module
        p.start(f"on {device}", sum(t.nbytes for t in tensors))
        found: list[str] = []
        if device != "cpu":
            found = roundtrip_device(actual, tensors, device, p.advance)
        if module is not None and not found and (device == "cpu" or not cpu_only):
            found = load_into_target(module, actual, device, checks.allow_missing, p.advance, extras, MAX_REPORTED)
        p.done()
        results[device] = not found
        if found:
            return results, found
    return results, []
