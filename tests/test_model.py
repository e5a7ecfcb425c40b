"""The metadata records every layer shares: values, equality, and what readers build."""
from __future__ import annotations

import dataclasses
import json
from collections import OrderedDict

import pytest
import torch
from safetensors.torch import save_file

from ckpt_tool import load
from ckpt_tool.model import StorageRef, TensorMeta


def test_derived_values_are_computed_once_built():
    t = TensorMeta("w", "float16", (3, 4), (4, 1), 2, StorageRef(object(), "0", 64), "cpu")
    assert (t.numel, t.itemsize, t.nbytes) == (12, 2, 24)
    assert t.is_contiguous and not t.is_channels_last
    assert t.byte_span == (4, 28)
    assert t.storage_id == (id(t.storage.source), "0")
    assert TensorMeta("s", "float32", ()).numel == 1  # a 0-dim tensor holds one element
    assert TensorMeta("e", "float32", (0, 5)).nbytes == 0


def test_a_dtype_ckpt_does_not_know_has_no_byte_count():
    t = TensorMeta("q", "float4_e2m1fn_x2_unknown", (4,))
    assert t.numel == 4 and t.nbytes is None
    with pytest.raises(KeyError):
        _ = t.itemsize


def test_equality_and_hash_ignore_where_the_bytes_are():
    a = TensorMeta("w", "float32", (2, 2), None, 0, StorageRef(object(), "a", 16))
    b = TensorMeta("w", "float32", (2, 2), None, 0, StorageRef(object(), "b", 16))
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1
    assert a != TensorMeta("w", "float32", (4,))
    assert a != TensorMeta("w", "float16", (2, 2))
    assert StorageRef(object(), "k", 8) == StorageRef(object(), "k", 8)


def test_records_stay_dataclasses_with_their_fields():
    names = [f.name for f in dataclasses.fields(TensorMeta)]
    assert names[:7] == ["key", "dtype", "shape", "stride", "storage_offset", "storage", "device"]
    assert "TensorMeta(key='w', dtype='float32', shape=(2,)" in repr(TensorMeta("w", "float32", (2,)))


def test_the_same_weights_read_from_two_formats_compare_equal(tmp_path):
    sd = {"a.weight": torch.randn(3, 4), "a.bias": torch.randn(3)}
    torch.save(sd, tmp_path / "m.pth")
    save_file(sd, str(tmp_path / "m.safetensors"))
    pth, st = load(tmp_path / "m.pth"), load(tmp_path / "m.safetensors")
    # torch saves strides, safetensors none: compare what both describe
    assert {(t.key, t.dtype, t.shape, t.nbytes) for t in pth} == {(t.key, t.dtype, t.shape, t.nbytes) for t in st}


class _BoolDims:
    """Pickles as a tensor whose size holds a bool, as a hand-made file could."""

    def __init__(self, storage: torch.TypedStorage) -> None:
        self.storage = storage

    def __reduce_ex__(self, protocol: int):
        return (torch._utils._rebuild_tensor_v2, (self.storage, 0, (True, 4), (4, 1), False, OrderedDict()))


@pytest.mark.parametrize("odd_first", [True, False])
def test_bool_dimensions_read_as_ints_whatever_came_before(tmp_path, odd_first, run_cli):
    odd = _BoolDims(torch.arange(4, dtype=torch.uint8)._typed_storage())
    plain = torch.zeros(1, 4, dtype=torch.uint8)
    sd = {"odd": odd, "plain": plain} if odd_first else {"plain": plain, "odd": odd}
    path = tmp_path / "bools.pth"
    torch.save(sd, path)
    shapes = {t.key: t.shape for t in load(path)}
    assert shapes == {"odd": (1, 4), "plain": (1, 4)}
    assert all(type(d) is int for d in shapes["odd"])
    result = run_cli("inspect", str(path), "--json")
    assert result.code == 0, result.err
    assert {t["key"]: t["shape"] for t in json.loads(result.out)["tensors"]}["odd"] == [1, 4]
