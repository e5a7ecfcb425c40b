"""Building --target modules: specs, meta construction, fallbacks, and every bad spec."""
from __future__ import annotations

import json
import textwrap

import pytest
import torch
from models import TinyMLP

from ckpt_tool.errors import TargetError, UsageError
from ckpt_tool.tensors.target import build_target, parse_target_kwargs

MODELS = "fixtures/models.py"


def torch_view(sd):
    return {k: (str(v.dtype).replace("torch.", ""), tuple(v.shape)) for k, v in sd.items()}


def target_view(target):
    return {t.key: (t.dtype, t.shape) for t in target.tensors}


def write(tmp_path, name, body):
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return path


@pytest.fixture
def at_root(monkeypatch, fixtures_dir):
    monkeypatch.chdir(fixtures_dir.parent)


def test_class_from_file_is_built_on_meta_with_torch_state_dict(at_root):
    target = build_target(f"{MODELS}:TinyMLP")
    assert target.device == "meta"
    assert target_view(target) == torch_view(TinyMLP().state_dict())
    assert all(t.storage is None and t.device == "meta" for t in target.tensors)
    assert "cache" not in target.keys  # non-persistent buffers never reach a state_dict
    assert target.warnings == () and target.plain_tensor_attributes == ()


def test_dotted_module_spec(at_root):
    # conftest puts fixtures/ on sys.path, so `models` is importable as a module
    assert target_view(build_target("models:TinyMLPv2")) == torch_view(
        __import__("models").TinyMLPv2().state_dict())


def test_package_in_current_folder_is_importable(tmp_path, monkeypatch):
    pkg = tmp_path / "mypkg_for_target"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    write(pkg, "nets.py", """
        from torch import nn
        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(3, 2)
    """)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.path", [p for p in __import__("sys").path if p not in ("", str(tmp_path))])
    target = build_target("mypkg_for_target.nets:Net")
    assert set(target.keys) == {"fc.weight", "fc.bias"}


def test_factory_function_and_kwargs(at_root):
    assert target_view(build_target(f"{MODELS}:make_tiny_mlp")) == torch_view(TinyMLP().state_dict())
    target = build_target(f"{MODELS}:TinyMLP", {"d_out": 6, "hidden": 32})
    assert target.by_key["head.weight"].shape == (6, 32)


def test_module_instance(tmp_path):
    path = write(tmp_path, "inst.py", """
        from torch import nn
        model = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 1))
    """)
    target = build_target(f"{path}:model")
    assert target.device == "cpu"
    assert set(target.keys) == {"0.weight", "0.bias", "2.weight", "2.bias"}


def test_meta_false_builds_real_cpu_tensors(at_root):
    target = build_target(f"{MODELS}:TinyMLP", meta=False)
    assert target.device == "cpu"
    assert target.module.encoder.weight.device.type == "cpu"
    assert not target.module.encoder.weight.is_meta


def test_meta_failure_falls_back_to_cpu_and_says_so(tmp_path):
    path = write(tmp_path, "needs_data.py", """
        from torch import nn
        class NeedsData(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(2, 2)
                self.norm_value = float(self.fc.weight.abs().sum().item())  # impossible on meta
    """)
    target = build_target(f"{path}:NeedsData")
    assert target.device == "cpu"
    assert len(target.warnings) == 1
    assert "meta device" in target.warnings[0] and "CPU" in target.warnings[0]
    assert set(target.keys) == {"fc.weight", "fc.bias"}


def test_plain_tensor_attributes_are_found(tmp_path):
    path = write(tmp_path, "plain.py", """
        import torch
        from torch import nn
        class Inner(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(2, 2)
                self.mask = torch.ones(2)          # never saved
        class Outer(nn.Module):
            def __init__(self):
                super().__init__()
                self.inner = Inner()
                self.table = [torch.zeros(3), 5]   # never saved either
                self.register_buffer("kept", torch.zeros(1))
    """)
    target = build_target(f"{path}:Outer")
    assert target.plain_tensor_attributes == ("table[0]", "inner.mask")
    assert "kept" in target.keys and "inner.mask" not in target.keys
    assert any("plain attributes" in w and "inner.mask" in w for w in target.warnings)


def test_lazy_parameters_are_reported(tmp_path):
    path = write(tmp_path, "lazy.py", """
        from torch import nn
        class Lazy(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.LazyLinear(3)
    """)
    target = build_target(f"{path}:Lazy")
    assert set(target.lazy) == {"fc.weight", "fc.bias"}
    assert any("lazy" in w for w in target.warnings)


@pytest.mark.parametrize("spec, needle", [
    ("no_such_package_xyz.models:Net", "no module named 'no_such_package_xyz'"),
    ("fixtures/nope.py:Net", "no such file"),
    ("fixtures/models.py", "expected 'package.module:Name'"),
    ("fixtures/models.py:Missing", "has no 'Missing'"),
    ("fixtures/models.py:torch", "not an nn.Module class"),
    ("fixtures/models.py:nn.Linear.forward", "needs arguments"),
    ("fixtures/models.py:torch.nn.init.calculate_gain", "needs arguments"),
])
def test_bad_specs(at_root, spec, needle):
    with pytest.raises(TargetError) as info:
        build_target(spec)
    assert needle in info.value.message
    assert "\n" not in info.value.message


def test_missing_name_lists_what_the_file_defines(at_root):
    with pytest.raises(TargetError) as info:
        build_target(f"{MODELS}:TinyMLP3")
    assert "TinyMLP, TinyMLPv2" in info.value.message and "make_tiny_mlp" in info.value.message


def test_not_a_module_class(tmp_path):
    path = write(tmp_path, "notmod.py", """
        class Config:
            pass
        VALUE = 3
        def returns_dict():
            return {"a": 1}
    """)
    for name, needle in [("Config", "the class Config, not an nn.Module"), ("VALUE", "is a int, not an nn.Module"),
                         ("returns_dict", "returned a dict, not an nn.Module")]:
        with pytest.raises(TargetError) as info:
            build_target(f"{path}:{name}")
        assert needle in info.value.message


def test_constructor_raising_names_the_exception(tmp_path):
    path = write(tmp_path, "boom.py", """
        from torch import nn
        class Boom(nn.Module):
            def __init__(self, size=3):
                super().__init__()
                raise ValueError(f"cannot build size {size}")
    """)
    with pytest.raises(TargetError) as info:
        build_target(f"{path}:Boom", {"size": 7})
    assert "ValueError: cannot build size 7" in info.value.message


def test_import_raising_names_the_exception(tmp_path):
    path = write(tmp_path, "bad_import.py", "raise RuntimeError('no GPU here')\n")
    with pytest.raises(TargetError) as info:
        build_target(f"{path}:Net")
    assert "RuntimeError: no GPU here" in info.value.message


def test_unknown_kwargs_fail_before_building(at_root):
    with pytest.raises(TargetError) as info:
        build_target(f"{MODELS}:TinyMLP", {"widht": 3})
    assert "does not accept these --target-kwargs" in info.value.message and "widht" in info.value.message


def test_kwargs_for_an_instance_are_refused(tmp_path):
    path = write(tmp_path, "inst2.py", "from torch import nn\nmodel = nn.Linear(2, 2)\n")
    with pytest.raises(TargetError, match="instance"):
        build_target(f"{path}:model", {"bias": False})


def test_parse_target_kwargs(tmp_path):
    assert parse_target_kwargs(None) == {}
    assert parse_target_kwargs("") == {}
    assert parse_target_kwargs('{"hidden": 32, "act": "gelu"}') == {"hidden": 32, "act": "gelu"}
    f = tmp_path / "kw.json"
    f.write_text(json.dumps({"d_out": 6}))
    assert parse_target_kwargs(f"@{f}") == {"d_out": 6}
    with pytest.raises(UsageError, match="not valid JSON"):
        parse_target_kwargs("{hidden: 32}")
    with pytest.raises(UsageError, match="must be a JSON object"):
        parse_target_kwargs("[1, 2]")
    with pytest.raises(UsageError, match="cannot read"):
        parse_target_kwargs(f"@{tmp_path / 'nope.json'}")


def test_user_code_printing_goes_to_stderr(tmp_path, run_cli, fixtures_dir):
    path = write(tmp_path, "chatty.py", """
        print("importing chatty")
        from torch import nn
        class Chatty(nn.Module):
            def __init__(self):
                super().__init__()
                print("building Chatty")
                self.fc = nn.Linear(2, 2)
    """)
    r = run_cli("diff", str(fixtures_dir / "tiny_mlp.pth"), "--target", f"{path}:Chatty", "--json")
    doc = json.loads(r.out)
    assert doc["b"] == f"{path}:Chatty"
    assert "building Chatty" in r.err


def test_build_target_result_is_loadable_by_torch(at_root):
    """The meta target's keys are what load_state_dict(strict=True) accepts."""
    target = build_target(f"{MODELS}:TinyMLP", meta=False)
    sd = torch.load("fixtures/tiny_mlp.pth", weights_only=True)
    assert set(sd) == set(target.keys)
    target.module.load_state_dict(sd, strict=True)
    assert isinstance(target.module, torch.nn.Module)
