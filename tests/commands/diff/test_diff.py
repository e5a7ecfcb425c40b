"""ckpt diff on real files, checked against what load_state_dict itself reports."""
from __future__ import annotations

import argparse
import json
import math
import re
import shlex
import subprocess
import sys
import textwrap

import pytest
import torch
from conftest import ROOT
from models import Stack, TinyMLP, TinyMLPv2
from safetensors.torch import save_file

from ckpt_tool import diff
from ckpt_tool.commands.diff.command import compare_tensors
from ckpt_tool.keys.infer import suggest
from ckpt_tool.model import TensorMeta
from ckpt_tool.render.common import fold_keys, fold_labeled
from tests.helpers.errors import assert_one_line_error

MODELS = str(ROOT / "fixtures" / "models.py")


def torch_load_report(model, sd):
    """(missing, unexpected, size-mismatched keys) exactly as load_state_dict(strict=False) reports them."""
    size = []
    try:
        model.load_state_dict(sd, strict=False)
    except RuntimeError as exc:
        size = re.findall(r"size mismatch for ([^:]+):", str(exc))
    rest = {k: v for k, v in sd.items() if k not in size}
    result = model.load_state_dict(rest, strict=False)
    # a size-mismatched key is present in the checkpoint: torch never calls it missing
    return [k for k in result.missing_keys if k not in size], list(result.unexpected_keys), size


def run_suggested(run_cli, command: str):
    args = shlex.split(command)
    assert args[:2] == ["ckpt", "migrate"]
    return run_cli(*args[1:])


@pytest.fixture
def v1_v2(tmp_path):
    torch.manual_seed(0)
    v1, v2 = TinyMLP(), TinyMLPv2()
    a, b = tmp_path / "v1.pth", tmp_path / "v2.pth"
    torch.save(v1.state_dict(), a)
    torch.save(v2.state_dict(), b)
    return a, b, v1, v2


# ------------------------------------------------------------------ load_state_dict semantics


def test_v1_v2_target_matches_load_state_dict(v1_v2, run_cli):
    a = v1_v2[0]
    missing, unexpected, size = torch_load_report(TinyMLPv2(), torch.load(a, weights_only=True))
    r = run_cli("diff", str(a), "--target", f"{MODELS}:TinyMLPv2", "--json")
    assert r.code == 1, r
    doc = json.loads(r.out)
    assert doc["missing"] == missing == ["embed.weight", "embed.bias", "extra.weight", "extra.bias"]
    assert doc["unexpected"] == unexpected == ["encoder.weight", "encoder.bias"]
    assert [m["key"] for m in doc["shape_mismatch"]] == size == ["head.weight", "head.bias"]
    assert doc["shape_mismatch"][0] == {"key": "head.weight", "a": [4, 16], "b": [6, 16]}
    assert doc["dtype_mismatch"] == [] and doc["equal"] is False


def test_v1_v2_checkpoints_match_load_state_dict(v1_v2):
    a, b, _, _ = v1_v2
    report = diff(str(a), str(b))
    missing, unexpected, size = torch_load_report(TinyMLPv2(), torch.load(a, weights_only=True))
    assert list(report.missing) == missing
    assert list(report.unexpected) == unexpected
    assert [m.key for m in report.shape_mismatch] == size
    # and the other way round: v2's weights where v1 is expected
    back = diff(str(b), str(a))
    missing, unexpected, size = torch_load_report(TinyMLP(), torch.load(b, weights_only=True))
    assert (list(back.missing), list(back.unexpected), [m.key for m in back.shape_mismatch]) == (
        missing, unexpected, size)


def test_v1_v2_suggests_the_unique_shape_preserving_rename(v1_v2):
    a, b, _, _ = v1_v2
    s = diff(str(a), str(b)).suggestion
    assert s is not None
    assert s.rules.rename == ((r"encoder\.(.*)", r"embed.\1"),)
    assert (s.reconciled, s.remaining_missing, s.remaining_unexpected, s.remaining_shape_mismatch) == (2, 2, 0, 2)


def test_partial_fix_runs_and_leaves_only_what_renaming_cannot_fix(v1_v2, tmp_path, run_cli):
    a = v1_v2[0]
    report = diff(str(a), target=f"{MODELS}:TinyMLPv2")
    command = report.migrate_command(str(tmp_path / "renamed.pth"))
    assert "--target" not in command  # a strict-load check would refuse a partial fix
    assert run_suggested(run_cli, command).code == 0
    after = diff(str(tmp_path / "renamed.pth"), target=f"{MODELS}:TinyMLPv2")
    assert list(after.missing) == ["extra.weight", "extra.bias"] and after.unexpected == ()
    assert [m.key for m in after.shape_mismatch] == ["head.weight", "head.bias"]


def test_scalar_from_one_element_vector_is_not_a_mismatch():
    """load_state_dict's backward compatibility: a [1] tensor loads into a 0-d parameter."""
    a = [TensorMeta("s", "float32", (1,)), TensorMeta("t", "float32", (2,))]
    b = [TensorMeta("s", "float32", ()), TensorMeta("t", "float32", ())]
    _, _, shape, _ = compare_tensors(a, b)
    assert [m.key for m in shape] == ["t"]
    model = torch.nn.Module()
    model.s = torch.nn.Parameter(torch.tensor(0.0))
    model.t = torch.nn.Parameter(torch.tensor(0.0))
    assert torch_load_report(model, {"s": torch.ones(1), "t": torch.ones(2)})[2] == ["t"]


def test_dtype_mismatch_reported_with_target(tmp_path, run_cli):
    sd = {k: v.half() if v.is_floating_point() else v for k, v in TinyMLP().state_dict().items()}
    torch.save(sd, tmp_path / "half.pth")
    r = run_cli("diff", str(tmp_path / "half.pth"), "--target", f"{MODELS}:TinyMLP")
    assert r.code == 1
    assert "dtype mismatch (A -> B): 7" in r.out
    assert "all 7 keys: float16 -> float32" in r.out and "casts these" in r.out


# ------------------------------------------------------------------ prefixes and the migrate command


@pytest.mark.parametrize("fixture, prefix", [
    ("tiny_mlp_dp.pth", "module."),
    ("tiny_mlp_compiled.pth", "_orig_mod."),
    ("lightning.ckpt", "model."),
])
@pytest.mark.parametrize("against", ["target", "checkpoint"])
def test_wrapper_prefix_is_reconciled(fixtures_dir, run_cli, fixture, prefix, against):
    other = ["--target", f"{MODELS}:TinyMLP"] if against == "target" else [str(fixtures_dir / "tiny_mlp.pth")]
    r = run_cli("diff", str(fixtures_dir / fixture), *other, "--json")
    assert r.code == 1, r
    doc = json.loads(r.out)
    assert len(doc["missing"]) == len(doc["unexpected"]) == 7
    s = doc["suggestion"]
    assert s["rules"]["strip_prefix"] == [prefix] and s["rules"]["add_prefix"] is None
    assert s["options"] == ["--strip-prefix", prefix]
    assert (s["reconciled"], s["remaining_missing"], s["remaining_unexpected"], s["complete"]) == (7, 0, 0, True)
    assert f"--strip-prefix {prefix}" in s["command"]
    assert s["command"].startswith(f"ckpt migrate {fixtures_dir / fixture} -o ")


@pytest.mark.parametrize("fixture", ["tiny_mlp_dp.pth", "tiny_mlp_compiled.pth", "lightning.ckpt"])
@pytest.mark.parametrize("against", ["target", "checkpoint"])
def test_running_the_suggested_command_makes_diff_pass(tmp_path, fixtures_dir, run_cli, fixture, against):
    other = ["--target", f"{MODELS}:TinyMLP"] if against == "target" else [str(fixtures_dir / "tiny_mlp.pth")]
    if against == "target":
        report = diff(str(fixtures_dir / fixture), target=other[1])
    else:
        report = diff(str(fixtures_dir / fixture), other[0])
    out = tmp_path / ("fixed" + (".ckpt" if fixture.endswith(".ckpt") else ".pth"))
    command = report.migrate_command(str(out))
    r = run_suggested(run_cli, command)
    assert r.code == 0, r
    r = run_cli("diff", str(out), *other)
    assert r.code == 0, r
    assert "no key, shape or dtype differences" in r.out or "loads into the target" in r.out


def test_suggested_command_is_exact_and_quoted(fixtures_dir):
    report = diff(str(fixtures_dir / "tiny_mlp_dp.pth"), target=f"{MODELS}:TinyMLP")
    src = str(fixtures_dir / "tiny_mlp_dp.pth")
    assert report.migrate_command("out dir/fixed.pth") == (
        f"ckpt migrate {shlex.quote(src)} -o 'out dir/fixed.pth' --strip-prefix module. "
        f"--target {shlex.quote(MODELS + ':TinyMLP')}")
    assert report.suggestion.command("a.pth") == "ckpt migrate a.pth -o a.fixed.pth --strip-prefix module."


def test_ddp_and_compile_together(tmp_path):
    sd = TinyMLP().state_dict()
    torch.save({f"module._orig_mod.{k}": v for k, v in sd.items()}, tmp_path / "both.pth")
    s = diff(str(tmp_path / "both.pth"), target=f"{MODELS}:TinyMLP").suggestion
    assert s is not None and s.rules.strip_prefix == ("module._orig_mod.",) and s.complete


def test_missing_wrapper_prefix_is_added(tmp_path, fixtures_dir):
    """A bare state_dict loaded into a LightningModule-style wrapper (self.model = Net())."""
    path = tmp_path / "wrapper.py"
    path.write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(fixtures_dir)!r})
        from torch import nn
        from models import TinyMLP
        class Wrapper(nn.Module):
            def __init__(self):
                super().__init__()
                self.model = TinyMLP()
    """))
    report = diff(str(fixtures_dir / "tiny_mlp.pth"), target=f"{path}:Wrapper")
    assert report.suggestion is not None
    assert report.suggestion.rules.add_prefix == "model." and report.suggestion.complete
    assert "--add-prefix model." in report.migrate_command()


def test_renamed_attention_in_every_layer_is_one_rule():
    a = [TensorMeta(f"layers.{i}.attn.{p}.weight", "float32", (8, 8)) for i in range(4) for p in "qkv"]
    a += [TensorMeta(f"layers.{i}.mlp.weight", "float32", (8, 32)) for i in range(4)]
    b = [TensorMeta(t.key.replace(".attn.", ".self_attn."), t.dtype, t.shape) for t in a]
    s = suggest(a, b)
    assert s is not None and s.complete and s.reconciled == 12
    assert s.rules.rename == ((r"layers\.(\d+)\.attn\.(.*)", r"layers.\1.self_attn.\2"),)


def test_module_moved_under_a_parent():
    a = [TensorMeta("encoder.w", "float32", (4, 4)), TensorMeta("encoder.b", "float32", (4,)),
         TensorMeta("head.w", "float32", (2, 4))]
    b = [TensorMeta("backbone.encoder.w", "float32", (4, 4)), TensorMeta("backbone.encoder.b", "float32", (4,)),
         TensorMeta("head.w", "float32", (2, 4))]
    s = suggest(a, b)
    assert s is not None and s.complete and s.reconciled == 2


def test_ambiguous_rename_is_not_guessed():
    """Two missing modules with the shapes of the one unexpected module: no unique rename."""
    a = [TensorMeta("old.weight", "float32", (4, 4)), TensorMeta("head.weight", "float32", (2, 4))]
    b = [TensorMeta("new1.weight", "float32", (4, 4)), TensorMeta("new2.weight", "float32", (4, 4)),
         TensorMeta("head.weight", "float32", (2, 4))]
    assert suggest(a, b) is None


def test_no_suggestion_when_nothing_helps(v1_v2):
    a = [TensorMeta("x", "float32", (3,))]
    b = [TensorMeta("y", "float32", (5,))]
    assert suggest(a, b) is None


# ------------------------------------------------------------------ values


def perturbed_pair(tmp_path, delta=1e-3, dtype_b=None):
    torch.manual_seed(1)
    sd = TinyMLP().state_dict()
    other = {k: v.clone() for k, v in sd.items()}
    other["encoder.weight"][3, 5] += delta
    if dtype_b is not None:
        other = {k: v.to(dtype_b) for k, v in other.items()}
    a, b = tmp_path / "a.pth", tmp_path / "b.safetensors"
    torch.save(sd, a)
    save_file(other, b)
    return a, b, sd, other


def test_values_report_the_tensor_and_its_max_difference(tmp_path, run_cli):
    a, b, sd, other = perturbed_pair(tmp_path)
    expected = float((sd["encoder.weight"] - other["encoder.weight"]).abs().max())
    r = run_cli("diff", str(a), str(b), "--values", "--json")
    assert r.code == 1, r
    doc = json.loads(r.out)
    assert [v["key"] for v in doc["value_mismatch"]] == ["encoder.weight"]
    vm = doc["value_mismatch"][0]
    assert vm["max_abs"] == pytest.approx(expected, rel=1e-6) and vm["max_abs"] == pytest.approx(1e-3, rel=1e-3)
    assert vm["max_rel"] > 0 and vm["mismatched"] == 1 and vm["passed"] is False
    assert len(doc["values"]) == 7
    r = run_cli("diff", str(a), str(b), "--values", "--atol", "1e-2")
    assert r.code == 0, r
    assert "7 compared, 0 outside tolerance" in r.out


def test_values_rtol_is_relative_to_b(tmp_path):
    a, b, sd, other = perturbed_pair(tmp_path)
    x, y = sd["encoder.weight"][3, 5].item(), other["encoder.weight"][3, 5].item()
    rel = abs(x - y) / abs(y)
    assert diff(str(a), str(b), values=True, atol=0, rtol=rel * 1.01).equal
    assert not diff(str(a), str(b), values=True, atol=0, rtol=rel * 0.9).equal


def test_bf16_against_fp32_compares_in_fp32(tmp_path):
    a, b, sd, other = perturbed_pair(tmp_path, delta=0.0, dtype_b=torch.bfloat16)
    report = diff(str(a), str(b), values=True)
    assert len(report.dtype_mismatch) == 7 and report.dtype_mismatch[0].b == "bfloat16"
    by_key = {v.key: v for v in report.values}
    v = by_key["encoder.weight"]
    assert v.compared_as == "float32"
    assert v.max_abs == pytest.approx(float((sd["encoder.weight"] - other["encoder.weight"].float()).abs().max()))
    assert diff(str(a), str(b), values=True, atol=1e-2, rtol=1e-2).value_mismatch == ()


def test_nan_and_inf_semantics(tmp_path):
    base = torch.arange(6, dtype=torch.float32)
    same_nan = base.clone()
    same_nan[1] = float("nan")
    save_file({"t": same_nan, "u": base.clone(), "i": torch.tensor([1, 2, 3])}, tmp_path / "a.safetensors")
    moved = base.clone()
    moved[2] = float("nan")
    inf = base.clone()
    inf[0] = float("inf")
    save_file({"t": same_nan.clone(), "u": inf, "i": torch.tensor([1, 2, 4])}, tmp_path / "b.safetensors")
    save_file({"t": moved, "u": base.clone(), "i": torch.tensor([1, 2, 3])}, tmp_path / "c.safetensors")
    ab = {v.key: v for v in diff(str(tmp_path / "a.safetensors"), str(tmp_path / "b.safetensors"), values=True).values}
    assert ab["t"].passed and ab["t"].max_abs == 0 and ab["t"].nan_a == ab["t"].nan_b == 1  # equal_nan
    assert not ab["u"].passed and math.isinf(ab["u"].max_abs) and ab["u"].inf_b == 1
    assert not ab["i"].passed and ab["i"].max_abs == 1 and ab["i"].compared_as == "float64"
    ac = diff(str(tmp_path / "a.safetensors"), str(tmp_path / "c.safetensors"), values=True)
    t = {v.key: v for v in ac.values}["t"]
    assert not t.passed and t.mismatched == 2 and math.isinf(t.max_abs)
    doc = ac.to_json()
    json.dumps(doc, allow_nan=False)
    assert doc["value_mismatch"][0]["max_abs"] == "inf"


def test_checkpoint_equals_itself_with_values(fixtures_dir, run_cli):
    for name in ("tiny_mlp.pth", "training.pth", "sharded"):
        r = run_cli("diff", str(fixtures_dir / name), str(fixtures_dir / name), "--values")
        assert r.code == 0, r


def test_values_of_strided_views(tmp_path):
    """Saved views (a transposed weight, a slice of a shared storage) compare by their elements."""
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    torch.save({"t": base.t(), "s": base[1:3, ::2]}, tmp_path / "views.pth")
    save_file({"t": base.t().contiguous(), "s": base[1:3, ::2].contiguous()}, tmp_path / "dense.safetensors")
    report = diff(str(tmp_path / "views.pth"), str(tmp_path / "dense.safetensors"), values=True, atol=0, rtol=0)
    assert report.equal and len(report.values) == 2
    other = base.t().contiguous()
    other[5, 3] += 0.5
    save_file({"t": other, "s": base[1:3, ::2].contiguous()}, tmp_path / "moved.safetensors")
    report = diff(str(tmp_path / "views.pth"), str(tmp_path / "moved.safetensors"), values=True)
    assert [(v.key, v.max_abs, v.mismatched) for v in report.value_mismatch] == [("t", 0.5, 1)]


def test_values_across_formats(fixtures_dir, run_cli):
    r = run_cli("diff", str(fixtures_dir / "tiny_mlp.pth"), str(fixtures_dir / "tiny_mlp.safetensors"),
                "--values", "--atol", "0", "--rtol", "0")
    assert r.code == 0, r


def test_values_with_target_is_a_usage_error(fixtures_dir, run_cli):
    r = run_cli("diff", str(fixtures_dir / "tiny_mlp.pth"), "--target", f"{MODELS}:TinyMLP", "--values")
    assert r.code == 2 and "--values" in r.err


def test_progress_is_called_once_per_pair(fixtures_dir):
    calls: list[tuple[str, object]] = []

    class Recorder:  # the ckpt_tool.progress.Progress protocol
        def start(self, label: str, total: int) -> None:
            calls.append(("start", total))

        def advance(self, n: int) -> None:
            calls.append(("advance", n))

        def done(self) -> None:
            calls.append(("done", None))

    diff(str(fixtures_dir / "tiny_mlp.pth"), str(fixtures_dir / "legacy.pth"), values=True, progress=Recorder())
    assert calls == [("start", 7)] + [("advance", 1)] * 7 + [("done", None)]


# ------------------------------------------------------------------ metadata


def test_metadata_differences_with_deepdiff(tmp_path, fixtures_dir, run_cli):
    sd = TinyMLP().state_dict()
    common = {"model": sd, "optimizer": {"param_groups": [{"lr": 0.1, "params": [0]}], "state": {}}}
    torch.save({**common, "epoch": 3, "args": argparse.Namespace(lr=0.1, arch="tiny")}, tmp_path / "a.pth")
    torch.save({**common, "optimizer": {"param_groups": [{"lr": 0.01, "params": [0]}], "state": {}},
                "epoch": 4, "args": argparse.Namespace(lr=0.1, arch="tiny", extra=True)}, tmp_path / "b.pth")
    r = run_cli("diff", str(tmp_path / "a.pth"), str(tmp_path / "b.pth"), "--json")
    assert r.code == 0, r  # same weights: nothing breaks when loading
    meta = json.loads(r.out)["metadata_diff"]
    changed = {c["path"]: (c["a"], c["b"]) for c in meta["changed"]}
    assert changed == {"epoch": (3, 4), "optimizer.param_groups.0.lr": (0.1, 0.01)}
    assert meta["only_b"] == [{"path": "args.extra", "value": True}] and meta["only_a"] == []
    r = run_cli("diff", str(tmp_path / "a.pth"), str(tmp_path / "b.pth"), "--fail-on-metadata")
    assert r.code == 1 and "changed    epoch: 3 -> 4" in r.out and "metadata differs" in r.out


def test_identical_nested_metadata_needs_no_deepdiff(tmp_path):
    # a training checkpoint against a copy with other weights: nested metadata, all equal
    meta = {"optimizer": {"param_groups": [{"lr": 0.1, "betas": (0.9, 0.99), "params": [0, 1]}], "state": {}},
            "epoch": 3, "args": argparse.Namespace(lr=0.1, arch="tiny")}
    torch.save({"model": TinyMLP().state_dict(), **meta}, tmp_path / "a.pth")
    torch.save({"model": TinyMLP().state_dict(), **meta}, tmp_path / "b.pth")
    meta["optimizer"]["param_groups"][0]["eps"] = float("nan")  # NaN != NaN: DeepDiff reports it
    torch.save({"model": TinyMLP().state_dict(), **meta}, tmp_path / "c.pth")
    torch.save({"model": TinyMLP().state_dict(), **meta}, tmp_path / "d.pth")
    code = textwrap.dedent(f"""
        import sys
        from ckpt_tool import diff
        same = diff({str(tmp_path / 'a.pth')!r}, {str(tmp_path / 'b.pth')!r}).metadata_diff
        assert same == {{"changed": [], "only_a": [], "only_b": []}}, same
        assert "deepdiff" not in sys.modules, "deepdiff was imported"
        nan = diff({str(tmp_path / 'c.pth')!r}, {str(tmp_path / 'd.pth')!r}).metadata_diff
        assert [c["path"] for c in nan["changed"]] == ["optimizer.param_groups.0.eps"], nan
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=str(ROOT), timeout=120,
                       check=False)
    assert r.returncode == 0, r.stderr


def test_safetensors_metadata_is_diffed(fixtures_dir):
    report = diff(str(fixtures_dir / "tiny_mlp.pth"), str(fixtures_dir / "tiny_mlp.safetensors"))
    assert report.equal
    assert report.metadata_diff["only_b"][0]["path"] == "__metadata__"


def test_shard_layout_is_not_a_metadata_difference(fixtures_dir):
    report = diff(str(fixtures_dir / "sharded"), str(fixtures_dir / "sharded_bin"))
    assert report.equal and not report.metadata_differs


def test_metadata_only_diff_does_not_import_torch(fixtures_dir):
    code = textwrap.dedent(f"""
        import sys
        from ckpt_tool.cli import main
        codes = [main(["diff", {str(fixtures_dir / 'tiny_mlp.pth')!r}, {str(fixtures_dir / 'tiny_mlp.safetensors')!r}]),
                 main(["diff", {str(fixtures_dir / 'lightning.ckpt')!r}, {str(fixtures_dir / 'training.pth')!r},
                       "--json"]),
                 main(["diff", {str(fixtures_dir / 'sharded')!r}, {str(fixtures_dir / 'whole_model.pth')!r}])]
        assert "torch" not in sys.modules, "torch was imported"
        sys.exit(10 + sum(c * 3 ** i for i, c in enumerate(codes)))
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=str(ROOT), timeout=120,
                       check=False)
    assert "torch was imported" not in r.stderr
    assert r.returncode == 10 + 0 + 1 * 3 + 1 * 9, r.stderr


# ------------------------------------------------------------------ output


def test_text_output_folds_layers_and_json_keeps_every_key(tmp_path, run_cli):
    torch.save(Stack(n=8, d=8).state_dict(), tmp_path / "stack.pth")
    r = run_cli("diff", str(tmp_path / "stack.pth"), "--target", f"{MODELS}:Stack",
                "--target-kwargs", '{"n": 8, "d": 4}')
    assert r.code == 1
    assert "layers.{0..7}.weight  [8, 8] -> [4, 4]  (8 keys)" in r.out
    assert "layers.{0..7}.bias  [8] -> [4]  (8 keys)" in r.out
    r = run_cli("diff", str(tmp_path / "stack.pth"), "--target", f"{MODELS}:Stack", "--target-kwargs",
                '{"n": 8, "d": 4}', "--json")
    assert len(json.loads(r.out)["shape_mismatch"]) == 16


def test_text_output_quotes_torch_and_prints_the_fix(fixtures_dir, run_cli):
    r = run_cli("diff", str(fixtures_dir / "tiny_mlp_dp.pth"), "--target", f"{MODELS}:TinyMLP")
    assert r.code == 1
    assert 'Missing key(s) in state_dict: "scale"' in r.out
    assert 'Unexpected key(s) in state_dict: "module.scale"' in r.out
    assert "fix: --strip-prefix module.  reconciles 7 key(s); no key differences remain" in r.out
    assert "  ckpt migrate " in r.out


def test_quiet_prints_only_the_result(fixtures_dir, run_cli):
    r = run_cli("diff", "-q", str(fixtures_dir / "tiny_mlp.pth"), str(fixtures_dir / "legacy.pth"))
    assert r.code == 0 and r.out.strip() == (
        "result: no key, shape or dtype differences (values not compared; --values compares them)")


def test_plain_tensor_attribute_warning(tmp_path, run_cli, fixtures_dir):
    path = tmp_path / "plain.py"
    path.write_text(textwrap.dedent(f"""
        import sys, torch
        sys.path.insert(0, {str(fixtures_dir)!r})
        from models import TinyMLP
        class WithMask(TinyMLP):
            def __init__(self):
                super().__init__()
                self.mask = torch.ones(4)
    """))
    r = run_cli("diff", str(fixtures_dir / "tiny_mlp.pth"), "--target", f"{path}:WithMask", "--json")
    doc = json.loads(r.out)
    assert r.code == 0 and doc["equal"] is True
    assert doc["plain_tensor_attributes"] == ["mask"]
    assert any("plain attributes" in w and "mask" in w for w in doc["warnings"])


def test_json_has_the_contract_keys(fixtures_dir, run_cli):
    r = run_cli("diff", str(fixtures_dir / "tiny_mlp.pth"), str(fixtures_dir / "tiny_mlp_dp.pth"), "--json")
    doc = json.loads(r.out)
    for k in ("equal", "missing", "unexpected", "shape_mismatch", "dtype_mismatch", "value_mismatch",
              "metadata_diff", "suggestion"):
        assert k in doc
    # A lacks the prefix B has: the fix adds it
    assert doc["suggestion"]["rules"]["add_prefix"] == "module."


def test_key_and_key_b_select_state_dicts(tmp_path, run_cli):
    sd = TinyMLP().state_dict()
    torch.save({"ema": sd, "model": {k: v + 1 for k, v in sd.items()}}, tmp_path / "a.pth")
    torch.save({"weights": sd}, tmp_path / "b.pth")
    r = run_cli("diff", str(tmp_path / "a.pth"), str(tmp_path / "b.pth"), "--key", "ema", "--key-b", "weights",
                "--values")
    assert r.code == 0, r
    r = run_cli("diff", str(tmp_path / "a.pth"), str(tmp_path / "b.pth"), "--key", "model", "--key-b", "weights",
                "--values")
    assert r.code == 1, r


def test_fold_labeled_is_exact():
    keys = [f"b.{i}.e.{j}.w" for i in range(3) for j in range(2)] + ["b.3.e.0.w"]
    assert fold_keys(keys) == ["b.{0..2}.e.{0..1}.w  (6 keys)", "b.3.e.0.w"]
    assert fold_labeled([("l.0.w", "x"), ("l.1.w", "y"), ("l.2.w", "x")]) == [("l.{0,2}.w", "x", 2), ("l.1.w", "y", 1)]


# ------------------------------------------------------------------ bad input


@pytest.mark.parametrize("extra, needles", [
    (["--target", "no_such_module_xyz:Net"], ["no module named 'no_such_module_xyz'"]),
    (["--target", f"{MODELS}:make_tiny"], ["has no 'make_tiny'"]),
    (["--target", f"{MODELS}:torch"], ["not an nn.Module class"]),
    (["--target", f"{MODELS}:TinyMLP", "--target-kwargs", "{hidden: 3}"], ["--target-kwargs is not valid JSON"]),
    (["--target", f"{MODELS}:TinyMLP", "--target-kwargs", "[3]"], ["must be a JSON object"]),
    (["--target", f"{MODELS}:TinyMLP", "--target-kwargs", '{"hidden": -3}'], ["constructing it raised RuntimeError"]),
    (["--target", f"{MODELS}:TinyMLP", "--target-kwargs", '{"width": 3}'], ["does not accept", "width"]),
    ([], ["either a second checkpoint B or --target"]),
    (["B_PLACEHOLDER", "--target", f"{MODELS}:TinyMLP"], ["exactly one"]),
    (["--target-kwargs", '{"a": 1}', "B_PLACEHOLDER"], ["--target-kwargs needs --target"]),
    (["B_PLACEHOLDER", "--values", "--atol", "-1"], ["non-negative"]),
    (["--target", f"{MODELS}:TinyMLP", "--key-b", "model"], ["--key-b selects inside a second checkpoint"]),
])
def test_bad_input_is_one_line_exit_2(fixtures_dir, run_cli, extra, needles):
    extra = [str(fixtures_dir / "tiny_mlp.pth") if x == "B_PLACEHOLDER" else x for x in extra]
    assert_one_line_error(run_cli("diff", str(fixtures_dir / "tiny_mlp.pth"), *extra), *needles)


def test_missing_checkpoint_is_exit_2(tmp_path, fixtures_dir, run_cli):
    assert_one_line_error(run_cli("diff", str(tmp_path / "nope.pth"), str(fixtures_dir / "tiny_mlp.pth")),
                          "no such file")
    assert_one_line_error(run_cli("diff", str(fixtures_dir / "tiny_mlp.pth"), str(tmp_path / "nope.pth")),
                          "nope.pth")


def test_bad_target_in_a_subprocess_is_one_line(tmp_path, fixtures_dir):
    from conftest import run_subprocess

    bad = tmp_path / "bad.py"
    bad.write_text("import torch\nclass Net(torch.nn.Module):\n    def __init__(self):\n        1/0\n")
    r = run_subprocess("diff", str(fixtures_dir / "tiny_mlp.pth"), "--target", f"{bad}:Net")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
    assert "ZeroDivisionError" in r.stderr and "Traceback" not in r.stderr


# ------------------------------------------------------------------ memory on big files


def sparse_safetensors(path, n_tensors, shape, dtype="BF16", itemsize=2, prefix=""):
    """A safetensors file whose data region is a hole: GiBs on paper, no disk used, reads as zeros."""
    import struct

    header, offset = {}, 0
    size = itemsize * math.prod(shape)
    for i in range(n_tensors):
        header[f"{prefix}layers.{i}.weight"] = {"dtype": dtype, "shape": list(shape),
                                                "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        f.truncate(8 + len(raw) + offset)


def peak_rss_mib(code: str) -> float:
    """Peak resident memory of a fresh interpreter running ``code``.

    VmHWM, not ru_maxrss: ru_maxrss is inherited from the (torch-laden) pytest process across fork/exec.
    """
    wrapper = code + ("\nhwm = [l for l in open('/proc/self/status') if l.startswith('VmHWM:')][0]"
                      "\nprint('PEAK', hwm.split()[1])\n")
    r = subprocess.run([sys.executable, "-c", wrapper], capture_output=True, text=True, cwd=str(ROOT), timeout=300,
                       check=False)
    assert r.returncode == 0, r.stderr
    return int(r.stdout.split("PEAK")[-1]) / 1024


@pytest.mark.skipif(sys.platform != "linux", reason="/proc/self/status and sparse files as on Linux")
def test_metadata_diff_of_multi_gib_files_reads_no_tensor_data(tmp_path):
    a, b = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    sparse_safetensors(a, 16, (8192, 8192))  # 2 GiB each
    sparse_safetensors(b, 16, (8192, 8192), prefix="module.")
    peak = peak_rss_mib(
        f"from ckpt_tool.cli import main\nimport sys\nassert main(['diff', {str(a)!r}, {str(b)!r}, '-q']) == 1\n"
        "assert 'torch' not in sys.modules\n")
    assert peak < 200, f"peak {peak:.0f} MiB for a 2 GiB pair: tensor data was read"


@pytest.mark.skipif(sys.platform != "linux", reason="/proc/self/status and sparse files as on Linux")
def test_values_memory_stays_far_below_the_largest_tensor(tmp_path):
    a, b = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    sparse_safetensors(a, 1, (4096, 4096))  # a 32 MiB tensor
    sparse_safetensors(b, 1, (4096, 4096), dtype="F32", itemsize=4)  # 64 MiB: not bit-identical, compared in fp32
    baseline = peak_rss_mib("import torch, safetensors, ckpt_tool.commands.diff.command, deepdiff")
    peak = peak_rss_mib(
        f"from ckpt_tool import diff\nr = diff({str(a)!r}, {str(b)!r}, values=True)\n"
        "assert len(r.values) == 1 and not r.value_mismatch and r.values[0].numel == 4096 * 4096\n")
    # reading the pair whole would add 96 MiB (and more in temporaries); chunk by chunk adds ~25 MiB
    assert peak - baseline < 64, f"{peak - baseline:.0f} MiB above torch's own for 32/64 MiB tensors"
