"""Issue 21: verdicts by allowlist, on real files written by torch, pickle and NumPy.

A global that any opcode calls or constructs (REDUCE, OBJ, INST, NEWOBJ,
NEWOBJ_EX, BUILD through __setstate__, an extension code, a persistent id, an
argument of an inert trampoline) is dangerous unless it is on the inert list
(pickles/inert.py); one only named is suspicious. The benign features of
ordinary torch checkpoints are safe, and every reviewed inert entry is tested
with a real file that names it.
"""
from __future__ import annotations

import argparse
import collections
import copyreg
import datetime
import decimal
import fractions
import importlib
import json
import pathlib
import pickle
import re
import subprocess
import sys
import textwrap
import types
import uuid
import warnings

import numpy as np
import pytest
import torch

from ckpt_tool import gate, scan
from ckpt_tool.pickles import inert, severity

MYLAB = textwrap.dedent(
    """
    import numpy as np
    import torch

    class Net:
        def __init__(self):
            self.w = 1

    class WithState:
        def __setstate__(self, state):
            self.__dict__.update(state)

    class NewEx:
        def __new__(cls, a, *, b):
            return super().__new__(cls)

        def __getnewargs_ex__(self):
            return (1,), {"b": 2}

    class MyTensor(torch.Tensor):
        pass

    class MyArray(np.ndarray):
        pass

    def make(*args):
        return list(args)

    class Via:
        '''Pickles as func(*args): how a file names an inert callable with arguments of its choosing.'''

        def __init__(self, func, *args):
            self.func, self.args = func, args

        def __reduce__(self):
            return self.func, self.args
    """
)


@pytest.fixture(scope="module")
def mylab(tmp_path_factory):
    """A user module (``mylab``) the pickles name; importable here so that real pickler can write them."""
    folder = tmp_path_factory.mktemp("mylab")
    (folder / "mylab.py").write_text(MYLAB)
    sys.path.insert(0, str(folder))
    try:
        yield importlib.import_module("mylab")
    finally:
        sys.path.remove(str(folder))
        sys.modules.pop("mylab", None)


def judged(path):
    report = scan([str(path)])
    (f,) = report.files
    return f


def assert_dangerous(f, qualname: str, message_start: str) -> None:
    sev = {g.qualname: g.severity for g in f.globals}
    assert sev.get(qualname) == "dangerous", (qualname, f.globals)
    assert f.verdict == "dangerous"
    messages = [x.message for x in f.findings if x.glob == qualname]
    assert any(m.startswith(message_start) for m in messages), (message_start, messages)
    assert any("not on the inert allowlist" in m for m in messages), messages


def save(tmp_path, name, obj, **kwargs):
    path = tmp_path / name
    torch.save(obj, path, **kwargs)
    return path


def write(tmp_path, name, data: bytes):
    path = tmp_path / name
    path.write_bytes(data)
    return path


# --------------------------------------------------------------- opcode routes


def test_reduce_of_an_unknown_function_is_dangerous(mylab, tmp_path):
    f = judged(save(tmp_path, "reduce.pth", {"x": mylab.Via(mylab.make, 1)}))
    assert_dangerous(f, "mylab.make", "calls mylab.make, which is not on the inert allowlist")


def test_newobj_of_an_unknown_class_is_dangerous_and_still_read_as_a_placeholder(mylab, tmp_path, run_cli):
    path = save(tmp_path, "newobj.pth", {"w": torch.ones(2), "net": mylab.Net()})
    f = judged(path)
    assert_dangerous(f, "mylab.Net", "constructs mylab.Net, which is not on the inert allowlist")
    assert "import it and run its class code" in next(x.message for x in f.findings if x.glob == "mylab.Net")
    r = run_cli("inspect", str(path))  # the contract: still inspected, as a placeholder, with a warning
    assert r.code == 0 and "dangerous" in r.out and "constructs mylab.Net" in r.out, r.out
    assert run_cli("scan", str(path)).code == 1
    assert not gate([str(path)]).passed


def test_inst_of_an_unknown_class_is_dangerous(mylab, tmp_path):
    f = judged(write(tmp_path, "inst.pkl", b"(imylab\nNet\n."))  # protocol 0: MARK, INST
    assert_dangerous(f, "mylab.Net", "constructs mylab.Net")


def test_obj_of_an_unknown_class_is_dangerous(mylab, tmp_path):
    f = judged(write(tmp_path, "obj.pkl", b"(cmylab\nNet\no."))  # protocol 1: MARK, GLOBAL, OBJ
    assert_dangerous(f, "mylab.Net", "constructs mylab.Net")


def test_newobj_ex_of_an_unknown_class_is_dangerous(mylab, tmp_path):
    data = pickle.dumps(mylab.NewEx(1, b=2), protocol=4)
    assert b"\x92" in data  # NEWOBJ_EX
    f = judged(write(tmp_path, "newobj_ex.pkl", data))
    assert_dangerous(f, "mylab.NewEx", "constructs mylab.NewEx")


def test_build_through_setstate_is_dangerous(mylab, tmp_path):
    f = judged(save(tmp_path, "setstate.pth", {"s": mylab.WithState()}))
    assert_dangerous(f, "mylab.WithState", "constructs mylab.WithState")
    assert "__setstate__" in next(x.message for x in f.findings if x.glob == "mylab.WithState")


def test_build_on_what_a_persistent_id_resolves_to_is_dangerous(tmp_path):
    # PROTO 2, BINUNICODE 'blob', BINPERSID, EMPTY_DICT, BUILD, STOP: __setstate__ of whatever the loader returns
    f = judged(write(tmp_path, "persid_build.pkl", b"\x80\x02X\x04\x00\x00\x00blobQ}b."))
    assert f.verdict == "dangerous"
    assert any("persistent_load returned" in x.message for x in f.findings), f.findings


def test_extension_codes_are_dangerous(mylab, tmp_path):
    copyreg.add_extension("mylab", "Net", 0xF1)
    try:
        data = pickle.dumps(mylab.Net(), protocol=2)
    finally:
        copyreg.remove_extension("mylab", "Net", 0xF1)
    assert b"\x82\xf1" in data  # EXT1 241
    f = judged(write(tmp_path, "ext.pkl", data))
    assert f.verdict == "dangerous"
    assert any("extension code 241" in x.message and "no allowlist" in x.message for x in f.findings), f.findings


def test_a_persistent_id_naming_an_unknown_storage_type_is_dangerous(mylab, tmp_path):
    import io

    sentinel = object()

    class Pickler(pickle.Pickler):
        def persistent_id(self, obj):
            return ("storage", mylab.Net, "0", "cpu", 4) if obj is sentinel else None

    buf = io.BytesIO()
    Pickler(buf, protocol=2).dump({"w": sentinel})
    f = judged(write(tmp_path, "persid_type.pkl", buf.getvalue()))
    assert_dangerous(f, "mylab.Net", "passes mylab.Net to torch.serialization.persistent_load")


# --------------------------------------------------------------- trampolines


def _trampolines(mylab):
    """(case, the object torch.save writes, the pickle protocol, the global judged, what the message says)."""
    rnd = importlib.import_module("numpy.random._pickle")
    seq = importlib.import_module("numpy.random.bit_generator")
    storage = torch.ones(2).untyped_storage()
    via = mylab.Via
    return [
        ("copyreg._reconstructor", mylab.Net(), 1, "mylab.Net", "passes mylab.Net to copy_reg._reconstructor, "
                                                                "which constructs it"),
        ("copyreg.__newobj__", via(copyreg.__newobj__, mylab.Net), 1, "mylab.Net", "passes mylab.Net to "
                                                                                   "copy_reg.__newobj__"),
        ("collections.defaultdict", collections.defaultdict(mylab.make), 2, "mylab.make",
         "passes mylab.make to collections.defaultdict, which calls it as the default factory"),
        ("_rebuild_from_type_v2", torch.ones(2).as_subclass(mylab.MyTensor), 2, "mylab.MyTensor",
         "passes mylab.MyTensor to torch._tensor._rebuild_from_type_v2"),
        ("_rebuild_from_type_v2 (nested args)", via(torch._tensor._rebuild_from_type_v2, copyreg._reconstructor,
                                                     torch.Tensor, (mylab.Net, object, None), {}), 2, "mylab.Net",
         "passes mylab.Net to torch._tensor._rebuild_from_type_v2"),
        ("_rebuild_from_type_v2 (a list of args)", via(torch._tensor._rebuild_from_type_v2, copyreg._reconstructor,
                                                        torch.Tensor, [mylab.Net, object, None], {}), 2,
         "mylab.Net", "passes mylab.Net to torch._tensor._rebuild_from_type_v2"),
        ("_rebuild_tensor_v2 (hooks in a dict)", via(torch._utils._rebuild_tensor_v2, storage, 0, (2,), (1,), False,
                                                      {0: mylab.make}), 2,
         "mylab.make", "passes mylab.make to torch._utils._rebuild_tensor_v2"),
        ("_rebuild_from_type", via(torch._tensor._rebuild_from_type, mylab.make, torch.Tensor, (), {}), 2,
         "mylab.make", "passes mylab.make to torch._tensor._rebuild_from_type"),
        ("_rebuild_wrapper_subclass", via(torch._utils._rebuild_wrapper_subclass, mylab.MyTensor, torch.float32,
                                          (2,), (1,), 0, torch.strided, torch.device("cpu"), False), 2,
         "mylab.MyTensor", "passes mylab.MyTensor to torch._utils._rebuild_wrapper_subclass, which constructs it"),
        ("_rebuild_parameter_with_state", via(torch._utils._rebuild_parameter_with_state, torch.ones(1), False,
                                              mylab.make, {}), 2, "mylab.make",
         "passes mylab.make to torch._utils._rebuild_parameter_with_state, which keeps it as a backward hook"),
        ("_rebuild_parameter", via(torch._utils._rebuild_parameter, torch.ones(1), False, mylab.make), 2,
         "mylab.make", "passes mylab.make to torch._utils._rebuild_parameter, which keeps it as a backward hook"),
        ("_rebuild_tensor_v2", via(torch._utils._rebuild_tensor_v2, storage, 0, (2,), (1,), False, mylab.make), 2,
         "mylab.make", "passes mylab.make to torch._utils._rebuild_tensor_v2"),
        ("numpy _reconstruct", np.zeros(2).view(mylab.MyArray), 2, "mylab.MyArray",
         "passes mylab.MyArray to numpy._core.multiarray._reconstruct, which constructs it"),
        ("__generator_ctor", via(getattr(rnd, "__generator_ctor"), "MT19937", mylab.make), 2, "mylab.make",
         "passes mylab.make to numpy.random._pickle.__generator_ctor, which calls it"),
        ("__randomstate_ctor", via(getattr(rnd, "__randomstate_ctor"), "MT19937", mylab.make), 2, "mylab.make",
         "passes mylab.make to numpy.random._pickle.__randomstate_ctor, which calls it"),
        ("__bit_generator_ctor", via(getattr(rnd, "__bit_generator_ctor"), mylab.Net), 2, "mylab.Net",
         "passes mylab.Net to numpy.random._pickle.__bit_generator_ctor, which calls it"),
        ("__pyx_unpickle_SeedSequence", via(getattr(seq, "__pyx_unpickle_SeedSequence"), mylab.Net, 0, None), 2,
         "mylab.Net", "passes mylab.Net to numpy.random.bit_generator.__pyx_unpickle_SeedSequence"),
    ]


@pytest.mark.parametrize("index", range(17))
def test_a_global_handed_to_an_inert_trampoline_is_judged_as_called(mylab, tmp_path, index):
    case, obj, protocol, qualname, message = _trampolines(mylab)[index]
    path = save(tmp_path, "trampoline.pth", {"w": torch.ones(1), "x": obj}, pickle_protocol=protocol)
    f = judged(path)
    callee = {g.qualname: g.severity for g in f.globals}
    assert_dangerous(f, qualname, message)
    inert_callees = [q for q in callee if q != qualname and callee[q] == "safe"]
    assert inert_callees, (case, callee)  # the trampoline itself stays on the inert list


def test_every_trampoline_of_the_inert_list_is_tested(mylab):
    named = {msg.split(" to ", 1)[1].split(",", 1)[0] for *_, msg in _trampolines(mylab)}
    named |= {"torch.serialization.persistent_load"}  # test_a_persistent_id_naming_an_unknown_storage_type
    spellings = {"copyreg._reconstructor", "copyreg.__newobj__", "copyreg.__newobj_ex__", "copy_reg.__newobj_ex__",
                 "numpy.core.multiarray._reconstruct"}  # as written here: copy_reg, numpy._core
    untested = {f"{m}.{n}" for m, n in inert.TRAMPOLINES} - spellings - named
    assert not untested, untested


# --------------------------------------------------------------- benign features


def _benign():
    import torch.nested

    x = torch.arange(6.0).reshape(2, 3)
    return {
        "return_types": {"m": torch.max(x, 0)},
        "tz_datetime": {"t": datetime.datetime(2025, 1, 2, 3, 4, tzinfo=datetime.timezone(datetime.timedelta(hours=2))),
                        "u": datetime.datetime(2025, 1, 2, tzinfo=datetime.timezone.utc)},
        "simplenamespace": {"cfg": types.SimpleNamespace(lr=0.1, layers=[3, 4])},
        "regex": {"pattern": re.compile(r"layer\.\d+\.weight", re.IGNORECASE)},
        "numpy_rng": {"g": np.random.default_rng(0), "rs": np.random.RandomState(1), "ss": np.random.SeedSequence(5)},
        "jagged": {"n": torch.nested.nested_tensor([torch.ones(2, 3), torch.ones(4, 3)], layout=torch.jagged)},
        "complex32": {"c": torch.zeros(3, dtype=torch.complex32)},
        "float8_e8m0fnu": {"e": torch.ones(4).to(torch.float8_e8m0fnu)},
        "namespace": {"args": argparse.Namespace(lr=0.1, arch="tiny")},
    }


@pytest.fixture(scope="module")
def benign(tmp_path_factory):
    folder = tmp_path_factory.mktemp("benign")
    paths = {}
    with warnings.catch_warnings():  # ComplexHalf is "experimental"
        warnings.simplefilter("ignore", UserWarning)
        objs = _benign()
    for name, obj in objs.items():
        paths[name] = folder / f"{name}.pth"
        torch.save(obj, paths[name])
    return paths


BENIGN = ["return_types", "tz_datetime", "simplenamespace", "regex", "numpy_rng", "jagged", "complex32",
          "float8_e8m0fnu", "namespace"]


@pytest.mark.parametrize("name", BENIGN)
def test_benign_feature_is_safe_everywhere(benign, name, run_cli):
    path = benign[name]
    f = judged(path)
    assert f.verdict == "safe", (f.globals, f.findings, f.errors)
    assert {g.severity for g in f.globals} == {"safe"}
    c = next(c for c in gate([str(path)], weights_only_check=False).files[0].checks if c.name == "loads-safely")
    assert c.passed and "fails with --strict" not in c.detail, c.detail
    r = run_cli("inspect", str(path))
    assert r.code == 0 and "dangerous" not in r.out.lower() and "suspicious" not in r.out.lower(), r.out
    if name in ("complex32", "float8_e8m0fnu"):
        doc = json.loads(run_cli("inspect", "--json", str(path)).out)
        assert [t["dtype"] for t in doc["tensors"]] == [name]


AUDIT = textwrap.dedent(
    """
    import sys
    sys.dont_write_bytecode = True  # a .pyc written for a lazily imported module is no side effect of the file
    import torch
    LOUD = ("os.system", "subprocess.Popen", "os.posix_spawn", "os.exec", "os.fork", "os.spawn", "socket.connect",
            "pty.spawn", "os.remove", "os.rename", "shutil.rmtree", "ctypes.dlopen", "os.kill", "atexit")
    def hook(event, args):
        if event.startswith(LOUD) or (event == "open" and isinstance(args[1], str) and set(args[1]) & set("wax+")):
            raise SystemExit(f"ran {event} {args[:2]!r}")
    for path in sys.argv[1:]:
        data = open(path, "rb").read()
        import io
        sys.addaudithook(hook) if path == sys.argv[1] else None
        torch.load(io.BytesIO(data), weights_only=False)
    print("loaded", len(sys.argv) - 1)
    """
)


def test_benign_features_load_with_torch_without_running_anything_unexpected(benign):
    """The ground truth: torch.load(weights_only=False) of each file starts no process, writes no file."""
    paths = [str(benign[n]) for n in BENIGN]
    proc = subprocess.run([sys.executable, "-c", "import torch.nested, torch._dynamo\n" + AUDIT, *paths],
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0 and f"loaded {len(paths)}" in proc.stdout, proc.stderr[-2000:]


# --------------------------------------------------------------- the reviewed inert list


def _inert_cases(tmp_path):
    """(file, its bytes' writer) for every reviewed entry: what real libraries write for it."""
    rt = torch.return_types
    bases = [*inert._RETURN_TYPES, "histogramdd"]
    structs = {n: getattr(rt, n) for b in bases for n in (b, f"{b}_out") if hasattr(rt, n)}
    returns = {n: cls(tuple(torch.zeros(1) for _ in range(cls.n_sequence_fields))) for n, cls in structs.items()}

    class Script(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.floats: list[float] = [1.0, 2.0]
            self.flags: list[bool] = [True]
            self.ints: list[int] = [1, 2]
            self.tensors: list[torch.Tensor] = [torch.ones(1)]
            self.table: dict[str, int] = {"a": 1}

        def forward(self, x):
            return x

    script = tmp_path / "script.pt"
    torch.jit.save(torch.jit.script(Script()), str(script))
    rnd = importlib.import_module("numpy.random._pickle")
    via = _Via
    values = {
        "defaultdict factories": {t.__name__: collections.defaultdict(t) for t in (list, dict, int, float, str, bool,
                                                                                    tuple, set)},
        "python values": {"s": slice(1, 2), "r": range(3), "f": frozenset([1]), "e": Ellipsis, "b": b"",
                          "o": via(copyreg._reconstructor, argparse.Namespace, object, None)},
        "collections": {"d": collections.deque([1, 2], maxlen=4)},
        "datetime": {"dt": datetime.datetime(2025, 1, 2, tzinfo=datetime.timezone.utc), "d": datetime.date(2025, 1, 2),
                     "t": datetime.time(1, 2), "td": datetime.timedelta(3)},
        "numbers and ids": {"d": decimal.Decimal("1.5"), "f": fractions.Fraction(1, 3),
                            "u": uuid.UUID(int=1, is_safe=uuid.SafeUUID.safe)},  # is_safe pickles as its value
        "paths": {"p": pathlib.Path("a/b"), "pp": pathlib.PurePosixPath("c"), "pw": pathlib.PureWindowsPath("d")},
        "namespaces and regex": {"a": argparse.Namespace(x=1), "s": types.SimpleNamespace(y=2), "r": re.compile("z")},
        "numpy": {"a": np.arange(3), "s": np.float32(1.5)},
        "numpy random": {"g": np.random.default_rng(0), "rs": np.random.RandomState(1),
                         "bg": [np.random.PCG64DXSM(1), np.random.Philox(2), np.random.SFC64(3)],
                         "f": via(getattr(rnd, "__bit_generator_ctor"), "MT19937")},
        "sharded tensor records": _sharded_tensor_records(),
        "torch extras": {"r": returns, "old": via(torch._tensor._rebuild_from_type, torch._utils._rebuild_tensor_v2,
                                                  torch.Tensor, (torch.ones(1).untyped_storage(), 0, (1,), (1,)),
                                                  {})},
    }
    files = [save(tmp_path, f"{k.replace(' ', '_')}.pth", v) for k, v in values.items()]
    files.append(save(tmp_path, "protocol1.pth", {"n": argparse.Namespace(a=1),
                                                  "new": via(copyreg.__newobj__, argparse.Namespace),
                                                  "new_ex": via(copyreg.__newobj_ex__, argparse.Namespace, (), {})},
                      pickle_protocol=1))
    files.append(save(tmp_path, "protocol5.pth", {"a": np.arange(4)}, pickle_protocol=5))
    files.append(write(tmp_path, "tensors.pkl", pickle.dumps({"w": torch.ones(2)})))  # _load_from_bytes
    files.append(script)
    return files


def _sharded_tensor_records():
    """What FSDP1's ShardedTensor pickles beside itself (its shards' and placement's records), built directly."""
    from torch.distributed._shard.metadata import ShardMetadata
    from torch.distributed._shard.sharded_tensor.metadata import ShardedTensorMetadata, TensorProperties
    from torch.distributed._shard.sharded_tensor.shard import Shard
    from torch.distributed._shard.sharding_spec import ChunkShardingSpec, EnumerableShardingSpec

    meta = ShardMetadata([0, 0], [2, 2], "rank:0/cpu")
    return {"shard": Shard(torch.ones(2, 2), meta), "spec": ChunkShardingSpec(0, ["rank:0/cpu"]),
            "enum": EnumerableShardingSpec([meta]),
            "global": ShardedTensorMetadata([meta], torch.Size([2, 2]), TensorProperties(torch.float32))}


class _Via:
    def __init__(self, func, *args):
        self.func, self.args = func, args

    def __reduce__(self):
        return self.func, self.args


# Entries today's libraries do not write (other platforms or versions): reviewed, not exercised here.
NOT_WRITTEN_HERE = {
    ("pathlib", "WindowsPath"): "only on Windows",
    ("numpy.core.multiarray", "_reconstruct"): "NumPy 1.x spelling", ("numpy.core.multiarray", "scalar"): "NumPy 1.x",
    ("numpy.core.numeric", "_frombuffer"): "NumPy 1.x spelling",
    ("torch.jit._pickle", "build_tensor_from_id"): "TorchScript mobile",
}


def test_every_reviewed_inert_entry_is_safe_in_a_real_file(tmp_path, fixtures_dir):
    files = [*_inert_cases(tmp_path),
        fixtures_dir / "dcp" / ".metadata", fixtures_dir / "torchscript.pt",
        fixtures_dir / "megatron" / "dense" / ".metadata",  # megatron-core's save plans (all_local_plans)
        fixtures_dir / "deepspeed" / "zero1_fp32" / "global_step1" / "zero_pp_rank_0_mp_rank_00_optim_states.pt",
        # DTensors a rank saved (Shard, Replicate, Partial, _StridedShard; mesh and spec): fixtures/ranks/generate.py
        *(fixtures_dir / "ranks" / d / n for d, n in (("fsdp2_tp", "a.pt"), ("partial", "rank0.pt"),
                                                      ("strided", "rank1.pt")))]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        objs = _benign()
    files.append(save(tmp_path, "jagged.pth", objs["jagged"]))
    files.append(save(tmp_path, "rng.pth", objs["numpy_rng"]))
    report = scan([str(p) for p in files])
    seen = set()
    for f in report.files:
        assert f.verdict == "safe", (f.path, [g for g in f.globals if g.severity != "safe"], f.findings, f.errors)
        for g in f.globals:
            seen.add((g.module, g.name))
            seen.add(severity._compat(g.module, g.name))
    missing = set(inert.REVIEWED) - seen - set(NOT_WRITTEN_HERE)
    assert not missing, sorted(missing)


def test_inert_entries_have_a_reason_and_are_not_known_dangerous():
    for key, why in inert.REVIEWED.items():
        assert why and len(why) < 120, key
        assert severity.severity(*key) == "safe", key
    unsafe = sorted(k for k in inert.WEIGHTS_ONLY if severity.severity(*k) != "safe")
    assert not unsafe and len(inert.WEIGHTS_ONLY) > 100, unsafe  # torch's defaults are inert as they stand


# --------------------------------------------------------------- --allow-global


def test_allow_global_lifts_exactly_that_global(mylab, tmp_path, run_cli):
    path = save(tmp_path, "two.pth", {"w": torch.ones(2), "net": mylab.Net(), "s": mylab.WithState()})
    r = run_cli("scan", "--json", str(path), "--allow-global", "mylab.Net")
    doc = json.loads(r.out)
    assert r.code == 1 and doc["files"][0]["verdict"] == "dangerous"
    sev = {f"{g['module']}.{g['name']}": g["severity"] for g in doc["files"][0]["globals"]}
    assert sev["mylab.Net"] == "safe" and sev["mylab.WithState"] == "dangerous"
    assert not any("mylab.Net" in x["message"] for x in doc["files"][0]["findings"])
    both = ["--allow-global", "mylab.Net", "--allow-global", "mylab.WithState"]
    assert run_cli("scan", str(path), *both).code == 0
    g = gate([str(path)], allow_globals=["mylab.Net", "mylab.WithState"], strict=True)
    checks = {c.name: c for c in g.files[0].checks}
    assert checks["loads-safely"].passed and checks["warnings"].passed, checks
    assert not next(c for c in gate([str(path)], allow_globals=["mylab.Net"]).files[0].checks
                    if c.name == "loads-safely").passed
    assert run_cli("gate", str(path), *both, "--strict").code == 0
    failed = run_cli("gate", str(path), "--allow-global", "mylab.Net")
    assert failed.code == 1 and "constructs mylab.WithState" in failed.out and "constructs mylab.Net" not in failed.out


def test_allow_global_never_lifts_a_name_that_runs_code(tmp_path, run_cli):
    import os

    path = save(tmp_path, "system.pth", {"x": _Via(os.system, "true")})
    r = run_cli("scan", str(path), "--allow-global", "posix.system", "--allow-global", "os.system")
    assert r.code == 1 and "posix.system" in r.out


_SLOT_SWAP = textwrap.dedent('''
    import os, sys


    class Evil:
        def __del__(self):
            open(os.environ["CKPT_MARKER"], "w").close()
''')


def _slot_swap_pickle(module: str) -> bytes:
    """argparse.Namespace() (inert), then BUILD (None, {"__class__": module.Evil}): setattr swaps its class."""
    return (b"\x80\x02cargparse\nNamespace\n)RN}X\x09\x00\x00\x00__class__c" + module.encode() + b"\nEvil\n"
            b"s\x86b.")


def test_a_global_set_as_a_slot_attribute_by_build_is_judged_as_constructed(tmp_path, run_cli):
    """BUILD's slot state is setattr'd: {"__class__": X} turns an inert Namespace into an X, whose __del__ runs.

    The unpickle below (a real pickle.load, with the class importable) proves the code runs; scan must call
    the file dangerous naming the class, not merely suspicious (X is never called by an opcode).
    """
    (tmp_path / "slotswap_mod.py").write_text(_SLOT_SWAP)
    path = tmp_path / "slot_swap.pkl"
    path.write_bytes(_slot_swap_pickle("slotswap_mod"))
    marker = tmp_path / "ran"
    subprocess.run([sys.executable, "-c", f"import pickle, gc; pickle.load(open({str(path)!r}, 'rb')); gc.collect()"],
                   check=True, cwd=tmp_path, env={**__import__("os").environ, "CKPT_MARKER": str(marker),
                                                  "PYTHONPATH": str(tmp_path)})
    assert marker.exists(), "the class swap did not run: the case proves nothing"
    r = run_cli("scan", str(path), "--json")
    report = json.loads(r.out)["files"][0]
    assert r.code == 1 and report["verdict"] == "dangerous", r
    assert {"module": "slotswap_mod", "name": "Evil", "severity": "dangerous"} in [
        {k: g[k] for k in ("module", "name", "severity")} for g in report["globals"]]
