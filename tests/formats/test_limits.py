"""Every safety limit: enforced in every format, one clear line naming the option, raisable.

Also the regression tests for hostile length fields and self-sharing pickles
found while fuzzing (each named after its case): none of them may make ckpt
allocate in proportion to a number written in the file, nor run for long.
"""
from __future__ import annotations

import io
import os
import pickle
import struct
import zipfile

import pytest
import torch
from safetensors.torch import save_file

from tests.helpers.errors import assert_one_line_error
from tests.helpers.reliability import problems, run_ckpt, run_main

COMMANDS_WITH_LIMITS = ["inspect", "diff", "migrate", "gate", "scan"]
LIMIT_OPTIONS = ["--max-header-bytes", "--max-pickle-bytes", "--max-tensors", "--max-key-length",
                 "--max-member-bytes"]


def _sd(n: int = 5, key: str = "layer.{}.weight") -> dict[str, torch.Tensor]:
    return {key.format(i): torch.full((2, 3), float(i)) for i in range(n)}


def _write(tmp_path, fmt: str, sd: dict[str, torch.Tensor]) -> str:
    if fmt == "torch-zip":
        p = tmp_path / "m.pth"
        torch.save(sd, p)
    elif fmt == "legacy":
        p = tmp_path / "m.pth"
        torch.save(sd, p, _use_new_zipfile_serialization=False)
    elif fmt == "safetensors":
        p = tmp_path / "m.safetensors"
        save_file(sd, p)
    elif fmt == "pickle":
        p = tmp_path / "m.pkl"
        with open(p, "wb") as f:
            pickle.dump({k: v.numpy() for k, v in sd.items()}, f, protocol=4)
    else:
        raise AssertionError(fmt)
    return str(p)


FORMATS = ["torch-zip", "legacy", "safetensors", "pickle"]


# ----------------------------------------------------------------- the options


@pytest.mark.parametrize("command", COMMANDS_WITH_LIMITS)
def test_every_command_offers_every_limit_option(command):
    r = run_main([command, "--help"])
    assert r.code == 0, r
    for option in LIMIT_OPTIONS:
        assert option in r.out, (command, option)


def test_limit_of_zero_is_a_usage_error(tmp_path):
    p = _write(tmp_path, "safetensors", _sd())
    r = run_main(["inspect", "--max-tensors", "0", p])
    assert r.code == 2 and "--max-tensors" in r.err and "Traceback" not in r.err, r  # click's usage format


# ------------------------------------------------------------- tensor count


@pytest.mark.parametrize("fmt", FORMATS)
def test_max_tensors_enforced_in_every_format(tmp_path, fmt):
    p = _write(tmp_path, fmt, _sd(5))
    assert_one_line_error(run_main(["inspect", "--max-tensors", "3", p]), p, "--max-tensors", "over the limit of 3")
    assert run_main(["inspect", "--max-tensors", "5", p]).code == 0


def test_max_tensors_enforced_for_sharded_sets(tmp_path, fixtures_dir):
    folder = str(fixtures_dir / "sharded")
    assert_one_line_error(run_main(["inspect", "--max-tensors", "1", folder]), "--max-tensors")
    assert run_main(["inspect", folder]).code == 0


def test_max_tensors_enforced_by_migrate_and_diff(tmp_path):
    p = _write(tmp_path, "torch-zip", _sd(5))
    out = tmp_path / "out.safetensors"
    assert_one_line_error(run_main(["migrate", p, "-o", str(out), "--max-tensors", "2"]), "--max-tensors")
    assert not out.exists()
    assert_one_line_error(run_main(["diff", p, p, "--max-tensors", "2"]), "--max-tensors")


# ------------------------------------------------------------------ key length


@pytest.mark.parametrize("fmt", FORMATS)
def test_max_key_length_enforced_in_every_format(tmp_path, fmt):
    long_key = "blocks." + "x" * 300 + ".{}"
    p = _write(tmp_path, fmt, _sd(2, long_key))
    assert_one_line_error(run_main(["inspect", "--max-key-length", "100", p]), p, "--max-key-length")
    r = run_main(["inspect", "--json", p])
    assert r.code == 0 and long_key.format(0) in r.out


# ------------------------------------------------------------- header and pickle bytes


def test_safetensors_header_over_max_header_bytes(tmp_path):
    p = _write(tmp_path, "safetensors", _sd(3))
    assert_one_line_error(run_main(["inspect", "--max-header-bytes", "32", p]), "--max-header-bytes")
    assert run_main(["inspect", "--max-header-bytes", "100000", p]).code == 0


def test_safetensors_header_claims_2_63_bytes(tmp_path):
    p = tmp_path / "x.safetensors"
    p.write_bytes(struct.pack("<Q", 2 ** 63) + b"{}")
    assert_one_line_error(run_main(["inspect", str(p)]), str(p), "truncated safetensors file")


def test_shard_index_over_max_header_bytes(tmp_path, fixtures_dir):
    folder = str(fixtures_dir / "sharded")
    assert_one_line_error(run_main(["inspect", "--max-header-bytes", "64", folder]), "shard index",
                          "--max-header-bytes")


@pytest.mark.parametrize("fmt", ["torch-zip", "legacy", "pickle"])
def test_pickle_over_max_pickle_bytes(tmp_path, fmt):
    p = _write(tmp_path, fmt, _sd(3))
    assert_one_line_error(run_main(["inspect", "--max-pickle-bytes", "40", p]), p, "--max-pickle-bytes")
    assert run_main(["inspect", "--max-pickle-bytes", "1000000", p]).code == 0


def test_dcp_metadata_over_max_pickle_bytes(fixtures_dir):
    folder = str(fixtures_dir / "dcp")
    assert_one_line_error(run_main(["inspect", "--max-pickle-bytes", "100", folder]), "--max-pickle-bytes")


# --------------------------------------------------------------- zip members


def _deflated_copy(src: str, dst: str, declared: dict[str, int] | None = None) -> None:
    """Rewrite a torch zip with data.pkl deflated (torch reads that too); optionally lie about sizes."""
    raw = io.BytesIO()
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(raw, "w") as zout:
        for info in zin.infolist():
            method = zipfile.ZIP_DEFLATED if info.filename.endswith("data.pkl") else zipfile.ZIP_STORED
            zout.writestr(zipfile.ZipInfo(info.filename), zin.read(info), compress_type=method)
    data = bytearray(raw.getvalue())
    for name, size in (declared or {}).items():
        at = data.find(b"PK\x01\x02")
        while at >= 0:
            nlen = struct.unpack_from("<H", data, at + 28)[0]
            if data[at + 46: at + 46 + nlen].decode().endswith(name):
                struct.pack_into("<L", data, at + 24, size)  # uncompressed size in the central directory
            at = data.find(b"PK\x01\x02", at + 1)
    with open(dst, "wb") as f:
        f.write(bytes(data))


def test_deflated_member_over_max_member_bytes(tmp_path):
    src = _write(tmp_path, "torch-zip", _sd(3))
    p = str(tmp_path / "deflated.pth")
    _deflated_copy(src, p)
    assert torch.load(p, weights_only=True)["layer.2.weight"][0, 0] == 2  # torch reads it
    assert run_main(["inspect", p]).code == 0
    assert_one_line_error(run_main(["inspect", "--max-member-bytes", "50", p]), "data.pkl", "--max-member-bytes")


def test_zip_member_inflates_past_its_declared_size(tmp_path):
    src = _write(tmp_path, "torch-zip", _sd(3))
    p = str(tmp_path / "bomb.pth")
    _deflated_copy(src, p, declared={"data.pkl": 20})
    assert_one_line_error(run_main(["inspect", p]), "inflates past the 20 bytes it declares")


def test_zip_member_claims_terabytes(tmp_path):
    src = _write(tmp_path, "torch-zip", _sd(3))
    p = str(tmp_path / "tera.pth")
    _deflated_copy(src, p, declared={"data.pkl": 0xFFFFFFF0})
    assert_one_line_error(run_main(["inspect", p]), "data.pkl", "over the limit")


# -------------------------------------------------- hostile numbers inside pickles
# Each of these would make CPython's C unpickler (or ckpt's own walks) allocate
# memory or time in proportion to a number in the file; pickle_guard and the
# restricted unpickler refuse them first, with their own message.


def _pickle_file(tmp_path, data: bytes, name: str = "x.pkl") -> str:
    p = tmp_path / name
    p.write_bytes(data)
    return str(p)


def test_pickle_long_binput_memo_index_2_28(tmp_path):
    # LONG_BINPUT 2**28: the C unpickler would allocate and zero a 4 GiB memo
    p = _pickle_file(tmp_path, b"\x80\x02N" + b"r" + struct.pack("<I", 1 << 28) + b".")
    assert_one_line_error(run_main(["inspect", p]), p, "memo index 268435456")


def test_pickle_text_put_memo_index_with_underscores(tmp_path):
    # PUT takes a decimal index, and int() accepts underscores: still refused
    p = _pickle_file(tmp_path, b"N" + b"p1_000_000_000\n" + b".")
    assert_one_line_error(run_main(["inspect", p]), p, "memo index 1000000000")


@pytest.mark.parametrize("opcode,name", [(b"\x8e", "binbytes8"), (b"\x96", "bytearray8"), (b"\x8d", "binunicode8")])
def test_pickle_counted_bytes_claims_2_62(tmp_path, opcode, name):
    p = _pickle_file(tmp_path, b"\x80\x05" + opcode + struct.pack("<Q", 1 << 62) + b"abc.")
    r = run_main(["inspect", p])
    assert_one_line_error(r, p, "truncated")
    assert "memory" not in r.err  # refused before anything was allocated


def test_pickle_binbytes_claims_4_gib(tmp_path):
    p = _pickle_file(tmp_path, b"\x80\x03B" + struct.pack("<I", 0xFFFFFFF0) + b"abc.")
    assert_one_line_error(run_main(["inspect", p]), "truncated")


def test_pickle_frame_claims_2_40(tmp_path):
    p = _pickle_file(tmp_path, b"\x80\x04\x95" + struct.pack("<Q", 1 << 40) + b"N.")
    assert_one_line_error(run_main(["inspect", p]), "truncated")


def test_legacy_main_pickle_string_length_claims_2_62(tmp_path):
    # the legacy reader streams its pickles: the stream path is guarded too
    p = _write(tmp_path, "legacy", _sd(2))
    with open(p, "rb") as f:
        data = bytearray(f.read())
    at = data.find(b"X", 40)  # a BINUNICODE in the main pickle
    data[at: at + 5] = b"\x8d" + b"\x00\x00\x00\x00"  # becomes BINUNICODE8 ...
    data[at + 5: at + 5] = struct.pack("<Q", 1 << 62)[4:]  # ... claiming 2**62 bytes
    with open(p, "wb") as f:
        f.write(bytes(data))
    r = run_main(["inspect", p])
    assert r.code == 2 and not problems(r) and "memory" not in r.err, r


def test_pickle_list_of_range_billion(tmp_path):
    # list(range(10**9)) is 30 bytes of pickle: a range stays an inert record
    p = _pickle_file(tmp_path, b"\x80\x04cbuiltins\nlist\ncbuiltins\nrange\nJ\x00\xca\x9a\x3b\x85R\x85R.")
    assert_one_line_error(run_main(["inspect", p]), p, "'range' object is not iterable")


def test_pickle_torch_size_of_range(tmp_path):
    p = _pickle_file(tmp_path, b"\x80\x04ctorch\nSize\ncbuiltins\nrange\nJ\x00\xca\x9a\x3b\x85R\x85R.")
    assert_one_line_error(run_main(["inspect", p]), p)


@pytest.mark.parametrize("name", ["bytes", "bytearray"])
def test_pickle_bytes_of_an_int(tmp_path, name):
    # bytes(2**40) / bytearray(2**40) would allocate (and zero) a terabyte
    p = _pickle_file(tmp_path, b"\x80\x04cbuiltins\n" + name.encode() + b"\n\x8a\x06\x00\x00\x00\x00\x00\x01\x85R.")
    assert_one_line_error(run_main(["inspect", p]), p, f"{name}() called on int")


def test_pickle_str_of_shared_lists(tmp_path):
    # str() of 60 levels of [x, x]: 2**60 characters of text from a few hundred bytes
    inner: list = [7]
    for _ in range(60):
        inner = [inner, inner]
    body = pickle.dumps(inner, protocol=2)[2:-1]  # without PROTO and STOP
    p = _pickle_file(tmp_path, b"\x80\x02cbuiltins\nstr\n" + body + b"\x85R.")
    assert_one_line_error(run_main(["inspect", p], seconds=60), p, "str() called on list")


def test_shared_lists_of_tensors_do_not_explode(tmp_path):
    # a 2 KB file: 50**8 paths to one tensor if every shared list were flattened
    t = torch.zeros(1)
    tree: object = t
    for _ in range(8):
        tree = [tree] * 50
    p = str(tmp_path / "dag.pth")
    torch.save({"tree": tree, "w": torch.ones(2)}, p)
    r = run_main(["inspect", "--json", p], seconds=60)
    assert r.code == 0 and not problems(r), r


def test_metadata_of_shared_lists_renders_quickly(tmp_path):
    # 2000**12 values to show if the shared lists were rendered whole
    meta: object = 7
    for _ in range(12):
        meta = [meta] * 2000
    p = str(tmp_path / "meta.pth")
    torch.save({"w": torch.ones(2), "meta": meta}, p)
    r = run_main(["inspect", "--json", p], seconds=60)
    assert r.code == 0 and not problems(r), r


def test_modules_sharing_submodules_exponentially(tmp_path):
    # 2**40 state_dict entries: torch's own state_dict() would never finish either
    import sys
    import types

    mod = types.ModuleType("ckpt_test_dag_models")
    sys.modules[mod.__name__] = mod
    try:
        class M:
            pass

        M.__module__ = mod.__name__
        M.__qualname__ = "M"
        mod.M = M

        def make(params, children):
            m = M.__new__(M)
            m.__dict__.update(_parameters=params, _buffers={}, _modules=children, training=True)
            return m

        cur = make({"w": torch.nn.Parameter(torch.zeros(1))}, {})
        for _ in range(40):
            cur = make({}, {"a": cur, "b": cur})
        p = str(tmp_path / "dag_module.pth")
        torch.save(cur, p)
    finally:
        del sys.modules[mod.__name__]
    assert_one_line_error(run_main(["inspect", p], seconds=60), p, "reuse each other")


def test_safetensors_header_nested_100000_deep(tmp_path):
    h = b'{"a":' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    p = tmp_path / "deep.safetensors"
    p.write_bytes(struct.pack("<Q", len(h)) + h)
    assert_one_line_error(run_main(["inspect", str(p)]), str(p), "invalid JSON")


def test_shard_index_that_is_a_fifo_is_refused_not_hung(tmp_path, fixtures_dir):
    folder = tmp_path / "set"
    folder.mkdir()
    os.mkfifo(folder / "model.safetensors.index.json")
    assert_one_line_error(run_main(["inspect", str(folder)], seconds=30), "not a regular file")


def test_dcp_metadata_claims_a_huge_tensor(tmp_path, fixtures_dir):
    """A .metadata whose chunks claim 2**40 elements: refused before a tensor buffer is allocated."""
    import shutil

    from ckpt_tool import dtypes
    from ckpt_tool.errors import InputError
    from ckpt_tool.formats.dcp.stream import Chunk, DcpStreamSource
    from ckpt_tool.limits import DEFAULT_LIMITS

    folder = tmp_path / "dcp"
    shutil.copytree(fixtures_dir / "dcp", folder)
    source = DcpStreamSource(str(folder), DEFAULT_LIMITS)
    # split along the second dimension (tensor parallel), so the tensor is assembled, not streamed
    rows, half = 2, 1 << 38
    shape = (rows, 2 * half)
    chunks = [Chunk((0, 0), (rows, half), "__0_0.distcp", 0, 64),
              Chunk((0, half), (rows, half), "__0_0.distcp", 64, 64)]
    source.add("w", dtypes.BY_NAME["float32"], shape, chunks)
    with pytest.raises(InputError, match="fewer than"):
        source.read("w", 0, 16)
    # lengths that claim enough bytes, but bytes the shard file does not have
    claim = 4 * rows * half
    big = [Chunk((0, 0), (rows, half), "__0_0.distcp", 0, claim),
           Chunk((0, half), (rows, half), "__0_0.distcp", 0, claim)]
    source.add("v", dtypes.BY_NAME["float32"], shape, big)
    with pytest.raises(InputError, match="past the end"):
        source.read("v", 0, 16)
    source.close()


def test_many_limits_from_a_subprocess_stay_one_line(tmp_path):
    """The same refusal from a fresh interpreter: nothing else is printed."""
    p = _pickle_file(tmp_path, b"\x80\x02N" + b"r" + struct.pack("<I", 0xFFFFFFF0) + b".")
    r = run_ckpt(["inspect", p], timeout=120)
    assert_one_line_error(r, "memo index")


@pytest.mark.parametrize("protocol", [0, 2, 4])
def test_pickle_guard_accepts_a_pickle_with_200000_memo_entries(protocol):
    """Legitimate memo indices past 65,536 (LONG_BINPUT, PUT) are in proportion and accepted."""
    from ckpt_tool.pickles.unpickle import guard as pickle_guard

    data = pickle.dumps([f"k{i}" for i in range(200_000)], protocol=protocol)
    assert pickle_guard.check_bytes(data, where="p", path="p") == len(data)


def test_metadata_nested_900_deep_to_a_torch_output(tmp_path):
    # a pickle's metadata nested 900 lists deep: the pure-Python pickler that writes data.pkl
    # ran out of stack ("unexpected RecursionError"); now one clear error and nothing written
    import numpy as np

    arr = pickle.dumps(np.zeros(2, dtype=np.float32), protocol=2)[2:-1]
    deep = b"]" * 900 + b"a" * 899
    p = _pickle_file(tmp_path, b"\x80\x02}" + b"X\x01\x00\x00\x00w" + arr + b"s"
                     + b"X\x04\x00\x00\x00meta" + deep + b"s.")
    out = tmp_path / "out.pth"
    assert_one_line_error(run_main(["migrate", p, "-o", str(out), "--device", "cpu"]), "nested too deeply")
    assert not out.exists() and not [n for n in os.listdir(tmp_path) if ".ckpt-tmp-" in n]
    assert run_main(["migrate", p, "-o", str(tmp_path / "out.safetensors"), "--device", "cpu"]).code == 0


def test_running_out_of_memory_is_one_line_not_an_internal_error():
    # found by the long fuzz run: a process at its memory limit printed "unexpected MemoryError ... bug"
    import subprocess
    import sys

    from tests.helpers.reliability import ROOT

    code = ("import importlib, sys; from ckpt_tool.cli import main\n"
            "def load(*a, **k): raise MemoryError()\n"
            "importlib.import_module('ckpt_tool.formats'); sys.modules['ckpt_tool.formats'].read_checkpoint = load\n"
            "sys.exit(main(['inspect', sys.argv[1]]))")
    r = subprocess.run([sys.executable, "-c", code, str(ROOT / "fixtures" / "tiny_mlp.pth")], capture_output=True,
                       text=True, timeout=120, check=False, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 2 and r.stderr.strip() == \
        "ckpt: error: out of memory (the machine, or a ulimit -v, gave no more)", r


def test_many_distinct_globals_do_not_grow_the_process_forever(tmp_path):
    # found by the long fuzz run: every global name a file invents became a class kept for the
    # life of the process (a worker grew to 2.6 GB after 500,000 inputs)
    from ckpt_tool.pickles.unpickle import placeholders as unpickle

    body = b"".join(b"cm%d\nC%d\n" % (i, i) for i in range(25_000))
    p = _pickle_file(tmp_path, b"\x80\x02(" + body + b"l.")
    r = run_main(["inspect", p])
    assert r.code == 0 and not problems(r), r
    assert len(unpickle._PLACEHOLDER_CLASSES) <= unpickle.MAX_CACHED_PLACEHOLDER_CLASSES


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads the peak from /proc")
def test_pickle_chained_calls_on_a_placeholder(tmp_path):
    # found by the long fuzz run: import_module('os')('os')('os')... 10,000 times (80 KB) named each
    # result's class after the whole chain, so memory grew quadratically (836 MB peak)
    import subprocess
    import sys

    from tests.helpers.reliability import ROOT

    body = b"\x80\x04\x8c\timportlib\x94\x8c\rimport_module\x94\x93\x94" + b"\x8c\x02os\x94\x85\x94R" * 10_000
    p = _pickle_file(tmp_path, body + b".")
    # VmHWM: the child's own peak (ru_maxrss would include the pytest parent it was forked from)
    code = ("import sys; from ckpt_tool.cli import main; c = main(['inspect', '--json', sys.argv[1]]); "
            "print([int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmHWM')][0]); "
            "sys.exit(c)")
    r = subprocess.run([sys.executable, "-c", code, p], capture_output=True, text=True, timeout=120, check=False,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0 and not r.stderr.strip(), r.stderr
    peak_kib = int(r.stdout.strip().splitlines()[-1])
    assert peak_kib < 200 * 1024, peak_kib  # ~20 MB now
