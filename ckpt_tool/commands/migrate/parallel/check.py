"""The owner's check of an output its workers wrote and verified share by share.

The bytes of every stored tensor were compared with the source by the
process that wrote them; what remains is the whole: every expected key
(aliases of tied tensors included) present with its dtype and shape,
nothing else, and then the device and target checks verify_output runs.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..verify.compare import MAX_REPORTED

if TYPE_CHECKING:
    from ..job import WriteJob


def check_whole(job: WriteJob, path: str) -> tuple[dict[str, bool], list[str]]:
    """(device -> passed, first problems) for the complete temporary output at ``path``."""
    from ....errors import CkptError
    from ....formats import ReadOptions, read_file
    from ..verify.verify import missing_from_output, prove_on_devices

    try:
        loaded = read_file(path, ReadOptions(limits=job.plan.source.limits))
    except CkptError as exc:
        return {"cpu": False}, [f"the output cannot be read back: {exc.message}"]
    try:
        actual = dict(loaded.root)
        problems = missing_from_output(job.report.plan, actual)
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
        if problems:
            return {"cpu": False}, problems
        v = job.plan.verification
        return prove_on_devices(actual, job.tensors, job.devices, target=v.target, target_kwargs=v.target_kwargs,
                                allow_missing=v.allow_missing, progress=job.hooks.progress, results={"cpu": True})
    finally:
        for s in loaded.sources:
            s.close()
