"""torch.distributed for one migrate run as several ranks (gloo): start, broadcast, gather, barrier.

The only module that imports torch.distributed for commands/migrate/parallel/;
the objects passed are small and picklable (paths, fingerprints, lists of
problems), as ``broadcast_object_list`` and ``all_gather_object`` need.
"""
from __future__ import annotations

import atexit
from datetime import timedelta
from typing import TypeVar, cast

T = TypeVar("T")


def start(rank: int, world: int, timeout_s: float) -> bool:
    """Join the process group (gloo) unless it already is; True when this call started it.

    Raises ValueError when torch.distributed runs with another rank layout than ``rank``/``world``.
    """
    import torch.distributed as td

    started = False
    if not td.is_initialized():
        td.init_process_group("gloo", timeout=timedelta(seconds=timeout_s))
        atexit.register(_stop)
        started = True
    if td.get_world_size() != world or td.get_rank() != rank:
        raise ValueError(f"torch.distributed runs as rank {td.get_rank()} of {td.get_world_size()}")
    return started


def _stop() -> None:
    """Leave the process group start() made, at exit: gloo's threads are joined here, not torn down with the
    interpreter (which can end a rank whose work is done with "terminate called without an active exception",
    SIGABRT, and torchrun with a failure). Not at the end of each migrate: a process that runs several (the
    Python API) joins the group again, which torchrun's rendezvous does not answer."""
    import torch.distributed as td

    if td.is_initialized():
        td.destroy_process_group()


def broadcast(obj: T, leader: bool) -> T:
    """Rank 0's ``obj`` on every rank (the others' ``obj`` is not sent)."""
    import torch.distributed as td

    box: list[object] = [obj if leader else None]
    td.broadcast_object_list(box, src=0)
    return cast(T, box[0])


def gather(obj: T, world: int) -> list[T]:
    """Every rank's ``obj``, in rank order, on every rank."""
    import torch.distributed as td

    out: list[object] = [None] * world
    td.all_gather_object(out, obj)
    return cast(list[T], out)


def barrier() -> None:
    """Wait until every rank got here."""
    import torch.distributed as td

    td.barrier()

