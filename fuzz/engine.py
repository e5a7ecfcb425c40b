"""Byte-level mutations of real checkpoints, and the invariants ckpt must keep on them.

Shared by the bounded fuzz test in the suite (tests/formats/test_fuzz.py) and the long
run (fuzz/fuzz_readers.py). Mutations know where each format keeps its
length fields (safetensors' header length and offsets, zip records, pickle
opcode arguments, legacy storage counts) and corrupt those on purpose, since
that is where a reader can be talked into a huge allocation or a long loop.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import pickletools
import random
import re
import resource
import shutil
import struct
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

INTERESTING_32 = [0, 1, 2, 7, 8, 0x7F, 0x80, 0xFF, 0x100, 0xFFFF, 0x10000, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFE,
                  0xFFFFFFFF]
INTERESTING_64 = INTERESTING_32 + [1 << 32, 1 << 40, 1 << 62, (1 << 63) - 1, 1 << 63, (1 << 64) - 1]
INTERNAL_ERROR = re.compile(r"unexpected \w+(Error|Exception|Warning|Exit|Interrupt)\b")
# one input may not raise the process's peak memory by more (torch's first import takes ~250 MiB)
PEAK_GROWTH_MIB = 400
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


@dataclass(frozen=True)
class Field:
    """A length-like number in a file: where, how wide, and what it describes."""

    offset: int
    width: int  # 1, 2, 4 or 8 bytes, little-endian
    what: str


# ------------------------------------------------------------------ where fields are


def pickle_fields(data: bytes, base: int = 0) -> list[Field]:
    """Opcode arguments that are lengths, counts or memo indices, found with pickletools."""
    fields: list[Field] = []
    try:
        ops = list(pickletools.genops(data))
    except Exception:  # noqa: BLE001 - not a well-formed pickle: no fields to aim at
        return fields
    widths = {"BINUNICODE": 4, "BINBYTES": 4, "BINSTRING": 4, "LONG4": 4, "LONG_BINPUT": 4, "LONG_BINGET": 4,
              "BININT": 4, "BINUNICODE8": 8, "BINBYTES8": 8, "BYTEARRAY8": 8, "FRAME": 8, "SHORT_BINUNICODE": 1,
              "SHORT_BINBYTES": 1, "SHORT_BINSTRING": 1, "BINPUT": 1, "BINGET": 1, "BININT1": 1, "BININT2": 2,
              "LONG1": 1}
    for op, _arg, pos in ops:
        w = widths.get(op.name)
        if w is not None and pos is not None:
            fields.append(Field(base + pos + 1, w, f"pickle {op.name}"))
    return fields


def zip_fields(data: bytes) -> list[Field]:
    """Sizes, offsets, counts and name lengths of every zip record, and the pickles inside stored members."""
    fields: list[Field] = []
    for m in re.finditer(b"PK\x03\x04", data):
        at = m.start()
        fields += [Field(at + 18, 4, "local csize"), Field(at + 22, 4, "local usize"),
                   Field(at + 26, 2, "local name length"), Field(at + 28, 2, "local extra length")]
    for m in re.finditer(b"PK\x01\x02", data):
        at = m.start()
        fields += [Field(at + 20, 4, "central csize"), Field(at + 24, 4, "central usize"),
                   Field(at + 28, 2, "central name length"), Field(at + 30, 2, "central extra length"),
                   Field(at + 42, 4, "central header offset")]
    for m in re.finditer(b"PK\x05\x06", data):
        at = m.start()
        fields += [Field(at + 8, 2, "eocd entries"), Field(at + 10, 2, "eocd total"), Field(at + 12, 4, "eocd cd size"),
                   Field(at + 16, 4, "eocd cd offset")]
    for m in re.finditer(b"PK\x06\x06", data):
        at = m.start()
        fields += [Field(at + 32, 8, "zip64 count"), Field(at + 40, 8, "zip64 cd size"),
                   Field(at + 48, 8, "zip64 cd offset")]
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            for info in z.infolist():
                if info.filename.endswith(".pkl") and info.compress_type == zipfile.ZIP_STORED:
                    at = info.header_offset
                    nlen, xlen = struct.unpack_from("<HH", data, at + 26)
                    start = at + 30 + nlen + xlen
                    fields += pickle_fields(data[start:start + info.file_size], start)
    except (zipfile.BadZipFile, ValueError, OSError, EOFError, struct.error):
        pass  # already corrupt: the record fields above are still targets
    return fields


def safetensors_fields(data: bytes) -> list[Field]:
    fields = [Field(0, 8, "safetensors header length")]
    if len(data) >= 8:
        (n,) = struct.unpack_from("<Q", data)
        header = data[8:8 + min(n, 1 << 20)]
        # numbers in the JSON (offsets, shape dims) are text: mark them for text replacement
        for m in re.finditer(rb"\d+", header):
            fields.append(Field(8 + m.start(), -(m.end() - m.start()), "safetensors JSON number"))
    return fields


def legacy_fields(data: bytes) -> list[Field]:
    """The five pickles' opcodes and the 8-byte storage counts after them."""
    fields: list[Field] = []
    stream = io.BytesIO(data)
    for _ in range(5):
        start = stream.tell()
        try:
            for op, _arg, pos in pickletools.genops(stream):
                if op.name == "STOP":
                    break
        except Exception:  # noqa: BLE001 - corrupt already: stop looking for fields
            return fields
        fields += pickle_fields(data[start:stream.tell()], start)
    pos = stream.tell()
    while pos + 8 <= len(data):
        fields.append(Field(pos, 8, "legacy storage count"))
        (count,) = struct.unpack_from("<q", data, pos)
        if count < 0 or count > len(data):
            break
        pos += 8 + count * 4  # a guess at the element size: enough to find the next count often
        if len(fields) > 200:
            break
    return fields


def fields_of(data: bytes) -> list[Field]:
    if data[:4] == b"PK\x03\x04":
        return zip_fields(data)
    if data[:2] == b"\x80\x02" and b"\x8a\x0a\x6c\xfc\x9c\x46" in data[:16]:
        return legacy_fields(data)
    if len(data) > 9 and data[8:9] == b"{":
        return safetensors_fields(data)
    if data[:1] == b"{":
        return [Field(m.start(), -(m.end() - m.start()), "JSON number") for m in re.finditer(rb"\d+", data)]
    return pickle_fields(data)


# --------------------------------------------------------------------- mutations


def _set_field(data: bytearray, f: Field, value: int) -> None:
    if f.width < 0:  # a decimal number in text
        text = str(value).encode()
        data[f.offset:f.offset - f.width] = text
        return
    value &= (1 << (8 * f.width)) - 1
    if f.offset + f.width <= len(data):
        data[f.offset:f.offset + f.width] = value.to_bytes(f.width, "little")


def mutate(data: bytes, rng: random.Random, fields: list[Field] | None = None) -> tuple[bytes, str]:
    """One mutation of ``data``; returns the new bytes and a short description."""
    out = bytearray(data)
    kind = rng.choice(["truncate", "bitflip", "bytes", "field", "field", "field", "inflate", "splice", "stack"])
    if kind == "stack":  # two or three mutations at once
        desc = []
        cur = bytes(out)
        for _ in range(rng.randint(2, 3)):
            cur, d = mutate(cur, rng, fields)
            desc.append(d)
        return cur, " + ".join(desc)
    if not out:
        return bytes(out), "empty"
    if kind == "truncate":
        cut = rng.choice([rng.randrange(len(out)), len(out) - rng.randint(1, min(64, len(out))),
                          rng.randint(0, min(64, len(out)))])
        return bytes(out[:cut]), f"truncate at {cut}"
    if kind == "bitflip":
        n = rng.randint(1, 8)
        for _ in range(n):
            p = rng.randrange(len(out))
            out[p] ^= 1 << rng.randrange(8)
        return bytes(out), f"{n} bit flips"
    if kind == "bytes":
        n = rng.randint(1, 4)
        for _ in range(n):
            out[rng.randrange(len(out))] = rng.choice([0, 0xFF, 0x7F, 0x80, rng.randrange(256)])
        return bytes(out), f"{n} bytes set"
    if kind == "field":
        fs = fields if fields is not None else fields_of(data)
        if not fs:
            return mutate(data, rng, [])[0], "no fields: random"
        f = rng.choice(fs)
        width = abs(f.width) if f.width > 0 else 8
        pool = INTERESTING_64 if width >= 8 else INTERESTING_32
        value = rng.choice(pool + [len(data), len(data) - 1, len(data) + 1, rng.getrandbits(8 * min(width, 8))])
        _set_field(out, f, value)
        return bytes(out), f"{f.what} at {f.offset} = {value}"
    if kind == "inflate":
        return _inflate(out, rng)
    # splice: duplicate or drop a chunk
    a = rng.randrange(len(out))
    b = min(len(out), a + rng.randint(1, 256))
    if rng.random() < 0.5:
        out[a:a] = out[a:b]
        return bytes(out), f"duplicate {a}..{b}"
    del out[a:b]
    return bytes(out), f"drop {a}..{b}"


def _inflate(out: bytearray, rng: random.Random) -> tuple[bytes, str]:
    """Header inflation: headers and directories that claim (or hold) far more than they should."""
    if len(out) > 9 and out[8:9] == b"{":
        (n,) = struct.unpack_from("<Q", out)
        choice = rng.randrange(3)
        if choice == 0:  # a header padded with a lot of whitespace (valid JSON, big header)
            pad = b" " * rng.choice([1 << 10, 1 << 16, 1 << 20])
            out[8 + n:8 + n] = pad
            struct.pack_into("<Q", out, 0, n + len(pad))
            return bytes(out), f"safetensors header padded by {len(pad)}"
        if choice == 1:  # many more entries in the header, all pointing at the same bytes
            try:
                header = json.loads(bytes(out[8:8 + n]))
            except (ValueError, RecursionError):
                return bytes(out), "header already corrupt"
            first = next((k for k in header if k != "__metadata__"), None) if isinstance(header, dict) else None
            if first is None:
                return bytes(out), "no tensors to copy"
            for i in range(rng.choice([100, 10_000])):
                header[f"copy.{i}"] = header[first]
            raw = json.dumps(header).encode()
            return struct.pack("<Q", len(raw)) + raw + bytes(out[8 + n:]), "safetensors header with many aliases"
        struct.pack_into("<Q", out, 0, (n + rng.choice([1, 8, 1 << 20, 1 << 40])) & ((1 << 64) - 1))
        return bytes(out), "safetensors header length inflated"
    eocd = out.rfind(b"PK\x05\x06")
    if eocd >= 0 and eocd + 22 <= len(out):
        count = rng.choice([0xFFFE, 0xFFFF, 1000])
        struct.pack_into("<HH", out, eocd + 8, count, count)
        return bytes(out), f"zip entry count {count}"
    # a pickle: repeat a run of opcodes in the middle (deep nesting, long lists)
    a = rng.randrange(len(out))
    chunk = bytes(out[a:a + rng.randint(1, 8)]) * rng.choice([100, 10_000])
    out[a:a] = chunk
    return bytes(out), f"opcodes repeated ({len(chunk)} bytes)"


# ---------------------------------------------------------------------- running


@dataclass
class Outcome:
    code: object
    err: str
    out: str

    def problems(self, json_out: bool = False, command: str = "") -> list[str]:
        found = []
        if self.code not in (0, 1, 2):
            found.append(f"exit code {self.code!r}")
        lines = self.err.strip().splitlines()
        if command == "scan":  # scan reports one line per problem of each file
            if any(not line.startswith("ckpt: ") for line in lines):
                found.append("a stderr line that is not a ckpt message")
        elif len(lines) > 1:
            found.append(f"{len(lines)} lines on stderr")
        if CONTROL.search(self.err.replace("\n", "")):
            found.append("raw control characters on stderr")
        if "Traceback" in self.err:
            found.append("a traceback")
        if INTERNAL_ERROR.search(self.err):
            found.append("an internal error")
        if "more memory than is available" in self.err:
            found.append("a MemoryError (an allocation driven by the file)")
        if self.code == 2 and not lines:
            found.append("exit 2 without a message")
        if json_out and self.code == 0:
            try:
                json.loads(self.out)
            except ValueError:
                found.append("--json output is not one JSON document")
        return found


_STREAMS = (io.StringIO(), io.StringIO())


def run_main(args: list[str]) -> Outcome:
    """``ckpt ARGS`` in this process (fast: no interpreter start-up per input).

    The same two capture streams are reused: click caches a wrapper per stream
    object, so a fresh StringIO per run would be kept alive (and grow the
    process by ~10 KB an input over a long run).
    """
    from ckpt_tool.cli import main

    out, err = _STREAMS
    for s in _STREAMS:
        s.seek(0)
        s.truncate()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(args)
    return Outcome(code, err.getvalue(), out.getvalue())


def commands_for(target: Path, reference: Path, work: Path, rng: random.Random) -> list[list[str]]:
    """The commands one mutated input is run through (metadata paths always; data paths sometimes)."""
    cmds = [["inspect", "--json", str(target)]]
    r = rng.random()
    if r < 0.15:
        cmds.append(["inspect", "--stats", str(target)])
    elif r < 0.3:
        cmds.append(["diff", "--values", str(target), str(reference)])
    elif r < 0.45:
        out = work / rng.choice(["out.safetensors", "out.pth"])
        cmds.append(["migrate", str(target), "-o", str(out), "--force", "--device", "cpu", "-q"])
    elif r < 0.55:
        cmds.append(["scan", "--json", str(target)])
    return cmds


def leftovers(folder: Path) -> list[str]:
    """Temporary files migrate must never leave behind after it returns."""
    return sorted(p.name for p in folder.iterdir() if ".ckpt-tmp-" in p.name)


def fuzz_one(seed_path: Path, target: Path, inner: Path, original: bytes, reference: Path, work: Path,
             rng: random.Random, fields: list[Field],
             on_input: Callable[[bytes, str], None] | None = None) -> Iterator[tuple[list[str], str, Outcome, list[str]]]:
    """Mutate ``inner`` (inside ``target``), run the commands; yields (command, mutation, outcome, problems)."""
    data, desc = mutate(original, rng, fields)
    inner.write_bytes(data)
    if on_input is not None:
        on_input(data, desc)
    for cmd in commands_for(target, reference, work, rng):
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        outcome = run_main(cmd)
        found = outcome.problems(json_out="--json" in cmd, command=cmd[0])
        grew = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak) >> 10  # KiB -> MiB (Linux)
        if grew > PEAK_GROWTH_MIB:
            found.append(f"peak memory grew by {grew} MiB on one input (an allocation sized by the file?)")
        if cmd[0] == "migrate":
            left = leftovers(work)
            if left:
                found.append(f"temporary files left: {left}")
        yield cmd, desc, outcome, found
    inner.write_bytes(original)


def prepare(seed: str, fixtures: Path, work: Path) -> tuple[Path, Path, bytes]:
    """Copy one committed fixture into ``work``; returns (path to give ckpt, file to mutate, its bytes)."""
    from_fixtures = {name: (rel, inner) for name, rel, inner in SEEDS}
    rel, inner = from_fixtures[seed]
    src = fixtures / rel
    dst = work / rel
    if src.is_dir():
        if dst.exists():
            shutil.rmtree(dst)
        shutil.copytree(src, dst)
        target, file = dst, dst / inner
    else:
        shutil.copyfile(src, dst)
        target, file = dst, dst
    return target, file, file.read_bytes()


SEEDS = [  # (name, path under fixtures/, file inside a folder to mutate)
    ("torch-zip", "tiny_mlp.pth", ""),
    ("torch-zip-training", "training.pth", ""),
    ("torch-zip-whole-model", "whole_model.pth", ""),
    ("lightning", "lightning.ckpt", ""),
    ("torchscript", "torchscript.pt", ""),
    ("legacy", "legacy.pth", ""),
    ("safetensors", "tiny_mlp.safetensors", ""),
    ("pickle-numpy", "numpy_dict.pkl", ""),
    ("dill", "dill_model.dill", ""),
    ("sharded-index", "sharded", "model.safetensors.index.json"),
    ("sharded-shard", "sharded", "model-00001-of-00002.safetensors"),
    ("sharded-bin", "sharded_bin", "pytorch_model-00001-of-00002.bin"),
    ("dcp-metadata", "dcp", ".metadata"),
    ("dcp-shard", "dcp", "__0_0.distcp"),
]


def remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
