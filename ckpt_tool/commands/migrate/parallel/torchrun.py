"""Running one migrate as several ranks under ``torchrun`` (torch.distributed, gloo).

``torchrun --nnodes M --nproc-per-node N -m ckpt_tool migrate ...`` starts
the same command M x N times with RANK, WORLD_SIZE and LOCAL_RANK set (and
the rendezvous in MASTER_ADDR/MASTER_PORT). Every rank reads the source's
metadata and plans the same output; rank 0 owns the temporary output and
the index, each rank writes and verifies its share of the shards on the
shared file system. torch.distributed is called through tensors/distributed.py, only in that mode.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TypeVar

from ....errors import UsageError

TIMEOUT_ENV = "CKPT_DIST_TIMEOUT"  # seconds a rank waits for the others (default 1800, torch's own)
T = TypeVar("T")


@dataclass(frozen=True)
class Dist:
    """This process's place among the ranks, and the collective calls the write needs (tensors/distributed.py).

    Frozen and picklable: it travels in the migrate plan.
    """

    rank: int
    world: int

    @classmethod
    def from_env(cls) -> Dist | None:
        """The ranks torchrun set up, or None when this is a plain single-process run."""
        rank, world = os.environ.get("RANK"), os.environ.get("WORLD_SIZE")
        if rank is None or world is None:
            return None
        try:
            r, w = int(rank), int(world)
        except ValueError:
            raise UsageError(f"RANK={rank!r} and WORLD_SIZE={world!r} are not numbers") from None
        if w <= 1:
            return None
        if not 0 <= r < w:
            raise UsageError(f"RANK={r} is outside WORLD_SIZE={w}")
        return cls(r, w)

    @property
    def leader(self) -> bool:
        return self.rank == 0

    def start(self) -> None:
        """Join the ranks' process group (torchrun's rendezvous), waiting at most CKPT_DIST_TIMEOUT seconds."""
        from ....tensors.runtime import distributed

        try:
            distributed.start(self.rank, self.world, float(os.environ.get(TIMEOUT_ENV, "1800")))
        except ValueError:
            raise UsageError("torch.distributed is initialised with another rank layout than RANK/WORLD_SIZE") \
                from None

    def broadcast(self, obj: T) -> T:
        """Rank 0's ``obj`` on every rank."""
        from ....tensors.runtime import distributed

        return distributed.broadcast(obj, self.leader)

    def gather(self, obj: T) -> list[T]:
        """Every rank's ``obj``, in rank order, on every rank."""
        from ....tensors.runtime import distributed

        return distributed.gather(obj, self.world)

    def barrier(self) -> None:
        from ....tensors.runtime import distributed

        distributed.barrier()


def follower() -> bool:
    """True in a torchrun rank other than 0: it writes its share and prints nothing."""
    d = Dist.from_env()
    return d is not None and not d.leader
