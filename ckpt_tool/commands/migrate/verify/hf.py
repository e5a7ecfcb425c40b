"""Proving a Hugging Face folder output: its copied files are the source's, and its library finds the weights.

The weights themselves are re-read and compared bit for bit like any
safetensors output (verify.py); here each copied file is compared with the
file it was copied from (config.json with the dtype rewrite applied), and
the folder is identified again as its library's loader would (formats/hf),
which must choose the weights migrate wrote and nothing else.
"""
from __future__ import annotations

import os

from ....errors import CkptError
from ....formats.hf import HfOutput
from ....io import paths


def weights_path(folder: str, hf: HfOutput, sharded: bool) -> str:
    """The file the verification re-reads: the weights, or the index of their shards."""
    where = os.path.join(folder, *hf.weights_dir.split("/")) if hf.weights_dir else folder
    return os.path.join(where, hf.index_name if sharded else hf.weights_name)


def check_folder(folder: str, hf: HfOutput, sharded: bool, cast_to: str | None) -> list[str]:
    """The problems of the written folder besides its tensors (none: it is what from_pretrained needs)."""
    from ....formats.hf import identify, is_library_folder
    from ....writers import retyped_config

    problems = []
    if hf.copy_from is not None:
        prefix = f"{hf.weights_dir}/" if hf.weights_dir else ""
        for rel in hf.files:
            with paths.open_bytes(paths.join(hf.copy_from, rel)) as data:
                expected = data.read(0, data.size)
            if cast_to is not None and rel in ("config.json", f"{prefix}config.json"):
                expected = retyped_config(expected, cast_to) or expected
            with open(os.path.join(folder, *rel.split("/")), "rb") as f:
                if f.read() != expected:
                    problems.append(f"the copied {rel} differs from the source's")
    if not is_library_folder(folder):
        return problems
    try:
        found = identify(folder)
    except CkptError as exc:
        return [*problems, f"the output folder is not one its library reads: {exc.message}"]
    want = os.path.relpath(weights_path(folder, hf, sharded), folder).replace(os.sep, "/")
    if found.weights != want:
        problems.append(f"the output folder's loader would read {found.weights}, not the {want} written")
    return problems
