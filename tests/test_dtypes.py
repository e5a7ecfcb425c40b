"""dtypes.py's table against the installed torch and safetensors: every dtype torch defines is in it."""
from __future__ import annotations

import io
import json
import struct

import pytest
import torch

from ckpt_tool import dtypes
from tests.helpers.dtype_samples import QUANTIZED, TORCH_DTYPES, plain_names, sample


def test_table_covers_every_dtype_torch_defines():
    """A torch upgrade that adds a dtype fails here until the table describes it."""
    assert sorted(set(TORCH_DTYPES) - set(dtypes.BY_NAME)) == []


@pytest.mark.parametrize("name", sorted(TORCH_DTYPES))
def test_itemsize_kind_and_signedness_agree_with_torch(name):
    dt, td = dtypes.BY_NAME[name], TORCH_DTYPES[name]
    assert dt.itemsize == td.itemsize
    assert dt.is_floating == td.is_floating_point
    assert (dt.kind == "complex") == td.is_complex
    if dt.kind in ("int", "uint"):
        assert td.is_signed == (dt.kind == "int")


def _torch_saves(name: str) -> bool:
    td = TORCH_DTYPES[name]
    t = torch.zeros(td.itemsize, dtype=torch.uint8).view(td) if name not in QUANTIZED else sample(name)
    try:
        torch.save(t, io.BytesIO())
    except KeyError:  # torch 2.13: "dtype torch.int1 is not recognized"
        return False
    return True


def test_the_dtypes_torch_cannot_save_are_recorded():
    """torch 2.13's torch.save raises on the sub-byte integers: the table says so, and no other."""
    refused = sorted(n for n in TORCH_DTYPES if not _torch_saves(n))
    assert refused == sorted(n for n, d in dtypes.BY_NAME.items() if not d.torch_saves)
    assert refused == sorted([f"int{n}" for n in range(1, 8)] + [f"uint{n}" for n in range(1, 8)])


@pytest.mark.parametrize("name", plain_names())
def test_safetensors_code_is_what_safetensors_writes(name):
    """The table's code is the one safetensors.torch.save writes; None where it refuses the dtype."""
    from safetensors.torch import save

    try:
        raw = save({"x": sample(name)})
    except KeyError:  # safetensors.torch has no code for it
        assert dtypes.BY_NAME[name].safetensors is None
        return
    n = struct.unpack("<Q", raw[:8])[0]
    entry = json.loads(raw[8:8 + n])["x"]
    dt = dtypes.BY_NAME[name]
    assert entry["dtype"] == dt.safetensors
    assert tuple(entry["shape"]) == dtypes.safetensors_shape(dt, tuple(sample(name).shape))
    assert dtypes.torch_shape(dt, tuple(entry["shape"])) == tuple(sample(name).shape)


def test_storage_names_are_torchs():
    from torch.storage import _dtype_to_storage_type_map

    expected = {str(d).removeprefix("torch."): s for d, s in _dtype_to_storage_type_map().items()}
    assert {n: d.storage for n, d in dtypes.BY_NAME.items() if d.storage} == expected


def test_dtypes_without_kernels_compare_as_an_integer_of_their_width():
    """Every dtype torch has no == for (bits, sub-byte integers) names a dtype of the same width that has one."""
    for name, td in TORCH_DTYPES.items():
        if name in QUANTIZED:
            continue
        x = torch.zeros(td.itemsize * 2, dtype=torch.uint8).view(td)
        try:
            x == x  # noqa: B015  (the kernel's existence is the question)
        except (NotImplementedError, RuntimeError):
            dt = dtypes.BY_NAME[name]
            assert dt.compare_as is not None, name
            assert dtypes.BY_NAME[dt.compare_as].itemsize == dt.itemsize
