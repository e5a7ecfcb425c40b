"""Proving what migrate wrote: bit-for-bit re-reads, and strict loads on each device.

verify_output re-reads a written output with ckpt's own readers and runs
the byte comparisons (verify_compare.py), then the checks on each device
(verify_devices.py).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ....writers.base import OutTensor
from .compare import MAX_REPORTED, compare_keys, compare_state_dict, compare_tree, tensor_keys, tensors_in
from .devices import load_into_target, roundtrip_device


def missing_from_output(plan: Any, keys: Any) -> list[str]:
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


def verify_output(path: str, fmt: str, tensors: Sequence[OutTensor], *, pickled_root: Any, sd_key: str,
                  devices: Sequence[str], target: str | None, target_kwargs: dict[str, Any] | None,
                  allow_missing: Sequence[str], limits: Any, progress: Any,
                  plan: Any = None) -> tuple[dict[str, bool], list[str]]:
    """Re-read a written (temporary) output with ckpt's readers and prove it on every device.

    Returns (device -> passed, the first problems). An output that cannot be
    read back is a failed verification, not an error. With ``plan``, every
    source tensor the rules keep must be found in the output (missing_from_output).
    """
    from .... import writers
    from ....errors import CkptError
    from ....formats import read_file
    from ....formats.checkpoint.build import build
    from ....formats.checkpoint.loaded import ReadOptions
    from ....formats.checkpoint.locate import resolve_key

    p = progress
    results: dict[str, bool] = {}
    extras: tuple[Any, Any] = ({}, None)
    try:
        loaded = read_file(path, ReadOptions(limits=limits))
    except CkptError as exc:
        p.done()
        return {"cpu": False}, [f"the output cannot be read back: {exc.message}"]
    ck = None
    try:
        p.start("verifying", sum(t.nbytes for t in tensors))
        if fmt == writers.TORCH_ZIP:
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
                from ....tensors.quantized import load_extras

                extras = load_extras(held)
        elif fmt == writers.DCP:
            ck = build(loaded, path)
            actual = ck.by_key
            problems = (missing_from_output(plan, actual) if plan is not None else []) + \
                compare_state_dict(tensors, actual, p.advance)
        else:
            actual = dict(loaded.root)  # the safetensors readers hold TensorMetas by key
            problems = (missing_from_output(plan, actual) if plan is not None else []) + \
                compare_state_dict(tensors, actual, p.advance)
        p.done()
        results["cpu"] = not problems
        if problems:
            return results, problems
        module = None
        cpu_only = any(t.source.quantizer is not None for t in tensors)  # quantized kernels run on the CPU only
        for device in devices:
            if device == "cpu" and not target:
                continue  # the re-read above ran on the CPU
            if target and module is None:
                from ....tensors.target import build_target

                module = build_target(target, target_kwargs, meta=False).module
            p.start(f"on {device}", sum(t.nbytes for t in tensors))
            found: list[str] = []
            if device != "cpu":
                found = roundtrip_device(actual, tensors, device, p.advance)
            if module is not None and not found and (device == "cpu" or not cpu_only):
                found = load_into_target(module, actual, device, allow_missing, p.advance, extras)
            p.done()
            results[device] = not found
            if found:
                return results, found
    finally:
        if ck is not None:
            ck.close()
        else:
            for s in loaded.sources:
                s.close()
    return results, []
