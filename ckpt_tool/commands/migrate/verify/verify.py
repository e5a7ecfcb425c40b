"""Proving what migrate wrote: bit-for-bit re-reads, and strict loads on each device.

verify_output re-reads a written output with ckpt's own readers and runs
the byte comparisons (compare.py), then the checks on each device
(prove_on_devices: devices.py, and tensors/devices.py for the target loads).
"""
from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from ....format_names import OutputFormat
from ....keys.rules import Plan
from ....limits import Limits
from ....model import TensorMeta
from ....progress import Progress
from ....writers.base import OutTensor
from .compare import MAX_REPORTED, compare_keys, compare_state_dict, compare_tree, tensor_keys, tensors_in
from .devices import roundtrip_device

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


def verify_output(path: str, fmt: OutputFormat, tensors: Sequence[OutTensor], *, pickled_root: object, sd_key: str,
                  devices: Sequence[str], target: str | None, target_kwargs: Mapping[str, object] | None,
                  allow_missing: Sequence[str], limits: Limits, progress: Progress,
                  plan: Plan | None = None,
                  proven: Mapping[str, tuple[int, int]] | None = None) -> tuple[dict[str, bool], list[str]]:
    """Re-read a written (temporary) output with ckpt's readers and prove it on every device.

    Returns (device -> passed, the first problems). An output that cannot be
    read back is a failed verification, not an error. With ``plan``, every
    source tensor the rules keep must be found in the output (missing_from_output). ``proven`` tensors (an
    EarlyCheck's, verify/early.py) were compared while the file was written: their bytes are not compared again
    when the reader places them where they were compared.
    """
    from ....errors import CkptError
    from ....formats import ReadOptions, read_file
    from ....formats.checkpoint.build import build
    from ....formats.checkpoint.locate import resolve_key

    p = progress
    extras: Extras = ({}, None)
    try:
        loaded = read_file(path, ReadOptions(limits=limits))
    except CkptError as exc:
        p.done()
        return {"cpu": False}, [f"the output cannot be read back: {exc.message}"]
    ck = None
    try:
        p.start("verifying", sum(t.nbytes for t in tensors))
        actual: Mapping[str, TensorMeta]
        if fmt is OutputFormat.TORCH_ZIP:
            # everything pickled: structure, metadata values and every tensor's bytes
            problems = compare_tree(pickled_root, loaded.root, p.advance)
            held = resolve_key(loaded.root, sd_key, path) if sd_key else loaded.root
            keys = tensor_keys(held)
            if plan is not None:
                problems = missing_from_output(plan, keys) + problems
            if not problems:
                problems = compare_keys(tensors, keys)
            actual = tensors_in(held) if list(devices) != ["cpu"] or target else {}
            if target:
                from ....tensors.data import load_extras

                extras = load_extras(held)
        else:
            if fmt is OutputFormat.DCP:
                ck = build(loaded, path)
                actual = ck.by_key
            else:
                actual = dict(loaded.root)  # the safetensors readers hold TensorMetas by key
            problems = (missing_from_output(plan, actual) if plan is not None else []) + \
                compare_state_dict(tensors, actual, p.advance, proven)
        p.done()
        if problems:
            return {"cpu": False}, problems
        cpu_only = any(t.source.quantizer is not None for t in tensors)  # quantized kernels run on the CPU only
        return prove_on_devices(actual, tensors, devices, target=target, target_kwargs=target_kwargs,
                                allow_missing=allow_missing, progress=p, extras=extras, cpu_only=cpu_only,
                                results={"cpu": True})
    finally:
        if ck is not None:
            ck.close()
        else:
            for s in loaded.sources:
                s.close()


def prove_on_devices(actual: Mapping[str, TensorMeta], tensors: Sequence[OutTensor], devices: Sequence[str], *,
                     target: str | None, target_kwargs: Mapping[str, object] | None, allow_missing: Sequence[str],
                     progress: Progress, results: dict[str, bool], extras: Extras = ({}, None),
                     cpu_only: bool = False) -> tuple[dict[str, bool], list[str]]:
    """The output, already re-read and compared on the CPU, copied to each device and back and loaded into
    the target there (on the CPU only when ``cpu_only``); stops at the first device that fails."""
    from ....tensors.runtime import load_into_target

    module = None
    p = progress
    for device in devices:
        if device == "cpu" and not target:
            continue  # the re-read ran on the CPU
        if target and module is None:
            from ....tensors.target import build_target

            module = build_target(target, dict(target_kwargs) if target_kwargs is not None else None,
                                  meta=False).module
        p.start(f"on {device}", sum(t.nbytes for t in tensors))
        found: list[str] = []
        if device != "cpu":
            found = roundtrip_device(actual, tensors, device, p.advance)
        if module is not None and not found and (device == "cpu" or not cpu_only):
            found = load_into_target(module, actual, device, allow_missing, p.advance, extras, MAX_REPORTED)
        p.done()
        results[device] = not found
        if found:
            return results, found
    return results, []
