"""Real instances of the catalog's entries, and the audited child that unpickles them (tests/pickles).

``sample(entry)`` builds a value of the entry's class as a program would hold it (an Enum member, a dataclass
or namedtuple with values, a torch.nn module with small sizes, a library object its own constructor made);
``audited_load(paths, preload)`` loads each file with ``torch.load(weights_only=False)`` in one subprocess under
an audit hook that fails on a write, a process, a socket or an import outside the entry's own package.
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
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import torch

from ckpt_tool.pickles.catalog.entry import Entry


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


_SPECIAL: dict[tuple[str, str], Callable[[], object]] = {
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
    # the class or special form itself, as omegaconf keeps a node's type (a reference, never called)
    **{("pathlib", n): (lambda n=n: getattr(importlib.import_module("pathlib"), n)) for n in ("Path", "PurePath")},
    **{("typing", n): (lambda n=n: getattr(importlib.import_module("typing"), n))
       for n in ("Any", "Dict", "List", "Tuple", "Optional", "Union")},
    # third-party classes, built by their own constructors (tests/pickles/test_third_party_catalog.py)
    # AORecipeKwargs' default config is a torchao class (outside the catalog, judged on its own): hold none
    ("accelerate.utils.dataclasses", "AORecipeKwargs"): lambda: _without(
        importlib.import_module("accelerate.utils.dataclasses").AORecipeKwargs, config=None),
    ("accelerate.state", "PartialState"): lambda: importlib.import_module("accelerate.state").PartialState(cpu=True),
    ("accelerate.utils.deepspeed", "HfDeepSpeedConfig"): lambda: importlib.import_module(
        "accelerate.utils.deepspeed").HfDeepSpeedConfig({"train_batch_size": 1, "zero_optimization": {"stage": 2}}),
    ("transformers.integrations.deepspeed", "HfDeepSpeedConfig"): lambda: importlib.import_module(
        "transformers.integrations.deepspeed").HfDeepSpeedConfig({"train_batch_size": 1}),
    ("transformers.integrations.deepspeed", "HfTrainerDeepSpeedConfig"): lambda: importlib.import_module(
        "transformers.integrations.deepspeed").HfTrainerDeepSpeedConfig({"train_batch_size": "auto"}),
    ("omegaconf.dictconfig", "DictConfig"): lambda: importlib.import_module("omegaconf").OmegaConf.create(
        {"a": 1, "b": {"c": "${a}"}}),
    ("omegaconf.listconfig", "ListConfig"): lambda: importlib.import_module("omegaconf").OmegaConf.create([1, "x"]),
    ("omegaconf.nodes", "StringNode"): lambda: _node("StringNode", "text"),
    ("omegaconf.nodes", "PathNode"): lambda: _node("PathNode", Path("a/b")),
    ("omegaconf.nodes", "IntegerNode"): lambda: _node("IntegerNode", 3),
    ("omegaconf.nodes", "BytesNode"): lambda: _node("BytesNode", b"xy"),
    ("omegaconf.nodes", "FloatNode"): lambda: _node("FloatNode", 0.5),
    ("omegaconf.nodes", "BooleanNode"): lambda: _node("BooleanNode", True),
    ("omegaconf.nodes", "AnyNode"): lambda: _node("AnyNode", 7),
    ("omegaconf.nodes", "InterpolationResultNode"): lambda: _node("InterpolationResultNode", 4),
    ("omegaconf.nodes", "EnumNode"): lambda: importlib.import_module("omegaconf.nodes").EnumNode(
        enum_type=importlib.import_module("omegaconf").SCMode, value="DICT"),
    **{("torchao.quantization", n): (lambda n=n: _torchao(n))
       for n in ("Int8Tensor", "Float8Tensor", "IntxUnpackedToInt8Tensor")},
    ("mmengine.logging.history_buffer", "HistoryBuffer"): lambda: _history(),  # noqa: PLW0108 - defined below
    **{("mmengine.logging.history_buffer", f"HistoryBuffer.{m}"): (lambda m=m: getattr(
        importlib.import_module("mmengine.logging.history_buffer").HistoryBuffer, m))
       for m in ("min", "max", "current", "mean")},
    ("lightning_fabric.utilities.data", "AttributeDict"): lambda: importlib.import_module(
        "lightning_fabric.utilities.data").AttributeDict(lr=0.1, layers=[1, 2]),
    ("pytorch_lightning.utilities.parsing", "AttributeDict"): lambda: importlib.import_module(
        "pytorch_lightning.utilities.parsing").AttributeDict(lr=0.1),
}


def _without(cls: type, **fields: object) -> object:
    obj = _built_without_init(cls)
    for name, value in fields.items():
        object.__setattr__(obj, name, value)
    return obj


def _torchao(kind: str) -> object:
    """The weight torchao's quantize_ makes of a small Linear (the tensor subclass named ``kind``)."""
    q = importlib.import_module("torchao.quantization")
    config = {"Int8Tensor": "Int8WeightOnlyConfig", "Float8Tensor": "Float8WeightOnlyConfig",
              "IntxUnpackedToInt8Tensor": "IntxWeightOnlyConfig"}[kind]
    model = torch.nn.Sequential(torch.nn.Linear(32, 16))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        q.quantize_(model, getattr(q, config)())
    weight = model[0].weight
    assert type(weight).__name__ == kind, type(weight)
    return weight


def _history() -> object:
    buffer = importlib.import_module("mmengine.logging.history_buffer").HistoryBuffer()
    buffer.update(0.5)
    return buffer


def _node(kind: str, value: object) -> object:
    return getattr(importlib.import_module("omegaconf.nodes"), kind)(value)


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
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                return cls(**kwargs)
        except (TypeError, ValueError, AttributeError, AssertionError, ImportError, RuntimeError):
            return _built_without_init(cls)
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
    import importlib, warnings
    import torch, torch.nn, torch.distributed.fsdp, torch.distributed.checkpoint, torch.ao.quantization
    PRELOAD = ()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in PRELOAD:
            importlib.import_module(name)
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




def _built_without_init(cls: type) -> object:
    """A dataclass as unpickling builds it (object.__new__ + its fields' defaults): its __post_init__ may need
    hardware or a package this machine lacks, which is the library's business, not the pickle's."""
    obj = cls.__new__(cls)  # type: ignore[call-overload]
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            value = f.default
        elif f.default_factory is not dataclasses.MISSING:
            value = f.default_factory()
        else:
            value = _value(f.type, f.name)
        object.__setattr__(obj, f.name, value)
    return obj


def audited_load(paths: Mapping[str, Path], preload: Sequence[str] = ()) -> dict[str, str]:
    """label -> "loaded" or "raised X" for each file, loaded in one audited child (which fails on a side effect).

    ``preload``: modules imported before the audit starts (a library's own import-time code is the library's,
    the catalog judges construction and __setstate__)."""
    args = [f"{label}|{label.rsplit('.', 1)[0]}|{p}" for label, p in paths.items()]
    code = AUDIT.replace("PRELOAD = ()", f"PRELOAD = {tuple(preload)!r}")
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=300,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result: dict[str, str] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def judged_samples(entries: Sequence[Entry], folder: Path, preload: Sequence[str] = ()) -> tuple[
        dict[str, Path], dict[str, str], dict[str, object]]:
    """A sample of each entry saved in ``folder``; what the audited torch.load did with each, and ckpt's scan."""
    from ckpt_tool import scan

    paths: dict[str, Path] = {}
    for e in entries:
        obj = sample(e)
        if obj is None:
            continue
        label = f"{e.module}.{e.name}"
        paths[label] = folder / f"{len(paths)}.pt"
        torch.save({"value": obj}, paths[label])
    results = audited_load(paths, preload)
    verdicts: dict[str, object] = dict(zip(paths, scan([str(p) for p in paths.values()]).files, strict=True))
    return paths, results, verdicts
