"""The reviewed catalog (ckpt_tool/pickles/catalog/): complete for the installed torch, and each inert entry
unpickled for real, in an audited subprocess, without a side effect, and judged safe by ckpt.

Every inert class entry gets a real instance (an Enum member, a dataclass or namedtuple with values, a
torch.nn module built with small sizes), saved with torch.save. One subprocess loads them all with
``torch.load(weights_only=False)`` under an audit hook that fails on any write, process, socket, or
import of a module outside torch, the standard library and the entry's own; ckpt's scan of the same
files must say safe.
"""
from __future__ import annotations

import dataclasses
import enum
import importlib
import inspect
import json
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch

from ckpt_tool import scan
from ckpt_tool.pickles.catalog import CATALOG
from ckpt_tool.pickles.catalog.entry import Entry

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

INERT = sorted((e for e in CATALOG.values() if e.decision == "inert"), key=lambda e: e.pair)


def test_every_candidate_the_enumeration_finds_is_decided():
    """A torch upgrade that adds an enum, dataclass or module to the listed modules fails here, by name."""
    import catalog_candidates

    from ckpt_tool.pickles.inert import REVIEWED

    undecided = [f"{m}.{n}" for m, n, _, _ in catalog_candidates.candidates()
                 if (m, n) not in CATALOG and (m, n) not in REVIEWED]
    assert undecided == [], "run tools/catalog_candidates.py and review: " + ", ".join(undecided)


def test_every_entry_has_a_reason_and_a_named_review():
    for e in CATALOG.values():
        assert isinstance(e, Entry)
        assert len(e.reason) > 20 and e.reviewed, e
        assert e.decision in ("inert", "trampoline", "excluded"), e


def _resolve(e: Entry) -> object:
    obj: object = importlib.import_module(e.module)
    for part in e.name.split("."):
        obj = getattr(obj, part)
    return obj


def _value(annotation: object, name: str) -> object:
    text = str(annotation)
    if "bool" in text:
        return True
    if "int" in text:
        return 2
    if "float" in text:
        return 0.5
    if "str" in text:
        return name
    if "dtype" in text:
        return torch.bfloat16
    return None


_SPECIAL = {
    ("torch.nn.utils.rnn", "PackedSequence"): lambda: torch.nn.utils.rnn.pack_padded_sequence(
        torch.randn(3, 4, 2), torch.tensor([4, 3, 2]), batch_first=True),
    ("torch._C", "Generator"): lambda: torch.Generator().manual_seed(7),
    ("torch", "Generator"): lambda: torch.Generator().manual_seed(8),
    ("torch.distributed.fsdp", "DataParallelMeshDims"): lambda: __import__(
        "torch.distributed.fsdp", fromlist=["x"]).DataParallelMeshDims(shard="dp"),
    ("torch.utils.hooks", "RemovableHandle"): lambda: __import__("torch.utils.hooks", fromlist=["x"]).RemovableHandle(
        __import__("collections").OrderedDict()),
    ("torch.nn.modules.module", "_WrappedHook"): lambda: __import__(
        "torch.nn.modules.module", fromlist=["x"])._WrappedHook(torch.nn.functional.relu),
    ("torch.nn.modules.rnn", "RNNBase"): lambda: torch.nn.RNNBase("LSTM", 2, 2),
    ("torch.nn.modules.rnn", "RNN"): lambda: torch.nn.RNN(2, 2),
    ("torch.nn.modules.rnn", "LSTM"): lambda: torch.nn.LSTM(2, 2, proj_size=1),
    ("torch.nn.modules.rnn", "GRU"): lambda: torch.nn.GRU(2, 2, bidirectional=True),
    ("torch.nn.modules.adaptive", "AdaptiveLogSoftmaxWithLoss"): lambda: torch.nn.AdaptiveLogSoftmaxWithLoss(
        4, 10, [2]),
    ("torch.nn.modules.pooling", "FractionalMaxPool2d"): lambda: torch.nn.FractionalMaxPool2d(2, output_size=2),
    ("torch.nn.modules.pooling", "FractionalMaxPool3d"): lambda: torch.nn.FractionalMaxPool3d(2, output_size=2),
}


def sample(e: Entry) -> object:
    """A real instance of the entry's class (a member, for an Enum); None when none can be built here."""
    if e.pair in _SPECIAL:
        return _SPECIAL[e.pair]()
    cls = _resolve(e)
    if inspect.isroutine(cls):
        return cls  # a function: the pickle holds the reference, as a module's activation attribute does
    if not inspect.isclass(cls):
        return None
    if isinstance(cls, enum.EnumMeta):
        return next(iter(cls), None)  # type: ignore[call-overload]
    if issubclass(cls, tuple) and hasattr(cls, "n_fields"):  # a structseq
        return cls([torch.zeros(1)] * cls.n_sequence_fields)  # type: ignore[call-arg,attr-defined]
    if issubclass(cls, tuple) and hasattr(cls, "_fields"):
        try:
            return cls(*[torch.zeros(1) for _ in cls._fields])  # type: ignore[attr-defined]
        except (TypeError, ValueError, AttributeError):
            return None
    if dataclasses.is_dataclass(cls):
        kwargs = {f.name: _value(f.type, f.name) for f in dataclasses.fields(cls)
                  if f.init and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
        try:
            return cls(**kwargs)
        except (TypeError, ValueError, AttributeError, AssertionError):
            return None
    if issubclass(cls, torch.nn.Module):
        return _module(cls)
    return None


def _module(cls: type) -> object:
    params = [p for p in list(inspect.signature(cls).parameters.values())
              if p.default is inspect.Parameter.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    for size in (2, 4):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                return cls(**{p.name: _arg(p.name, size) for p in params})
        except (TypeError, ValueError, AssertionError, RuntimeError, AttributeError, IndexError):
            continue
    return None


def _arg(name: str, size: int) -> object:
    if name in ("modules", "args"):
        return [torch.nn.Linear(size, size)]
    if name in ("parameters", "values"):
        return [torch.nn.Parameter(torch.zeros(size))]
    if name == "cutoffs":
        return [size]
    if name in ("normalized_shape", "unflattened_size"):
        return (size,)
    if name in ("encoder_layer", "decoder_layer"):
        return (torch.nn.TransformerEncoderLayer if name == "encoder_layer" else torch.nn.TransformerDecoderLayer)(
            size, 1, dim_feedforward=size)
    return size


AUDIT = textwrap.dedent(
    """
    import json, sys
    sys.dont_write_bytecode = True
    import torch, torch.nn, torch.distributed.fsdp, torch.distributed.checkpoint, torch.ao.quantization
    allowed = set(sys.modules)
    current = []
    LOUD = ("os.system", "subprocess.Popen", "os.posix_spawn", "os.exec", "os.fork", "os.spawn", "socket.connect",
            "pty.spawn", "os.remove", "os.rename", "shutil.rmtree", "ctypes.dlopen", "os.kill")
    def hook(event, args):
        if not current:
            return
        if event.startswith(LOUD) or (event == "open" and isinstance(args[1], str) and set(args[1]) & set("wax+")):
            raise SystemExit(f"{current[0]}: ran {event} {args[:2]!r}")
        if event == "import":
            name = args[0]
            own = current[1].split(".")[0]
            if name not in allowed and not name.startswith(("torch", own, "encodings")) and name not in \\
                    sys.stdlib_module_names:
                raise SystemExit(f"{current[0]}: imported {name}")
    sys.addaudithook(hook)
    out = {}
    for arg in sys.argv[1:]:
        label, module, path = arg.split("|")
        data = open(path, "rb").read()
        import io
        current[:] = [label, module]
        try:
            torch.load(io.BytesIO(data), weights_only=False)
            out[label] = "loaded"
        except SystemExit:
            raise
        except Exception as exc:
            out[label] = f"raised {type(exc).__name__}"
        current[:] = []
    print(json.dumps(out))
    """
)


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    """(entry label -> path) for every entry with a sample, and what torch.load did with each."""
    folder = tmp_path_factory.mktemp("catalog")
    paths: dict[str, Path] = {}
    for e in INERT:
        obj = sample(e)
        if obj is None:
            continue
        label = f"{e.module}.{e.name}"
        path = folder / f"{len(paths)}.pt"
        torch.save({"value": obj}, path)
        paths[label] = path
    args = [f"{label}|{label.rsplit('.', 1)[0]}|{p}" for label, p in paths.items()]
    proc = subprocess.run([sys.executable, "-c", AUDIT, *args], capture_output=True, text=True, timeout=300,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    report = scan([str(p) for p in paths.values()])
    verdicts = {label: f for label, f in zip(paths, report.files, strict=True)}
    return paths, results, verdicts


@pytest.mark.parametrize("label", [f"{e.module}.{e.name}" for e in INERT])
def test_inert_entry_loads_without_side_effect_and_scans_safe(loaded, label):
    paths, results, verdicts = loaded
    if label not in paths:
        pytest.fail(f"{label}: the test builds no instance of it; add one to _SPECIAL")
    assert results[label] == "loaded", results[label]
    f = verdicts[label]
    assert f.verdict == "safe", (label, [(g.qualname, g.severity) for g in f.globals], f.findings)


def test_uncatalogued_class_is_dangerous_and_said_to_be_not_reviewed(tmp_path, run_cli):
    """Fail closed, without implying an exploit: a class outside the catalog is not reviewed."""
    path = tmp_path / "cfg.pkl"  # {"cfg": mylab.configs.Config()} as pickle protocol 2 writes it (NEWOBJ + BUILD)
    path.write_bytes(b"\x80\x02}q\x00X\x03\x00\x00\x00cfgq\x01cmylab.configs\nConfig\nq\x02)\x81q\x03}q\x04bs.")
    r = run_cli("scan", str(path))
    assert r.code == 1, r
    assert "not reviewed" in r.out and "no known exploit" in r.out, r.out
    r = run_cli("scan", str(ROOT / "fixtures" / "tiny_mlp.pth"))
    assert r.code == 0
