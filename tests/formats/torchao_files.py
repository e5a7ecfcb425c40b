"""Writes torchao-quantized state dicts, one per scheme, with real ``torchao.quantization.quantize_``.

Run in a subprocess (``python tests/formats/torchao_files.py OUT_DIR``): importing torchao
registers its classes with torch process-wide, which must not leak into other tests.
Writes ``SCHEME.pth`` and ``expected.json`` (each subclass's class and inner tensors as
``__tensor_flatten__`` names them). ``check OUT_DIR SRC OUT`` loads two files with torchao
imported and exits 0 when they hold the same classes and bit-identical inner tensors.
"""
from __future__ import annotations

import json
import os
import sys
import warnings


def _schemes():  # type: ignore[no-untyped-def]
    from torchao import quantization as q

    return {
        "int8_weight_only": q.Int8WeightOnlyConfig,
        "int8_dynamic": q.Int8DynamicActivationInt8WeightConfig,
        "float8_weight_only": q.Float8WeightOnlyConfig,
        "intx_weight_only": q.IntxWeightOnlyConfig,
    }


class _CudaDevice:
    """A pickle module whose Pickler writes every torch.device as cuda:0: the wrappers of a model quantized on a
    GPU, without one (the storages keep their own 'cpu' location strings)."""

    import pickle as _pickle

    Unpickler = _pickle.Unpickler
    load = _pickle.load
    dump = _pickle.dump
    __name__ = "pickle"

    class Pickler(_pickle.Pickler):
        def reducer_override(self, obj):  # type: ignore[no-untyped-def]
            import torch

            if isinstance(obj, torch.device):
                return (torch.device, ("cuda:0",))
            return NotImplemented


def write(out: str) -> None:
    import torch
    from torchao.quantization import quantize_

    def quantized_copy(config):  # type: ignore[no-untyped-def]
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(32, 16), torch.nn.ReLU(), torch.nn.Linear(16, 8))
        quantize_(model, config())
        return model.state_dict()

    expected: dict[str, dict[str, object]] = {}
    for name, config in _schemes().items():
        sd = quantized_copy(config)
        torch.save(sd, os.path.join(out, f"{name}.pth"))
        if name == "int8_weight_only":  # the pre-zip format pickles the same records
            torch.save(sd, os.path.join(out, f"{name}_legacy.pth"), _use_new_zipfile_serialization=False)
            torch.save(sd, os.path.join(out, "int8_cuda_device.pth"), pickle_module=_CudaDevice)
            nan_sd = quantized_copy(config)
            nan_sd["0.weight"].scale[3] = float("nan")  # a scale gone bad: only the inner tensors can show it
            torch.save(nan_sd, os.path.join(out, "int8_nan_scale.pth"))
        expected[name] = {}
        for key, value in sd.items():
            if type(value) is torch.Tensor:
                continue
            names, _ = value.__tensor_flatten__()
            expected[name][key] = {
                "class": f"{type(value).__module__}.{type(value).__qualname__}",
                "dtype": str(value.dtype).removeprefix("torch."), "shape": list(value.shape),
                "inner": {n: [str(getattr(value, n).dtype).removeprefix("torch."), list(getattr(value, n).shape)]
                          for n in names},
            }
    with open(os.path.join(out, "expected.json"), "w") as f:
        json.dump(expected, f)


def _bits(t):  # type: ignore[no-untyped-def]
    return t.contiguous().view(-1).view(__import__("torch").uint8)


def check(src: str, out: str) -> None:
    import torch
    import torchao.quantization  # noqa: F401  - the classes the files name

    a, b = torch.load(src, weights_only=False, map_location="cpu"), torch.load(out, weights_only=False)
    if list(a) != list(b):
        raise SystemExit(f"keys differ: {list(a)} vs {list(b)}")
    for key, x in a.items():
        y = b[key]
        if type(x) is not type(y):
            raise SystemExit(f"{key}: {type(y).__name__}, expected {type(x).__name__}")
        if type(x) is torch.Tensor:
            if not torch.equal(_bits(x), _bits(y)):
                raise SystemExit(f"{key}: bytes differ")
            continue
        names, ctx = x.__tensor_flatten__()
        names_b, ctx_b = y.__tensor_flatten__()
        if names != names_b or repr(ctx) != repr(ctx_b):
            raise SystemExit(f"{key}: flatten differs: {names} {ctx!r} vs {names_b} {ctx_b!r}")
        for n in names:
            u, v = getattr(x, n), getattr(y, n)
            if u.dtype != v.dtype or u.shape != v.shape or not torch.equal(_bits(u), _bits(v)):
                raise SystemExit(f"{key}.{n}: differs")
        if x.dtype != y.dtype or x.shape != y.shape:
            raise SystemExit(f"{key}: outer dtype or shape differs")
    print("same")


if __name__ == "__main__":
    warnings.simplefilter("ignore")
    if sys.argv[1] == "check":
        check(sys.argv[2], sys.argv[3])
    else:
        write(sys.argv[1])
