"""Where an output may be written: checked before a single byte is, so a refusal costs nothing.

ckpt never modifies its input and never replaces an existing output unless
asked (--force), and even then never wipes a folder that holds files it
did not write.
"""
from __future__ import annotations

import os
from collections.abc import Collection, Iterable

from ...errors import OutputExists, UsageError


def _real(path: str) -> str:
    return os.path.realpath(os.path.abspath(path))


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def check_destination(out: str, sources: Iterable[str], *, force: bool, folder: bool) -> None:
    """Refuse outputs that would overwrite SRC or an existing output; called before any write."""
    out_real = _real(out)
    parent = os.path.dirname(os.path.abspath(out))
    srcs = [s for s in sources if s]
    for src in srcs:
        src_real = _real(src)
        if out_real == src_real or _same_file(out, src):
            raise UsageError(f"the output {out} is the source {src} (or a link to it): ckpt never "
                             "modifies its input; write to a new path")
        if folder and (src_real + os.sep).startswith(out_real.rstrip(os.sep) + os.sep):
            raise UsageError(f"the output folder {out} holds the source {src}: replacing it would delete "
                             "the input; write to a new folder")
    if not os.path.isdir(parent):
        raise UsageError(f"cannot write {out}: the folder {parent} does not exist")
    if not os.path.lexists(out):
        return
    if not force:
        what = "folder" if os.path.isdir(out) else "file"
        raise OutputExists(f"the output {what} {out} exists; pass --force to replace it "
                           "(it is replaced only after the new output is complete and verified)")
    if folder and not os.path.isdir(out):
        raise UsageError(f"the output {out} is a file but this format writes a folder")
    if not folder and os.path.isdir(out) and not os.path.islink(out):
        raise UsageError(f"the output {out} is a folder; give a file name (e.g. {out.rstrip('/')}/model.pth)")


def check_replaceable_folder(out: str, allowed_suffixes: tuple[str, ...], allowed_files: Collection[str] = ()) -> None:
    """--force replaces a folder only if it holds nothing but files of the kind ckpt writes there.

    A model folder that also holds config.json or tokenizer files is never wiped, unless they are
    ``allowed_files`` ("/"-separated paths inside it: those a Hugging Face folder output copies there).
    """
    if not os.path.isdir(out):
        return
    allowed = set(allowed_files)
    folders = {f.rsplit("/", 1)[0] for f in allowed if "/" in f}
    foreign = []
    for root, _dirs, files in os.walk(out):
        rel = os.path.relpath(root, out)
        where = "" if rel == "." else rel.replace(os.sep, "/") + "/"
        if where and where.rstrip("/") not in folders:
            foreign.append(rel + os.sep)
            continue
        foreign.extend(where + name for name in files
                       if where + name not in allowed and (where or not name.endswith(allowed_suffixes)))
    if foreign:
        shown = ", ".join(sorted(foreign)[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        raise UsageError(f"refusing to replace the folder {out}: it holds files ckpt does not write there "
                         f"({shown}); choose a new folder")
