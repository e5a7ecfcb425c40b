"""Every bad input: exit code 2, one line on stderr naming the file, no traceback."""
from __future__ import annotations

import json
import os
import struct

import pytest
import torch

from tests.helpers.errors import assert_one_line_error


def write_safetensors(path, header, data=b""):
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)


def test_missing_path(run_cli, tmp_path):
    p = tmp_path / "nope.pth"
    assert_one_line_error(run_cli("inspect", str(p)), str(p), "no such file")


def test_directory_without_checkpoint(run_cli, tmp_path):
    (tmp_path / "readme.txt").write_text("hi")
    assert_one_line_error(run_cli("inspect", str(tmp_path)), "holds no checkpoint")


def test_zero_byte_file(run_cli, tmp_path):
    p = tmp_path / "empty.pth"
    p.write_bytes(b"")
    assert_one_line_error(run_cli("inspect", str(p)), "empty file")


@pytest.mark.parametrize("keep", [0.3, 0.6, 0.95])
def test_truncated_torch_zip(run_cli, tmp_path, fixtures_dir, keep):
    data = (fixtures_dir / "tiny_mlp.pth").read_bytes()
    p = tmp_path / "cut.pth"
    p.write_bytes(data[: int(len(data) * keep)])
    assert_one_line_error(run_cli("inspect", str(p)), str(p))


def test_corrupt_zip_central_directory(run_cli, tmp_path, fixtures_dir):
    data = bytearray((fixtures_dir / "tiny_mlp.pth").read_bytes())
    at = data.rfind(b"PK\x01\x02")
    data[at : at + 4] = b"XXXX"
    p = tmp_path / "bad.pth"
    p.write_bytes(bytes(data))
    assert_one_line_error(run_cli("inspect", str(p)), "corrupt")


def test_zip_that_is_not_a_torch_checkpoint(run_cli, tmp_path):
    import zipfile

    p = tmp_path / "x.pth"
    with zipfile.ZipFile(p, "w") as z:
        z.writestr("hello.txt", "hi")
    assert_one_line_error(run_cli("inspect", str(p)), "not a torch checkpoint")


def test_not_a_checkpoint(run_cli, tmp_path):
    p = tmp_path / "notes.pth"
    p.write_text("   just some text that is not a checkpoint\n")
    assert_one_line_error(run_cli("inspect", str(p)), "not a checkpoint")


def test_safetensors_header_length_past_end(run_cli, tmp_path):
    p = tmp_path / "x.safetensors"
    p.write_bytes(struct.pack("<Q", 10_000) + b'{"a": 1}')
    r = run_cli("inspect", str(p))
    assert r.code == 2 and "Traceback" not in r.err


def test_safetensors_header_claims_2_63(run_cli, tmp_path):
    p = tmp_path / "x.safetensors"
    p.write_bytes(struct.pack("<Q", 2**63) + b"{}")
    r = run_cli("inspect", str(p))
    assert r.code == 2 and "Traceback" not in r.err


def test_safetensors_invalid_json(run_cli, tmp_path):
    p = tmp_path / "x.safetensors"
    raw = b'{"a": {"dtype": "F32", '
    p.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * 16)
    assert_one_line_error(run_cli("inspect", str(p)), "invalid JSON")


def test_safetensors_offsets_out_of_range(run_cli, tmp_path):
    p = tmp_path / "x.safetensors"
    write_safetensors(p, {"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, b"\0" * 8)
    assert_one_line_error(run_cli("inspect", str(p)), "'a'")


def test_safetensors_overlapping_offsets(run_cli, tmp_path):
    p = tmp_path / "x.safetensors"
    write_safetensors(p, {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                          "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}, b"\0" * 12)
    assert_one_line_error(run_cli("inspect", str(p)), "overlaps")


def test_safetensors_dtype_shape_size_mismatch(run_cli, tmp_path):
    p = tmp_path / "x.safetensors"
    write_safetensors(p, {"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, b"\0" * 8)
    assert_one_line_error(run_cli("inspect", str(p)), "'a'")


def test_safetensors_duplicate_keys(run_cli, tmp_path):
    p = tmp_path / "x.safetensors"
    entry = b'{"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}'
    raw = b'{"a": ' + entry + b', "a": ' + entry + b"}"
    p.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * 4)
    # safetensors 0.8 reads such a header (the last entry wins), so ckpt reads it too (loader parity),
    # warns, and a strict gate fails on the warning.
    r = run_cli("inspect", str(p))
    assert r.code == 0 and "duplicate tensor keys" in r.out + r.err, r
    assert run_cli("gate", str(p), "--strict").code == 1


def test_fifo_is_refused_not_hung(run_cli, tmp_path):
    p = tmp_path / "fifo.pth"
    os.mkfifo(p)
    assert_one_line_error(run_cli("inspect", str(p)), "not a regular file")


def test_storage_member_missing(run_cli, tmp_path):
    import zipfile

    torch.save({"a": torch.zeros(3), "b": torch.ones(2)}, tmp_path / "ok.pth")
    src = zipfile.ZipFile(tmp_path / "ok.pth")
    p = tmp_path / "broken.pth"
    with zipfile.ZipFile(p, "w", compression=zipfile.ZIP_STORED) as z:
        for info in src.infolist():
            if not info.filename.endswith("data/1"):
                z.writestr(info, src.read(info))
    assert_one_line_error(run_cli("inspect", str(p)), "missing")


def test_debug_shows_traceback(run_cli, tmp_path):
    p = tmp_path / "empty.pth"
    p.write_bytes(b"")
    r = run_cli("--debug", "inspect", str(p))
    assert r.code == 2
    assert "Traceback" in r.err


def test_zip_with_wrong_classic_directory_offset_reads_like_torch(run_cli, tmp_path, fixtures_dir):
    # torch reads the zip64 end record; a wrong classic record must not hide the archive
    raw = bytearray((fixtures_dir / "tiny_mlp.pth").read_bytes())
    eocd = bytes(raw).rfind(b"PK\x05\x06")
    struct.pack_into("<L", raw, eocd + 16, 0)
    p = tmp_path / "odd.pth"
    p.write_bytes(bytes(raw))
    assert len(torch.load(p, weights_only=True)) == 7
    r = run_cli("inspect", str(p))
    assert r.code == 0, r
    assert "encoder.weight" in r.out


def test_end_record_signature_without_room_for_the_record_is_skipped_like_torch(run_cli, tmp_path, fixtures_dir):
    # miniz looks for the end record from the end of the file and passes over a signature with
    # fewer than 22 bytes after it; the reader once refused such a file ("record is cut short")
    p = tmp_path / "tail.pth"
    p.write_bytes((fixtures_dir / "tiny_mlp.pth").read_bytes() + b"PK\x05\x06" + b"\0" * 5)
    assert len(torch.load(p, weights_only=True)) == 7
    r = run_cli("inspect", str(p))
    assert r.code == 0, r
    assert "encoder.weight" in r.out


def test_storage_member_longer_than_its_storage_is_refused_as_torch_refuses_it(run_cli, tmp_path):
    import zipfile

    torch.save({"w": torch.ones(3)}, tmp_path / "ok.pth")
    with zipfile.ZipFile(tmp_path / "ok.pth") as z:
        members = [(i.filename, z.read(i.filename)) for i in z.infolist()]
    p = tmp_path / "long.pth"
    with zipfile.ZipFile(p, "w") as z:
        for n, d in members:
            z.writestr(zipfile.ZipInfo(n), d + (b"\0" * 8 if n.endswith("/data/0") else b""))
    with pytest.raises(RuntimeError, match="record size"):
        torch.load(p, weights_only=False)
    assert_one_line_error(run_cli("inspect", str(p)), "should hold 12 bytes", "has 20")
