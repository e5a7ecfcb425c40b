"""What a command's checkpoint argument may be: a path (or URL), or from Python a state dict or an nn.Module.

A path is read by ``formats.load`` as always (no torch). An in-memory state
dict (``Mapping[str, Tensor]``, or a container holding one) or a module (its
``state_dict()``) becomes the same ``Checkpoint`` a file would: the reader's
tree is the mapping itself, located by the same ``build`` step (``key``
selects in a container), and each torch tensor is described in place by
tensors/live.py, as for an ``--unsafe`` load. Only that branch imports torch.
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING, TypeAlias, TypeGuard

from ..errors import InputError
from ..format_names import Format
from ..formats import DEFAULT_SOURCE, SourceOptions
from ..model import Checkpoint

if TYPE_CHECKING:
    from ..tensors.data import InMemoryState

# A checkpoint argument: a path or URL, or (Python API) a state dict, a container of one, or an nn.Module.
CheckpointInput: TypeAlias = "str | os.PathLike[str] | InMemoryState"


def is_path(value: object) -> TypeGuard[str | os.PathLike[str]]:
    return isinstance(value, (str, os.PathLike))


def open_input(value: CheckpointInput, source: SourceOptions = DEFAULT_SOURCE, *,
               read_values: bool = False) -> Checkpoint:
    """``formats.read_checkpoint`` for a path; for a state dict or a module, the Checkpoint of its tensors in
    memory."""
    from ..formats import read_checkpoint

    if is_path(value):
        return read_checkpoint(os.fspath(value), source, read_values=read_values)
    from ..formats import Loaded
    from ..formats.checkpoint import build_checkpoint as build
    from ..tensors.data import in_memory_state

    found = in_memory_state(value)
    if found is None:
        raise InputError(f"a checkpoint is a path, a state dict (a mapping of str to tensors) or an nn.Module, "
                         f"not {type(value).__name__}")
    state, label = found
    return build(Loaded(Format.IN_MEMORY, state), label, source.key, source.limits)


def label_of(value: CheckpointInput, ckpt: Checkpoint) -> str:
    """How a report names the input: the path as given, or the in-memory label."""
    return os.fspath(value) if is_path(value) else ckpt.path
