"""The file-by-file weights_only verdict of a library's folder (formats/hf/folders.py).

transformers' from_pretrained reads the weights with safetensors or
``torch.load(weights_only=True)``; the Trainer and accelerate reload their
optimizer, scheduler, scaler and RNG states with torch.load too. Each file
that safetensors or torch.load would open is read again here (its pickle,
never its tensor bytes) for its own verdict; one ckpt cannot read is listed
as not predicted, never as safe. JSON and text files hold no pickle and are
not listed.
"""
from __future__ import annotations

import re
from collections.abc import Mapping

from ...errors import CkptError
from ...formats import ReadOptions, read_file
from ...io import join
from ...model import Checkpoint
from ...pickles.torch_rules import SAFETENSORS as ST_INPUT
from .folder import SAFETENSORS, TORCH_LOAD, FileVerdict, FolderVerdict, PerFile

_PICKLED = (".bin", ".pt", ".pth", ".pkl", ".ckpt", ".pickle")
# The NumPy globals the libraries allowlist around torch.load(weights_only=True) of their RNG states:
# transformers' trainer_pt_utils.safe_globals() for rng_state.pth, accelerate's TORCH_SAFE_GLOBALS for
# random_states_N.pkl (the RNG state of numpy.random is an ndarray of uint32).
NUMPY_RNG_GLOBALS = frozenset({"numpy._core.multiarray._reconstruct", "numpy.core.multiarray._reconstruct",
                               "numpy.ndarray", "numpy.dtype", "numpy.dtypes.UInt32DType"})
_RNG_STATES = re.compile(r"(^|/)(rng_state(_\d+)?\.pth|random_states_\d+\.pkl)$")


def hf_folder_verdict(ck: Checkpoint, torch_version: str | None, per_file: PerFile) -> FolderVerdict | None:
    """The verdict of a library's folder, file by file; None when ``ck`` is not one."""
    files = hf_folder_files(ck, torch_version, per_file)
    if files is None:
        return None
    return FolderVerdict("a folder: torch.load cannot open it (it raises IsADirectoryError); its library's "
                         "loader reads its files one by one", files)


def hf_folder_files(ck: Checkpoint, torch_version: str | None, per_file: PerFile) -> tuple[FileVerdict, ...] | None:
    """Each weights or state file of the folder with its verdict; None when ``ck`` is not a library's folder."""
    meta = ck.metadata.get("hf_folder")
    if not isinstance(meta, Mapping):
        return None
    run = meta.get("run")
    base = ck.path
    prefix = ""
    if isinstance(run, Mapping) and isinstance(run.get("latest"), str):
        prefix = f"{run['latest']}/"
        base = join(ck.path, run["latest"])
    names = [str(n) for n in meta.get("files") or ()]
    weights = meta.get("weights")
    shards = ck.metadata.get("shards")
    if isinstance(weights, str) and weights.endswith(".index.json") and isinstance(shards, (list, tuple)):
        names += [str(s) for s in shards]
    elif isinstance(weights, str):
        names.append(weights)
    components = meta.get("components")
    if isinstance(components, Mapping):  # a pipeline: each component's weights file
        names += [f"{c}/{v['weights']}" for c, v in components.items()
                  if isinstance(v, Mapping) and isinstance(v.get("weights"), str)]
    out = [_verdict(join(base, n), prefix + n, torch_version, per_file)
           for n in sorted(set(names)) if n.endswith((".safetensors", *_PICKLED))]
    return tuple(out)


def _verdict(full: str, shown: str, torch_version: str | None, per_file: PerFile) -> FileVerdict:
    loader = SAFETENSORS if full.endswith(".safetensors") else TORCH_LOAD
    try:
        loaded = read_file(full, ReadOptions(walk=False))
    except CkptError as exc:
        return FileVerdict(shown, loader, None, reason=f"not predicted: {exc.message}")
    try:
        if loaded.weights_only is None:
            return FileVerdict(shown, loader, None, reason="not predicted")
        loads, needs, reason, dangerous = per_file(loaded.weights_only, torch_version)
        if loaded.weights_only.container == ST_INPUT and loads:
            reason = "holds no pickle; torch 2.13's torch.load hands a *.safetensors path to safetensors"
        elif not loads and reason is None and not dangerous and needs and _RNG_STATES.search(shown) \
                and set(needs) <= NUMPY_RNG_GLOBALS:
            return FileVerdict(shown, loader, True, reason=(
                f"with the NumPy globals its library allowlists for RNG states: {', '.join(needs)}"))
        return FileVerdict(shown, loader, loads, needs, reason, dangerous)
    finally:
        for source in loaded.sources:
            source.close()


__all__ = ["NUMPY_RNG_GLOBALS", "hf_folder_files", "hf_folder_verdict"]
