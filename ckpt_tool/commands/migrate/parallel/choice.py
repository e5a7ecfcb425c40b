"""How many processes write a migrate output, decided without importing multiprocessing (workers.py does)."""
from __future__ import annotations

import os

from ....errors import UsageError
from ....format_names import Format, OutputFormat

PARALLEL_FORMATS = frozenset({OutputFormat.SAFETENSORS, OutputFormat.SHARDED})
CONSOLIDATION_SOURCES = (Format.DEEPSPEED, Format.DCP, Format.MEGATRON_LEGACY, Format.DIST_SAFETENSORS,
                         Format.RANKS)
MIN_SHARE_BYTES = 256 << 20  # the default worker count gives each process at least this much to write


def choose_workers(requested: int | None, source_format: str, fmt: str, total: int) -> int:
    """Processes for this output: as asked, else (consolidation sources only) the cores the size warrants."""
    if requested is not None and requested < 1:
        raise UsageError(f"--workers {requested}: give 1 or more")
    if fmt not in PARALLEL_FORMATS:
        return 1
    if requested is not None:
        return requested
    if source_format not in CONSOLIDATION_SOURCES:
        return 1
    return max(1, min(os.cpu_count() or 1, total // MIN_SHARE_BYTES))
