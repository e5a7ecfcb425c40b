"""The rest of the corpus: safetensors headers, legacy/tar, quantized, folders, metadata, controls."""
from __future__ import annotations

import argparse
import collections
import datetime
import os
import pathlib
from typing import TYPE_CHECKING

from . import builders as b
from .trainer_types import Color, TrainerState

if TYPE_CHECKING:
    from .generate import Corpus


def add_more(c: Corpus) -> None:
    _safetensors(c)
    _legacy_tar(c)
    _quantized(c)
    _metadata(c)
    _controls(c)
    _folders(c)


# ------------------------------------------------------------------ safetensors


def _safetensors(c: Corpus) -> None:
    w = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}
    data = b.f32(1.0, 2.0)

    def add(name: str, header, payload: bytes = data, note: str = "", **kw) -> None:
        c.add(name, "safetensors-header", b.safetensors_bytes(header, payload, **kw), note, ext=".safetensors")

    add("st_clean", {"w": w, "__metadata__": {"format": "pt"}}, note="clean control")
    add("st_lone_surrogate_key", '{"\\ud800":' + '{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}',
        note="key is a lone surrogate written as a JSON escape (Python json accepts it, serde refuses)")
    add("st_lone_surrogate_metadata", '{"__metadata__":{"k":"\\udfff"},"w":'
        + '{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}', note="lone surrogate in a metadata value")
    add("st_duplicate_keys", '{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},'
        '"w":{"dtype":"I32","shape":[2],"data_offsets":[0,8]}}',
        note="the same key twice, both covering the data (safetensors 0.8: last wins)")
    add("st_offsets_past_end", {"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}},
        note="data_offsets end beyond the data")
    add("st_offsets_shape_mismatch", {"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}},
        note="3 floats declared, 8 bytes given")
    add("st_overlapping", {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                           "b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}, note="ranges overlap")
    add("st_gap", {"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}, note="the first 4 bytes are unused")
    add("st_trailing_bytes", {"w": w}, data + b"\0" * 8, note="8 bytes after the last tensor")
    add("st_header_past_eof", {"w": w}, length=10_000, note="header length points past the end of the file")
    add("st_header_len_huge", {"w": w}, length=2**63 + 5, note="header length near 2**64")
    add("st_non_utf8", b'{"w\xff\xfe":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}', note="non-UTF-8 key bytes")
    add("st_not_object", b"[1, 2, 3]", note="header is a JSON list")
    add("st_unknown_dtype", {"w": {"dtype": "F9", "shape": [2], "data_offsets": [0, 8]}}, note="dtype F9")
    add("st_negative_offset", {"w": {"dtype": "F32", "shape": [2], "data_offsets": [-8, 0]}},
        note="negative offset")
    add("st_float_offset", '{"w":{"dtype":"F32","shape":[2],"data_offsets":[0.0,8.0]}}', note="float offsets")
    add("st_nan_literal", '{"__metadata__":{"k":"v"},"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8],'
        '"x":NaN}}', note="NaN literal (Python json accepts it)")
    add("st_metadata_not_strings", {"__metadata__": {"epoch": 3}, "w": w}, note="__metadata__ value is a number")
    add("st_extra_field", {"w": {**w, "extra": 1}}, note="unknown field in a tensor entry")
    add("st_only_metadata", {"__metadata__": {"a": "b"}}, b"", note="no tensors (valid, empty)")
    add("st_empty_object", {}, b"", note="header {} and no data")
    add("st_zero_size_tensor", {"e": {"dtype": "F32", "shape": [0, 3], "data_offsets": [0, 0]}, "w":
                                {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, note="zero-size tensor")
    add("st_bf16_fp8_bool", {"a": {"dtype": "BF16", "shape": [2], "data_offsets": [0, 4]},
                             "b": {"dtype": "F8_E4M3", "shape": [2], "data_offsets": [4, 6]},
                             "c": {"dtype": "BOOL", "shape": [2], "data_offsets": [6, 8]}},
        b"\x80\x3f\x00\x40\x38\x40\x01\x00", note="BF16, F8_E4M3 and BOOL")
    add("st_leading_spaces", b'   {"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}', pad=True,
        note="spaces before the JSON object")
    add("st_bom", b'\xef\xbb\xbf{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}', note="UTF-8 BOM")
    add("st_nul_in_key", '{"w\\u0000x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}', note="NUL in a key")
    add("st_big_int", '{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,184467440737095516160]}}',
        note="offset beyond u64")
    add("st_duplicate_metadata", '{"__metadata__":{"a":"1"},"__metadata__":{"a":"2"},'
        '"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}', note="__metadata__ twice")
    c.add("st_tiny_file", "safetensors-header", b"\x08\x00\x00", "3 bytes", ext=".safetensors")
    c.add("st_empty_file", "safetensors-header", b"", "0 bytes named .safetensors", ext=".safetensors")
    c.add("st_named_pth", "safetensors-header", b.safetensors_bytes({"w": w}, data),
          "clean safetensors named .pth (torch.load routes only .safetensors to safetensors)", ext=".pth")
    c.add("pickle_named_safetensors", "safetensors-header",
          b.dumps(b.Reduce(os.system, c.touch("pickle_named_safetensors"))),
          "a posix.system pickle named .safetensors (torch.load routes it to safetensors)", ext=".safetensors",
          payload=True, calls=("posix.system", "os.system"), flag=("posix.system", "os.system"))


# ------------------------------------------------------------------ legacy and tar


def _legacy_tar(c: Corpus) -> None:
    from .generate import state_dict

    sd = state_dict()
    legacy = b.tsave(sd, _use_new_zipfile_serialization=False)
    c.add("legacy_clean", "legacy/tar", legacy, "legacy (pre-zip) torch.save")
    c.add("legacy_payload", "legacy/tar",
          b.tsave({**sd, "x": b.Reduce(os.system, c.touch("legacy_payload"))}, _use_new_zipfile_serialization=False),
          "posix.system in the main pickle of a legacy file", payload=True, calls=("posix.system", "os.system"))
    c.add("legacy_truncated", "legacy/tar", legacy[: len(legacy) // 2], "legacy file cut in half")
    c.add("legacy_storage_missing", "legacy/tar", legacy[:-8], "last 8 bytes of the storage data missing")
    spans = _legacy_spans(legacy)
    c.add("legacy_bad_magic", "legacy/tar", b.dumps(12345) + legacy[spans[0]:], "wrong magic number")
    c.add("legacy_magic_only", "legacy/tar", b.dumps(0x1950A86A20F9469CFC6C, protocol=2),
          "the magic number and nothing else")
    c.add("legacy_payload_in_sys_info", "legacy/tar",
          legacy[: spans[1]] + b.dumps(b.Reduce(os.system, c.touch("legacy_payload_in_sys_info")))
          + legacy[spans[2]:],
          "posix.system as the sys_info pickle (the third of the legacy stream)", payload=True,
          calls=("posix.system", "os.system"))
    tensors = {"fc.weight": [0.5, -1.0, 2.0], "fc.bias": [0.0, 1.0]}
    c.add("tar_clean", "legacy/tar", b.legacy_tar(tensors), "torch 0.1 tar format, built by hand")
    evil_main = b.dumps({"x": b.Reduce(os.system, c.touch("tar_payload_pickle"))})
    c.add("tar_payload_pickle", "legacy/tar", b.legacy_tar(tensors, pickle_member=evil_main),
          "tar format, posix.system in the 'pickle' member (CVE-2025-32434: torch <= 2.5.1 ran it under "
          "weights_only=True)", payload=True, calls=("posix.system", "os.system"), advisory="CVE-2025-32434")
    c.add("tar_payload_storages", "legacy/tar",
          b.legacy_tar(tensors, omit=("storages",),
                       extra=[("storages", b.dumps(b.Reduce(os.system, c.touch("tar_payload_storages"))))]),
          "tar format, posix.system as the 'storages' count pickle", payload=True,
          calls=("posix.system", "os.system"), advisory="CVE-2025-32434")
    c.add("tar_missing_tensors", "legacy/tar", b.legacy_tar(tensors, omit=("tensors",)), "no 'tensors' member")
    c.add("tar_missing_pickle", "legacy/tar", b.legacy_tar(tensors, omit=("pickle",)), "no 'pickle' member")
    full = b.legacy_tar(tensors)
    c.add("tar_truncated", "legacy/tar", full[:1500], "tar cut after the first members")


def _legacy_spans(raw: bytes) -> list[int]:
    """End offsets of the magic, protocol and sys_info pickles of a legacy torch file."""
    import io
    import pickle

    f = io.BytesIO(raw)
    ends = []
    for _ in range(3):
        pickle.load(f)
        ends.append(f.tell())
    return ends


# ------------------------------------------------------------------ quantized


def _quantized(c: Corpus) -> None:
    import torch

    g = torch.Generator().manual_seed(1)
    x = torch.randn(4, 3, generator=g)
    scales = torch.tensor([0.1, 0.2, 0.05, 0.3], dtype=torch.double)
    zps = torch.tensor([0, 1, 2, 3])
    q = {
        "q_qint8_per_tensor": torch.quantize_per_tensor(x, 0.05, 3, torch.qint8),
        "q_quint8_per_tensor": torch.quantize_per_tensor(x, 0.1, 128, torch.quint8),
        "q_qint32_per_tensor": torch.quantize_per_tensor(x, 0.01, 0, torch.qint32),
        "q_qint8_per_channel": torch.quantize_per_channel(x, scales, zps * 0, 0, torch.qint8),
        "q_quint8_per_channel": torch.quantize_per_channel(x, scales, zps, 0, torch.quint8),
        "q_quint4x2_per_tensor": torch.quantize_per_tensor(x, 0.5, 1, torch.quint4x2),
    }
    for name, t in q.items():
        c.add(name, "quantized", b.tsave({"w": t, "b": torch.zeros(4)}), f"{t.dtype} tensor ({name[2:]})")
    c.add("q_mixed_state_dict", "quantized", b.tsave(dict(q)), "every quantized kind in one state_dict")
    c.add("q_legacy_format", "quantized", b.tsave({"w": q["q_qint8_per_tensor"]}, _use_new_zipfile_serialization=False),
          "qint8 in the legacy format")
    lin = torch.ao.nn.quantized.Linear(3, 2)
    c.add("q_linear_module_state_dict", "quantized", b.tsave(lin.state_dict()),
          "state_dict of torch.ao.nn.quantized.Linear (packed params)")


# ------------------------------------------------------------------ weights_only metadata


def _metadata(c: Corpus) -> None:
    import numpy as np
    import torch

    from .generate import state_dict

    sd = state_dict()

    def add(name: str, meta, note: str, raw: bytes | None = None) -> None:
        data = raw if raw is not None else b.tsave({"model": sd, **meta})
        c.add(name, "weights-only-metadata", data, note)

    add("wo_namespace", {"args": argparse.Namespace(lr=0.1, arch="resnet", layers=[1, 2])}, "argparse.Namespace args")
    add("wo_numpy_scalar", {"best": np.float64(0.93), "step": np.int64(12)}, "NumPy scalars")
    add("wo_numpy_array", {"mean": np.arange(3, dtype=np.float32)}, "a NumPy array")
    add("wo_numpy_object_free", {"rng": np.random.default_rng(0).bit_generator.state}, "NumPy RNG state (plain dict)")
    add("wo_enum", {"color": Color.RED}, "an Enum from the trainer's package")
    add("wo_stdlib_enum", {"status": __import__("http").HTTPStatus.OK}, "a stdlib IntEnum (http.HTTPStatus)")
    add("wo_trainer_class", {"state": TrainerState(3, 0.5)}, "the trainer's own class")
    add("wo_pathlib", {"out_dir": pathlib.PurePosixPath("/runs/1")}, "pathlib path")
    add("wo_datetime", {"saved": datetime.datetime(2024, 1, 2, 3, 4, 5)}, "datetime")
    add("wo_containers", {"od": collections.OrderedDict(a=1), "cnt": collections.Counter("aab"),
                          "dd": collections.defaultdict(list), "s": {1, 2}, "fs": frozenset({3}),
                          "c": complex(1, 2), "by": b"xy", "ba": bytearray(b"z"), "sl": slice(1, 2),
                          "rg": range(3)}, "many stdlib containers")
    add("wo_torch_types", {"size": torch.Size([2, 3]), "dtype": torch.float16, "device": torch.device("cpu"),
                           "nan": float("nan"), "inf": float("inf")}, "torch.Size, dtype, device, nan, inf")
    opt = torch.optim.Adam([torch.nn.Parameter(torch.zeros(2))], lr=0.1)
    opt.zero_grad()
    add("wo_optimizer", {"optimizer": opt.state_dict(), "epoch": 3}, "an Adam optimizer state_dict")
    main_cls = b.patch_data_pkl(b.tsave({"model": sd, "cfg": b.StandInClass(lr=0.1)}, pickle_protocol=2),
                                lambda p: b.rename_global(p, "__main__", "TrainConfig", b.StandInClass))
    add("wo_main_class", {}, "a class from __main__ (the reference loader defines __main__.TrainConfig)", main_cls)
    missing = b.patch_data_pkl(b.tsave({"model": sd, "cfg": b.StandInClass(lr=0.1)}, pickle_protocol=2),
                               lambda p: b.rename_global(p, "mylab.configs", "Config", b.StandInClass))
    add("wo_unimportable_class", {}, "a class from a module that is not installed (mylab.configs.Config)", missing)
    add("wo_whole_module", {}, "a pickled nn.Module (torch.nn.Linear)", b.tsave(torch.nn.Linear(3, 2)))
    seq = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.ReLU())
    add("wo_whole_sequential", {}, "a pickled nn.Sequential", b.tsave(seq))
    add("wo_clean_metadata", {"epoch": 3, "lr": 0.1, "name": "run", "tags": ["a", None, True]},
        "metadata torch's allowlist accepts")


# ------------------------------------------------------------------ clean controls


def _controls(c: Corpus) -> None:
    import torch

    from .generate import state_dict

    sd = state_dict()
    add = lambda name, obj, note, **kw: c.add(name, "clean-control", b.tsave(obj, **kw), note)  # noqa: E731
    add("ctl_state_dict", sd, "a plain state_dict")
    add("ctl_ordered_dict", collections.OrderedDict(sd), "an OrderedDict state_dict")
    add("ctl_training_ckpt", {"model": sd, "epoch": 3, "optimizer": {"state": {}, "param_groups": []}},
        "model + epoch + optimizer")
    add("ctl_protocol4", sd, "pickle protocol 4", pickle_protocol=4)
    add("ctl_dtypes", {"bf16": torch.ones(2, dtype=torch.bfloat16), "f16": torch.ones(2, dtype=torch.half),
                       "f64": torch.ones(2, dtype=torch.double), "i8": torch.ones(2, dtype=torch.int8),
                       "u8": torch.ones(2, dtype=torch.uint8), "b": torch.ones(2, dtype=torch.bool),
                       "c64": torch.ones(2, dtype=torch.complex64), "u16": torch.ones(2, dtype=torch.uint16),
                       "f8": torch.ones(2).to(torch.float8_e4m3fn)}, "many dtypes")
    base = torch.arange(12.0).reshape(3, 4)
    add("ctl_views", {"base": base, "t": base.t(), "row": base[1], "cl": torch.zeros(1, 3, 2, 2).to(
        memory_format=torch.channels_last)}, "shared storage, transposed, channels_last")
    add("ctl_scalar_and_empty", {"s": torch.tensor(3.0), "e": torch.zeros(0, 4)}, "0-d and zero-size tensors")
    add("ctl_parameter", {"p": torch.nn.Parameter(torch.ones(2))}, "an nn.Parameter")
    add("ctl_sparse", {"sp": torch.eye(3).to_sparse()}, "a sparse COO tensor")
    add("ctl_nan_values", {"w": torch.tensor([float("nan"), 1.0])}, "a NaN value (loads fine; gate may fail it)")
    add("ctl_tensor_list", [torch.ones(2), torch.zeros(3)], "a list of tensors at the top")
    add("ctl_non_string_keys", {0: torch.ones(2), (1, 2): torch.zeros(1)}, "int and tuple keys")
    mod = torch.jit.script(torch.nn.Linear(3, 2))
    import io

    buf = io.BytesIO()
    torch.jit.save(mod, buf)
    c.add("ctl_torchscript", "clean-control", buf.getvalue(),
          "a TorchScript archive: torch.load(weights_only=True) refuses it since 2.6 (CVE-2025-32434: "
          "torch <= 2.5.1 dispatched it to torch.jit.load under weights_only=True)", advisory="CVE-2025-32434")
    c.add("ctl_pickle_plain", "clean-control", b.dumps({"a": 1, "b": [1.5, "x"]}), "a plain pickle", ext=".pkl")


# ------------------------------------------------------------------ folders and special files


def _deepspeed_moe_payload(c: Corpus, base: str) -> None:
    """Issue 32: a real DeepSpeed MoE run (fixtures/deepspeed_moe/) whose payload sits in an expert file,
    ``layer_1_expert_3_mp_rank_00_model_states.pt``, which DeepSpeed's load_moe_state_dict opens with
    torch.load(weights_only=False); inspect read the folder without a word."""
    import shutil

    import torch

    run = pathlib.Path(__file__).resolve().parents[2] / "fixtures" / "deepspeed_moe" / "zero0_ep2"
    if not run.is_dir():
        return
    name = "dir_deepspeed_moe_expert_payload"
    d = os.path.join(base, name)
    shutil.copytree(run, d)
    expert = os.path.join(d, "global_step1", "layer_1_expert_3_mp_rank_00_model_states.pt")
    sd = torch.load(expert, weights_only=True)
    with open(expert, "wb") as f:
        f.write(b.tsave({**sd, "x": b.Reduce(os.system, c.touch(name))}))
    c.add(name, "folder/special-file", None, "a DeepSpeed MoE run (ZeRO-0, ep 2) whose expert file calls posix.system",
          path=d, kind="folder", payload=True, calls=("posix.system", "os.system"))


def _folders(c: Corpus) -> None:
    from .generate import state_dict

    base = os.path.join(c.folder, "dirs")
    os.makedirs(base, exist_ok=True)

    def mkdir(name: str) -> str:
        d = os.path.join(base, name)
        os.makedirs(d, exist_ok=True)
        return d

    c.add("dir_empty", "folder/special-file", None, "an empty folder", path=mkdir("empty"), kind="folder")
    d = mkdir("no_checkpoints")
    for n, text in (("README.md", "# hi\n"), ("config.json", '{"a": 1}'), ("notes.txt", "x")):
        with open(os.path.join(d, n), "w") as f:
            f.write(text)
    c.add("dir_no_checkpoints", "folder/special-file", None, "README, config.json, notes.txt only",
          path=d, kind="folder")
    d = mkdir("with_payload")
    with open(os.path.join(d, "model.bin"), "wb") as f:
        f.write(b.tsave({**state_dict(), "x": b.Reduce(os.system, c.touch("dir_with_payload"))}))
    c.add("dir_with_payload", "folder/special-file", None, "a folder holding a posix.system .bin", path=d,
          kind="folder", payload=True, calls=("posix.system", "os.system"))
    _deepspeed_moe_payload(c, base)
    d = mkdir("with_clean")
    with open(os.path.join(d, "model.pth"), "wb") as f:
        f.write(b.tsave(state_dict()))
    c.add("dir_with_clean", "folder/special-file", None, "a folder holding one clean .pth and nothing else",
          path=d, kind="folder")
    clean = os.path.join(c.support, "target_clean.pth")
    with open(clean, "wb") as f:
        f.write(b.tsave(state_dict()))
    evil = os.path.join(c.support, "target_evil.pth")
    with open(evil, "wb") as f:
        f.write(b.tsave({**state_dict(), "x": b.Reduce(os.system, c.touch("symlink_to_payload"))}))
    for name, target, kw in (
        ("symlink_to_clean", clean, {}),
        ("symlink_to_payload", evil, {"payload": True, "calls": ("posix.system", "os.system")}),
        ("symlink_dangling", os.path.join(c.support, "does_not_exist.pth"), {}),
    ):
        link = os.path.join(base, name + ".pth")
        os.symlink(target, link)
        c.add(name, "folder/special-file", None, f"symlink -> {os.path.basename(target)}", path=link, **kw)
    loop_a, loop_b = os.path.join(base, "loop_a.pth"), os.path.join(base, "loop_b.pth")
    os.symlink(loop_b, loop_a)
    os.symlink(loop_a, loop_b)
    c.add("symlink_loop", "folder/special-file", None, "symlinks pointing at each other", path=loop_a)
    fifo = os.path.join(base, "fifo.pth")
    os.mkfifo(fifo)
    c.add("fifo", "folder/special-file", None, "a FIFO given as the checkpoint (loaders hang on it)",
          path=fifo, kind="special")
    c.add("dev_zero", "folder/special-file", None, "/dev/zero given as the checkpoint", path="/dev/zero",
          kind="special")
    c.add("zero_byte_pth", "folder/special-file", b"", "an empty .pth")
    c.add("dir_named_pth", "folder/special-file", None, "a folder named model.pth", path=mkdir("model.pth"),
          kind="folder")
