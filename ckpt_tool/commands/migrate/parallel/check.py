"""The owner's check of an output its workers wrote and verified share by share.

The bytes of every stored tensor were compared with the source by the
process that wrote them; what remains is the whole: every expected key
(aliases of tied tensors included) present with its dtype and shape,
nothing else, and then the device and target checks verify_output runs.
"""
from __future__ import annotations

from typing import Any

from ..verify.compare import MAX_REPORTED


def check_whole(job: Any, path: str) -> tuple[dict[str, bool], list[str]]:
    """(device -> passed, first problems) for the complete temporary output at ``path``."""
    from ....errors import CkptError
    from ....formats import read_file
    from ....formats.checkpoint.loaded import ReadOptions
    from ..verify.verify import missing_from_output

    try:
        loaded = read_file(path, ReadOptions(limits=job.limits))
    except CkptError as exc:
        return {"cpu": False}, [f"the output cannot be read back: {exc.message}"]
    try:
        actual = dict(loaded.root)
        plan = job.report_args.get("plan")
        problems = missing_from_output(plan, actual) if plan is not None else []
        for t in job.tensors:
            found = actual.get(t.key)
            if found is None:
                problems.append(f"{t.key}: missing from the output")
            elif found.dtype != t.dtype or tuple(found.shape) != tuple(t.shape):
                problems.append(f"{t.key}: {found.dtype}{list(found.shape)} in the output, expected "
                                f"{t.dtype}{list(t.shape)}")
            if len(problems) >= MAX_REPORTED:
                break
        extra = sorted(set(actual) - {t.key for t in job.tensors})
        if extra:
            problems.append(f"unexpected tensors in the output: {', '.join(extra[:MAX_REPORTED])}")
        results = {"cpu": not problems}
        if problems:
            return results, problems
        return _devices(job, actual, results)
    finally:
        for s in loaded.sources:
            s.close()


def _devices(job: Any, actual: dict[str, Any], results: dict[str, bool]) -> tuple[dict[str, bool], list[str]]:
    from ..verify.devices import load_into_target, roundtrip_device

    module = None
    p = job.progress
    for device in job.devices:
        if device == "cpu" and not job.target:
            continue  # the shares were re-read and compared on the CPU
        if job.target and module is None:
            from ....tensors.target import build_target

            module = build_target(job.target, job.target_kwargs, meta=False).module
        p.start(f"on {device}", sum(t.nbytes for t in job.tensors))
        found: list[str] = []
        if device != "cpu":
            found = roundtrip_device(actual, job.tensors, device, p.advance)
        if module is not None and not found:
            found = load_into_target(module, actual, device, job.allow_missing, p.advance)
        p.done()
        results[device] = not found
        if found:
            return results, found
    return results, []
