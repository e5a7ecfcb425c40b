"""How many processes write a migrate output, decided without importing multiprocessing (workers.py does).

The default is never the slow choice: one process already keeps two cores busy (the writer, and the early
verification thread comparing beside it), so a second process only pays where the machine has cores it leaves
idle and each process gets enough bytes to outweigh its start (imports, re-reading the source's metadata,
re-planning). On 2 cores 2 workers were 2-4x slower than 1 (benchmarks/RESULTS-consolidate-2g.md).
"""
from __future__ import annotations

import os

from ....errors import UsageError
from ....format_names import Format, OutputFormat

PARALLEL_FORMATS = frozenset({OutputFormat.SAFETENSORS, OutputFormat.SHARDED})
CONSOLIDATION_SOURCES = (Format.DEEPSPEED, Format.DCP, Format.MEGATRON_LEGACY, Format.DIST_SAFETENSORS,
                         Format.RANKS)
CORES_PER_WORKER = 2  # the writer and its verification thread
MIN_SHARE_BYTES = 1 << 30  # each process of the default count writes at least this much
MAX_DEFAULT_WORKERS = 8  # past this the disk, not the cores, bounds a durable write


def usable_cores() -> int:
    """The cores this process may run on: its CPU affinity, capped by a cgroup v2 CPU quota (containers)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux: every core counts
        cores = os.cpu_count() or 1
    quota = _cgroup_quota()
    return max(1, min(cores, quota) if quota is not None else cores)


def _cgroup_quota(path: str = "/sys/fs/cgroup/cpu.max") -> int | None:
    """Whole cores of a cgroup v2 ``cpu.max`` quota ("max 100000": none, "200000 100000": 2), None when unset."""
    try:
        with open(path, encoding="ascii") as f:
            fields = f.read().split()
    except OSError:
        return None
    if len(fields) != 2 or fields[0] == "max" or not (fields[0].isdigit() and fields[1].isdigit()):
        return None
    return max(1, int(fields[0]) // max(1, int(fields[1])))


def default_workers(cores: int, total: int) -> int:
    """One process unless there are cores for another and each gets at least MIN_SHARE_BYTES to write."""
    return max(1, min(cores // CORES_PER_WORKER, total // MIN_SHARE_BYTES, MAX_DEFAULT_WORKERS))


def choose_workers(requested: int | None, source_format: str, fmt: str, total: int) -> int:
    """Processes for this output: as asked, else (consolidation sources only) what the cores and size warrant."""
    if requested is not None and requested < 1:
        raise UsageError(f"--workers {requested}: give 1 or more")
    if fmt not in PARALLEL_FORMATS:
        return 1
    if requested is not None:
        return requested
    if source_format not in CONSOLIDATION_SOURCES:
        return 1
    return default_workers(usable_cores(), total)
