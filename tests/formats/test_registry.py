"""The reader registry (formats/registry.py): one line per input format, each imported only when its input needs it."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import FIXTURES, ROOT

from ckpt_tool.errors import UnsupportedFormat
from ckpt_tool.format_names import Format
from ckpt_tool.formats import Reader, reader_for
from ckpt_tool.formats.registry import READERS

# Formats detect.py never returns: the readers of TORCH_ZIP and PICKLE tell TorchScript and dill apart,
# and an in-memory state dict is no file.
NOT_DETECTED = {Format.TORCHSCRIPT, Format.DILL, Format.IN_MEMORY}


def test_every_detected_format_has_one_reader() -> None:
    assert set(READERS) == set(Format) - NOT_DETECTED


@pytest.mark.parametrize("fmt", sorted(READERS, key=str))
def test_each_line_names_the_reader_of_its_format(fmt: Format) -> None:
    reader: Reader = reader_for(fmt)
    assert reader.format == fmt
    assert isinstance(reader.unsafe_load, bool) and isinstance(reader.composite, bool)
    assert callable(reader.read) and callable(reader.weights_only)


def test_only_torch_save_files_are_read_with_torch_load_under_unsafe() -> None:
    unsafe = {fmt for fmt in READERS if reader_for(fmt).unsafe_load}
    assert unsafe == {Format.TORCH_ZIP, Format.TORCH_LEGACY, Format.PICKLE, Format.TORCH_TAR}


def test_a_format_without_a_reader_is_refused_with_a_message() -> None:
    with pytest.raises(UnsupportedFormat, match="no reader for the format torchscript"):
        reader_for(Format.TORCHSCRIPT)


def _formats_modules_after_reading(path: str) -> list[str]:
    code = ("import json, sys; from ckpt_tool.formats import ReadOptions, read_file; "
            f"read_file({path!r}, ReadOptions()); "
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith('ckpt_tool.formats.'))))")
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120,
                         check=True)
    return list(json.loads(out.stdout))


def test_reading_safetensors_imports_no_other_reader() -> None:
    mods = _formats_modules_after_reading(str(FIXTURES / "tiny_mlp.safetensors"))
    assert "ckpt_tool.formats.safetensors.header" in mods
    others = [m for m in mods if m.startswith(("ckpt_tool.formats.torchsave", "ckpt_tool.formats.dcp",
                                               "ckpt_tool.formats.deepspeed", "ckpt_tool.formats.megatron",
                                               "ckpt_tool.formats.numpy", "ckpt_tool.formats.ranks",
                                               "ckpt_tool.formats.tp"))]
    assert others == []


def test_reading_a_torch_zip_imports_no_folder_reader() -> None:
    mods = _formats_modules_after_reading(str(FIXTURES / "tiny_mlp.pth"))
    assert "ckpt_tool.formats.torchsave.archive" in mods
    assert [m for m in mods if m.startswith(("ckpt_tool.formats.dcp", "ckpt_tool.formats.deepspeed",
                                             "ckpt_tool.formats.megatron", "ckpt_tool.formats.hf"))] == []


def test_detecting_a_folder_imports_only_the_megatron_module_it_asks() -> None:
    """detect.py asks formats.megatron whether a folder is a legacy one: the torch_dist reader stays unimported."""
    mods = _formats_modules_after_reading(str(FIXTURES / "ranks" / "verl"))
    assert "ckpt_tool.formats.megatron.legacy_folder" in mods
    assert "ckpt_tool.formats.megatron.torch_dist" not in mods
    assert "ckpt_tool.formats.dcp.metadata" not in mods and "ckpt_tool.formats.deepspeed.read" not in mods


# ------------------------------------------------------------------ Loaded is frozen once its reader returns


@pytest.mark.parametrize("name", ["tiny_mlp.safetensors", "tiny_mlp.pth", "legacy.pth", "sharded", "dcp",
                                  "torchscript.pt", "deepspeed/zero3_bf16", "megatron/dense",
                                  "dist_safetensors/run", "whole_model.pth",
                                  "ranks/verl", "ranks/fsdp1"])
def test_a_reader_returns_a_frozen_result(name: str) -> None:
    import dataclasses

    from ckpt_tool.formats import ReadOptions, read_file

    loaded = read_file(str(FIXTURES / name), ReadOptions())
    try:
        for field in ("references", "warnings", "sources"):
            assert type(getattr(loaded, field)) is tuple, field
        assert loaded.tensors is None or type(loaded.tensors) is tuple
        with pytest.raises(dataclasses.FrozenInstanceError):
            loaded.warnings = ()  # type: ignore[misc]
    finally:
        for s in loaded.sources:
            s.close()


def test_unstacking_returns_a_new_result_and_leaves_the_read_one_as_it_was() -> None:
    from ckpt_tool.formats import ReadOptions, read_file
    from ckpt_tool.formats.megatron import unstack

    path = str(FIXTURES / "megatron" / "dense")
    loaded = read_file(path, ReadOptions())
    try:
        before = (dict(loaded.metadata["megatron"]), loaded.warnings, list(loaded.root))
        out = unstack(loaded, path)
        assert (dict(loaded.metadata["megatron"]), loaded.warnings, list(loaded.root)) == before
        assert out.metadata["megatron"]["unstacked"] is True and "unstacked" not in loaded.metadata["megatron"]
        assert not any("--unstack-layers" in w for w in out.warnings)
        assert any("--unstack-layers" in w for w in loaded.warnings)
        assert len(out.root) > len(loaded.root)
    finally:
        for s in loaded.sources:
            s.close()


def test_hints_go_first_in_a_new_result(tmp_path) -> None:
    """read_file's extension warning is put before the reader's own warnings, on a new value."""
    import shutil

    from ckpt_tool.formats import ReadOptions, read_file

    odd = tmp_path / "model.safetensors"
    shutil.copy(FIXTURES / "legacy.pth", odd)
    loaded = read_file(str(odd), ReadOptions())
    try:
        assert loaded.warnings[0].startswith("the extension .safetensors suggests safetensors but the bytes are")
    finally:
        for s in loaded.sources:
            s.close()
