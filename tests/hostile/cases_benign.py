"""Issue 21: benign files using ordinary torch features, every one written by a real ``torch.save``.

Class ``benign-feature``. None of them runs code: ``torch.load(weights_only=False)``
loads each without creating a marker, and ckpt must not flag any of them
(scan not dangerous, gate's loads_safely passes, inspect exits 0 without a
dangerous warning). Several are refused by ``torch.load(weights_only=True)``
(NumPy RNG objects, regexes, SimpleNamespace): refused is not dangerous.
"""
from __future__ import annotations

import collections
import datetime
import decimal
import fractions
import re
import types
import uuid
from typing import TYPE_CHECKING

from . import builders as b

if TYPE_CHECKING:
    from .generate import Corpus


def add_benign(c: Corpus) -> None:
    import numpy as np
    import torch

    from .generate import state_dict

    sd = state_dict()
    g = torch.Generator().manual_seed(3)

    def add(name: str, meta: dict, note: str, *, whole: object = None) -> None:
        obj = whole if whole is not None else {"model": sd, **meta}
        c.add(name, "benign-feature", b.tsave(obj), note)

    x = torch.randn(3, 4, generator=g)
    add("bf_return_types", {"max": torch.max(x, dim=0), "topk": torch.topk(x, 2), "sort": torch.sort(x)},
        "torch.return_types values (max, topk, sort): structseqs torch returns")
    add("bf_datetime_tz", {"saved": datetime.datetime(2025, 3, 4, 5, 6, 7, tzinfo=datetime.timezone.utc),
                           "local": datetime.datetime(2025, 3, 4, 5, 6, 7,
                                                      tzinfo=datetime.timezone(datetime.timedelta(hours=2), "CEST"))},
        "timezone-aware datetimes (datetime.timezone, with an offset and a name)")
    add("bf_date_time_delta", {"day": datetime.date(2025, 1, 2), "t": datetime.time(3, 4, 5),
                               "took": datetime.timedelta(seconds=90)}, "date, time and timedelta values")
    add("bf_simple_namespace", {"args": types.SimpleNamespace(lr=0.1, arch="mlp", layers=[2, 3])},
        "types.SimpleNamespace hyperparameters")
    add("bf_compiled_regex", {"skip": re.compile(r"^layers\.\d+\.bias$"), "ci": re.compile("head", re.IGNORECASE)},
        "compiled regular expressions (re.compile, with flags)")
    add("bf_numpy_generator", {"rng": np.random.default_rng(0)}, "a NumPy Generator (PCG64)")
    add("bf_numpy_randomstate", {"rng": np.random.RandomState(0)}, "a NumPy RandomState (MT19937)")
    add("bf_numpy_seedsequence", {"seed": np.random.SeedSequence(1234)}, "a NumPy SeedSequence")
    add("bf_numpy_bitgen_philox", {"rng": np.random.Generator(np.random.Philox(7))}, "a Generator on Philox")
    nt = torch.nested.nested_tensor([torch.ones(2, 3), torch.zeros(4, 3)], layout=torch.jagged)
    add("bf_nested_jagged", {"nt": nt}, "a nested tensor with the jagged layout (NJT)")
    add("bf_nested_strided", {"nt": torch.nested.nested_tensor([torch.ones(2), torch.zeros(3)])},
        "a nested tensor with the strided layout")
    add("bf_complex32", {"c32": torch.zeros(3, dtype=torch.complex32), "c128": torch.ones(2, dtype=torch.complex128)},
        "complex32 (chalf) and complex128 tensors")
    add("bf_float8_e8m0fnu", {"scale": torch.ones(4).to(torch.float8_e8m0fnu),
                              "e5m2": torch.ones(2).to(torch.float8_e5m2),
                              "e4m3fnuz": torch.ones(2).to(torch.float8_e4m3fnuz)},
        "float8_e8m0fnu (MX block scales), float8_e5m2 and float8_e4m3fnuz tensors")
    add("bf_uint_and_bits", {"u32": torch.tensor([1, 2, 3], dtype=torch.uint32),
                             "u64": torch.tensor([4, 5], dtype=torch.uint64),
                             "i16": torch.arange(2, dtype=torch.int16)}, "uint32, uint64 and int16 tensors")
    dense = torch.tensor([[0.0, 1.5, 0.0], [2.0, 0.0, 3.0]])
    add("bf_sparse_coo_csr", {"coo": dense.to_sparse(), "csr": dense.to_sparse_csr(), "csc": dense.to_sparse_csc()},
        "sparse COO, CSR and CSC tensors")
    add("bf_sparse_bsr", {"bsr": torch.eye(4).to_sparse_bsr((2, 2))}, "a sparse BSR tensor")
    scales = torch.tensor([0.1, 0.2, 0.3], dtype=torch.double)
    q = torch.quantize_per_channel(torch.randn(3, 4, generator=g), scales, torch.zeros(3, dtype=torch.long), 0,
                                   torch.qint8)
    add("bf_quantized_per_channel", {"qw": q, "qt": torch.quantize_per_tensor(torch.ones(2), 0.1, 0, torch.quint8)},
        "quantized per-channel qint8 and per-tensor quint8 tensors")
    add("bf_torch_values", {"size": torch.Size([2, 3]), "dtypes": [torch.bfloat16, torch.int8, torch.complex64],
                            "device": torch.device("cpu"), "cuda": torch.device("cuda", 1),
                            "layouts": [torch.strided, torch.sparse_coo, torch.sparse_csr],
                            "cl": torch.zeros(1, 2, 2, 2).to(memory_format=torch.channels_last)},
        "torch.Size, dtype, device and layout values, a channels_last tensor (torch 2.13 cannot pickle a "
        "memory_format value itself)")
    od = collections.OrderedDict(sd)
    od._metadata = collections.OrderedDict({"": {"version": 1}, "fc": {"version": 2}})  # type: ignore[attr-defined]
    c.add("bf_state_dict_metadata", "benign-feature", b.tsave(od),
          "an OrderedDict state_dict with _metadata (what Module.state_dict() returns)")
    p = torch.nn.Parameter(torch.ones(2), requires_grad=False)
    p.tag = "frozen"  # type: ignore[attr-defined]
    add("bf_parameter_with_state", {"p": p, "buf": torch.nn.Buffer(torch.zeros(2))},
        "an nn.Parameter with an attribute (rebuilt with _rebuild_parameter_with_state) and an nn.Buffer")
    add("bf_stdlib_values", {"id": uuid.UUID(int=7), "d": decimal.Decimal("1.25"), "f": fractions.Fraction(1, 3),
                             "cnt": collections.Counter("abca"), "dq": collections.deque([1, 2], maxlen=4)},
        "uuid, Decimal, Fraction, Counter and deque values")
    add("bf_rng_states", {"torch_rng": torch.get_rng_state(), "gen": g.get_state()},
        "torch RNG states (uint8 tensors from get_rng_state)")
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.ones(1, 2)).sum().backward()
    opt.step()
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2)
    add("bf_optimizer_scheduler", {"optimizer": opt.state_dict(), "scheduler": sched.state_dict()},
        "SGD momentum state and a StepLR scheduler state_dict")
    add("bf_meta_and_empty", {"meta": torch.empty(2, 3, device="meta"), "e": torch.empty(0, dtype=torch.bool)},
        "a meta tensor (no storage) and an empty bool tensor")
