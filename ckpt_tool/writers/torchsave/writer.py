"""The torch zip output (``.pth``, ``.pt``, ``.bin``, ...): what ``torch.save`` writes, standard library only."""
from __future__ import annotations

from typing import TYPE_CHECKING

from ...format_names import OutputFormat
from ..interface import PayloadMismatch, Reread, Shaped, ShapeRequest, WriteRequest, Written, file_fd
from ..payload import TorchPayload

if TYPE_CHECKING:
    from ...io.atomic import AtomicDir, AtomicFile


def _payload(request: WriteRequest) -> TorchPayload:
    if not isinstance(request.payload, TorchPayload):
        raise PayloadMismatch("a torch-zip output was planned without its pickled container")
    return request.payload


class TorchZipWriter:
    """A zip archive of ``data.pkl`` and the storages it names; metadata kept, placeholders written back."""

    format = OutputFormat.TORCH_ZIP
    names = ("pth", "pt", "torch")
    extensions = (".pth", ".pt", ".bin", ".ckpt", ".tar")
    folder = False
    shared = False
    suffixes: tuple[str, ...] = ()
    reread: Reread = "tree"  # everything pickled: structure, metadata values and every tensor's bytes

    def shape(self, request: ShapeRequest) -> Shaped:
        """The pickled container: metadata kept, placeholders written back or sanitized; dangerous references
        are never written back, not even sanitized."""
        from ..layout import torch_root
        from .archive import pickle_root
        from .inert import refuse_unwritable

        r = request
        root, sd_key, kept, warnings = torch_root(r.ck, r.chosen, r.tensors, r.rules, r.state_dict_only)
        refuse_unwritable(root, r.source, sd_key)
        sanitized = None
        if r.sanitize:
            from ...pickles.torch_rules import rules_for
            from .sanitize import sanitize_tree as sanitize_tree

            root, conversions = sanitize_tree(root, rules_for(None).allowed)
            if r.ck.layout in ("module", "torchscript"):  # the biggest conversion of all: say it, not "already plain"
                what = "a pickled nn.Module" if r.ck.layout == "module" else "a TorchScript archive"
                conversions = [f"(the file): {what} -> its state_dict (load it with model.load_state_dict)",
                               *conversions]
            sanitized = tuple(conversions)
        data_pkl, table = pickle_root(root)
        return Shaped(payload=TorchPayload(data_pkl=data_pkl, table=table, root=root, sd_key=sd_key),
                      metadata_kept=tuple(kept), sanitized=sanitized, warnings=tuple(warnings))

    def sizes(self, request: WriteRequest) -> list[int]:
        from .size import torch_zip_size

        payload = _payload(request)
        return [torch_zip_size(request.out, payload.data_pkl, payload.table)]

    def bound(self, request: WriteRequest) -> tuple[int, int] | None:
        from .size import bound

        return bound(request.out, _payload(request))

    def write(self, into: AtomicFile | AtomicDir, request: WriteRequest) -> Written:
        from .archive import write_torch_zip

        payload, p = _payload(request), request.progress
        p.start("writing", sum(s.nbytes for s in payload.table.storages))
        write_torch_zip(file_fd(into), request.out, payload.data_pkl, payload.table, p.advance)
        return Written()

