"""The safetensors outputs: one ``.safetensors`` file, or a folder of shards and their index (standard library)."""
from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from ...errors import UsageError
from ...format_names import OutputFormat
from ..interface import PayloadMismatch, Reread, Shaped, ShapeRequest, WriteRequest, Written, file_fd, folder_of
from ..payload import SafetensorsPayload

if TYPE_CHECKING:
    from ...io.atomic import AtomicDir, AtomicFile


def payload_of(request: WriteRequest, fmt: OutputFormat) -> SafetensorsPayload:
    """The stored tensors of a safetensors output (a bug in the planner when they are missing)."""
    if not isinstance(request.payload, SafetensorsPayload):
        raise PayloadMismatch(f"a {fmt} output was planned without its stored tensors")
    return request.payload


def shape_flat(request: ShapeRequest, fmt: OutputFormat) -> Shaped:
    """Each tensor stored once (ties as aliases) and the string metadata of a safetensors file or set."""
    from ..layout import dedupe, safetensors_metadata
    from .single import check_dtypes

    refuse_held(request, fmt)
    stored, aliases, warnings = dedupe(request.tensors)
    meta, kept, more = safetensors_metadata(request.ck, request.chosen, request.state_dict_only)
    warnings += more
    clash = sorted(a for a in aliases if a in meta)
    if clash:
        warnings.append(f"metadata entries replaced by tie records: {', '.join(clash[:5])}")
    check_dtypes(stored)
    return Shaped(payload=SafetensorsPayload(stored=tuple(stored), aliases=aliases, meta=meta),
                  metadata_kept=tuple(kept), aliases=aliases, warnings=tuple(warnings))


def refuse_held(request: ShapeRequest, fmt: OutputFormat) -> None:
    """A flat mapping of tensors cannot hold the tensors inside other objects: never dropped silently."""
    from ..layout import entries_holding_tensors

    held = [k for k in entries_holding_tensors(request.chosen, request.ck.keys) if request.rules.new_key(k) is not None]
    if held:  # they are tensors of the source too
        raise UsageError(f"a {fmt} output holds a flat mapping of tensors; these state_dict entries "
                         f"hold tensors inside another object and would be lost: {', '.join(map(repr, held[:5]))}"
                         f"{' ...' if len(held) > 5 else ''}; write a .pth, or leave them out with --drop")


class SafetensorsWriter:
    """One ``.safetensors`` file: a JSON header, then every stored tensor's bytes."""

    format = OutputFormat.SAFETENSORS
    names = ("safetensors",)
    extensions = (".safetensors",)
    folder = False
    shared = True
    suffixes: tuple[str, ...] = ()
    reread: Reread = "mapping"

    def shape(self, request: ShapeRequest) -> Shaped:
        return shape_flat(request, self.format)

    def sizes(self, request: WriteRequest) -> list[int]:
        from .size import safetensors_size

        payload = payload_of(request, self.format)
        return [safetensors_size(payload.stored, {**payload.meta, **payload.aliases})]

    def bound(self, request: WriteRequest) -> tuple[int, int] | None:
        from .size import bound

        return bound(payload_of(request, self.format), None)

    def write(self, into: AtomicFile | AtomicDir, request: WriteRequest) -> Written:
        from .single import write_safetensors

        payload, p = payload_of(request, self.format), request.progress
        p.start("writing", sum(t.nbytes for t in payload.stored))
        write_safetensors(file_fd(into), payload.stored, {**payload.meta, **payload.aliases}, p.advance,
                          request.follower)
        return Written()


class ShardedWriter:
    """A folder of safetensors shards of at most ``--max-shard-size`` each, and ``model.safetensors.index.json``."""

    format = OutputFormat.SHARDED
    names: tuple[str, ...] = ()  # chosen by --max-shard-size
    extensions: tuple[str, ...] = ()
    folder = True
    shared = True
    suffixes = (".safetensors", ".index.json")  # sharded.SHARD_SUFFIXES
    reread: Reread = "mapping"

    def shape(self, request: ShapeRequest) -> Shaped:
        return shape_flat(request, self.format)

    def sizes(self, request: WriteRequest) -> list[int]:
        from .size import sharded_sizes

        payload = payload_of(request, self.format)
        return sharded_sizes(payload.stored, payload.aliases, payload.meta, request.shard_bytes or 1)

    def bound(self, request: WriteRequest) -> tuple[int, int] | None:
        from .size import bound

        return bound(payload_of(request, self.format), request.shard_bytes or 1)

    def write(self, into: AtomicFile | AtomicDir, request: WriteRequest) -> Written:
        from .sharded import write_sharded

        tmp, payload, p = folder_of(into), payload_of(request, self.format), request.progress
        limit = request.shard_bytes or 1
        p.start("writing", sum(t.nbytes for t in payload.stored))
        shards = write_sharded(tmp.path, tmp.create, payload.stored, payload.aliases, payload.meta, limit, p.advance)
        return Written(tuple(shards), oversized(payload.stored, limit))


def oversized(stored: object, limit: int) -> tuple[str, ...]:
    """The warning about tensors larger than ``--max-shard-size`` (each then has a shard of its own)."""

    big = [t.key for t in stored if t.nbytes > limit] if isinstance(stored, Iterable) else []
    return (f"{len(big)} tensor(s) are larger than --max-shard-size and have a shard of their own: "
            f"{', '.join(big[:3])}",) if big else ()
