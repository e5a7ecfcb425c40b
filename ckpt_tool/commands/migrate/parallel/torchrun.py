"""Running one migrate as several ranks under ``torchrun`` (torch.distributed, gloo).

``torchrun --nnodes M --nproc-per-node N -m ckpt_tool migrate ...`` starts
the same command M x N times with RANK, WORLD_SIZE and LOCAL_RANK set (and
the rendezvous in MASTER_ADDR/MASTER_PORT). Every rank reads the source's
metadata and plans the same output; rank 0 owns the temporary output and
the index, each rank writes and verifies its share of the shards on the
shared file system. torch is imported only here, only in that mode.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from ....errors import UsageError

TIMEOUT_ENV = "CKPT_DIST_TIMEOUT"  # seconds a rank waits for the others (default 1800, torch's own)


@dataclass
class Dist:
    """This process's place among the ranks, and the collective calls the write needs."""

    rank: int
    world: int
    started: bool = False

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
        import torch.distributed as td

        if not td.is_initialized():
            seconds = float(os.environ.get(TIMEOUT_ENV, "1800"))
            td.init_process_group("gloo", timeout=timedelta(seconds=seconds))
            self.started = True
        if td.get_world_size() != self.world or td.get_rank() != self.rank:
            raise UsageError("torch.distributed is initialised with another rank layout than RANK/WORLD_SIZE")

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank."""
        import torch.distributed as td

        box = [obj if self.leader else None]
        td.broadcast_object_list(box, src=0)
        return box[0]

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, in rank order, on every rank."""
        import torch.distributed as td

        out: list[Any] = [None] * self.world
        td.all_gather_object(out, obj)
        return out

    def barrier(self) -> None:
        import torch.distributed as td

        td.barrier()

    def close(self) -> None:
        if self.started:
            import torch.distributed as td

            td.destroy_process_group()
            self.started = False


def follower() -> bool:
    """True in a torchrun rank other than 0: it writes its share and prints nothing."""
    d = Dist.from_env()
    return d is not None and not d.leader
