"""`verified` means the values survived: casts that overflow or flush are counted per tensor, and a cast that
makes new inf/NaN fails before anything is published (issue 21)."""
from __future__ import annotations

import json
import math
import os

import pytest
import torch


def _files(folder):
    return sorted(os.listdir(folder))


@pytest.fixture
def wide(tmp_path):
    """float32 values that float16 cannot hold: 1e5 overflows, 1e-8 flushes to zero, 1e-6 becomes subnormal."""
    path = tmp_path / "wide.pth"
    torch.save({"big": torch.tensor([1e5, 1e-8, 1.0, -3e5]), "tiny": torch.tensor([1e-6, 2.0]),
                "fine": torch.ones(3), "steps": torch.tensor(7)}, path)
    return path


@pytest.mark.parametrize("ext", [".pth", ".safetensors"])
def test_cast_that_overflows_fails_and_publishes_nothing(run_cli, wide, tmp_path, ext):
    out = tmp_path / f"out{ext}"
    before = _files(tmp_path)
    r = run_cli("migrate", str(wide), "-o", str(out), "--dtype", "fp16")
    assert r.code == 1, r
    assert "'big' (2 of 4)" in r.out and "into inf/NaN" in r.out and "--allow-overflow" in r.out
    assert "nothing was written" in r.out
    assert not out.exists() and _files(tmp_path) == before  # no temporary left behind either
    r = run_cli("migrate", str(wide), "-o", str(out), "--dtype", "fp16", "--json")
    assert r.code == 1
    doc = json.loads(r.out)
    assert doc["written"] is False and doc["new_nonfinite"] == 2 and doc["overflow_allowed"] is False
    assert {c["key"]: c["new_nonfinite"] for c in doc["cast_loss"]} == {"big": 2, "tiny": 0, "fine": 0}
    assert doc["failures"] and "'big'" in doc["failures"][0]


def test_cast_failure_leaves_an_existing_output_as_it_was(run_cli, wide, tmp_path):
    out = tmp_path / "out.pth"
    out.write_bytes(b"old")
    r = run_cli("migrate", str(wide), "-o", str(out), "--dtype", "fp16", "--force")
    assert r.code == 1 and out.read_bytes() == b"old"


def test_allow_overflow_writes_and_says_so(run_cli, wide, tmp_path):
    out = tmp_path / "out.pth"
    r = run_cli("migrate", str(wide), "-o", str(out), "--dtype", "fp16", "--allow-overflow", "--json")
    assert r.code == 0, r
    doc = json.loads(r.out)
    assert doc["written"] and doc["overflow_allowed"] is True and doc["new_nonfinite"] == 2
    assert doc["flushed_to_zero"] == 1
    by_key = {c["key"]: c for c in doc["cast_loss"]}
    assert by_key["big"]["flushed_to_zero"] == 1 and by_key["tiny"]["subnormal"] == 1
    assert any("--allow-overflow" in w for w in doc["warnings"])
    assert any("flushed 1 nonzero value(s) to zero" in w and "'big'" in w for w in doc["warnings"])
    assert any("--allow-overflow" in c for c in doc["verified_checks"])
    sd = torch.load(out, weights_only=True)
    assert math.isinf(sd["big"][0].item()) and sd["big"][1].item() == 0.0
    r = run_cli("migrate", str(wide), "-o", str(tmp_path / "again.pth"), "--dtype", "fp16", "--allow-overflow")
    assert r.code == 0
    assert "accepted: --allow-overflow" in r.out
    assert "verified: cpu passed" in r.out and "2 value(s) became inf/NaN" in r.out


def test_pre_existing_inf_and_nan_are_not_new(run_cli, tmp_path):
    src = tmp_path / "nonfinite.pth"
    torch.save({"x": torch.tensor([float("inf"), float("nan"), -float("inf"), 1.5])}, src)
    r = run_cli("migrate", str(src), "-o", str(tmp_path / "out.safetensors"), "--dtype", "bf16", "--json")
    assert r.code == 0, r
    doc = json.loads(r.out)
    assert doc["new_nonfinite"] == 0 and doc["cast_loss"][0]["new_nonfinite"] == 0


def test_flush_to_zero_is_a_warning_with_counts(run_cli, tmp_path):
    src = tmp_path / "small.pth"
    torch.save({"w": torch.tensor([1e-42, 1e-40, 1.0, 0.0])}, src)  # fp32 subnormals below bf16's reach
    r = run_cli("migrate", str(src), "-o", str(tmp_path / "out.pth"), "--dtype", "bf16")
    assert r.code == 0, r
    assert "the cast flushed 1 nonzero value(s) to zero in 1 tensor(s): 'w' (1 of 4)" in r.out
    assert "1 nonzero value(s) became 0" in r.out


@pytest.mark.parametrize("dtype, values, expect", [
    ("float8_e4m3fn", [1000.0, 1.0], "clamped 1 out-of-range value(s)"),  # saturates to 448: a changed value
    ("float8_e5m2", [1e5, 1.0], "turned 1 finite value(s) into inf/NaN"),
    ("float8_e4m3fnuz", [1000.0, 1.0], "turned 1 finite value(s) into inf/NaN"),
])
def test_float8_targets_from_a_rules_file(run_cli, tmp_path, dtype, values, expect):
    src = tmp_path / "f.pth"
    torch.save({"a": torch.tensor(values), "b": torch.tensor([0.5])}, src)
    rules = tmp_path / "rules.toml"
    rules.write_text(f'[cast]\n"a" = "{dtype}"\n')
    out = tmp_path / "out.pth"
    r = run_cli("migrate", str(src), "-o", str(out), "--rules", str(rules))
    assert r.code == 1, r
    assert expect in r.out and "'a' (1 of 2)" in r.out and not out.exists()
    r = run_cli("migrate", str(src), "-o", str(out), "--rules", str(rules), "--allow-overflow")
    assert r.code == 0, r
    assert torch.load(out, weights_only=True)["a"].dtype == getattr(torch, dtype)


def test_dcp_output_counts_its_casts(run_cli, wide, tmp_path):
    out = tmp_path / "dcp_out"
    r = run_cli("migrate", str(wide), "-o", str(out), "--to", "dcp", "--dtype", "fp16")
    assert r.code == 1 and "'big'" in r.out and not out.exists()
    r = run_cli("migrate", str(wide), "-o", str(out), "--to", "dcp", "--dtype", "fp16", "--allow-overflow", "--json")
    assert r.code == 0, r
    assert json.loads(r.out)["new_nonfinite"] == 2


def test_tied_tensors_cast_once_are_counted_for_both(run_cli, tmp_path):
    shared = torch.tensor([1e5, 1.0])
    src = tmp_path / "tied.pth"
    torch.save({"a": shared, "b": shared}, src)
    r = run_cli("migrate", str(src), "-o", str(tmp_path / "out.pth"), "--dtype", "fp16", "--json")
    assert r.code == 1
    assert {c["key"]: c["new_nonfinite"] for c in json.loads(r.out)["cast_loss"]} == {"a": 1, "b": 1}


def test_verified_line_says_what_was_checked(run_cli, tmp_path):
    src = tmp_path / "m.pth"
    torch.save({"w": torch.ones(2, 2), "head": torch.ones(2), "n": torch.tensor(1)}, src)
    r = run_cli("migrate", str(src), "-o", str(tmp_path / "out.safetensors"), "--dtype", "bf16", "--drop", "head")
    assert r.code == 0, r
    line = next(ln for ln in r.out.splitlines() if ln.startswith("verified:"))
    assert "all 2 kept source tensors present, 1 dropped by your rules" in line
    assert "re-read and compared bit for bit" in line
    assert "1 cast(s) counted: 0 value(s) became inf/NaN" in line and "0 flushed to zero" in line


def test_a_source_tensor_missing_from_the_output_fails_naming_it(tmp_path):
    from ckpt_tool import migrate

    src = tmp_path / "m.pth"
    torch.save({"a": torch.ones(2), "b": torch.zeros(3)}, src)
    out = tmp_path / "out.pth"

    def lose_b(tmp: str) -> None:
        torch.save({"a": torch.ones(2)}, tmp)

    report = migrate(src, out, strip_prefix=["x."], _after_write=lose_b)
    assert not report.ok and not out.exists()
    assert any("source tensor 'b' is missing from the output" in f for f in report.failures), report.failures

    def lose_renamed(tmp: str) -> None:
        from safetensors.torch import save_file

        save_file({"m.a": torch.ones(2)}, tmp)

    out2 = tmp_path / "out.safetensors"
    report = migrate(src, out2, add_prefix="m.", _after_write=lose_renamed)
    assert not report.ok and not out2.exists()
    assert any("'b' is missing from the output (it should be 'm.b')" in f for f in report.failures)


@pytest.mark.parametrize("out_name, extra", [("par.safetensors", []), ("shards", ["--max-shard-size", "5KB"])])
def test_casts_written_by_worker_processes_are_counted_too(run_cli, tmp_path, out_name, extra):
    src = tmp_path / "many.pth"
    torch.save({f"w{i}": torch.full((1000,), 1e5 if i == 4 else 1.0) for i in range(6)}, src)
    out = tmp_path / out_name
    r = run_cli("migrate", str(src), "-o", str(out), "--dtype", "fp16", "--workers", "3", *extra)
    assert r.code == 1, r
    assert "'w4' (1000 of 1000)" in r.out and not out.exists()
    r = run_cli("migrate", str(src), "-o", str(out), "--dtype", "fp16", "--workers", "3", *extra,
                "--allow-overflow", "--json")
    assert r.code == 0, r
    doc = json.loads(r.out)
    assert doc["new_nonfinite"] == 1000 and len(doc["cast_loss"]) == 6
    assert any("all 6 kept source tensors present" in c for c in doc["verified_checks"])


_SPECIALS = [0.0, -0.0, 1e-45, 1e-40, 1e-30, 1e-8, 6e-5, 1e-3, 1.0, 240.0, 448.0, 460.0, 470.0, 1e3, 6e4, 65504.0,
             65519.0, 65521.0, 1e5, 3e38, float("inf"), -float("inf"), float("nan")]


@pytest.mark.parametrize("src", ["float64", "float32", "bfloat16", "float16"])
@pytest.mark.parametrize("out", ["float32", "bfloat16", "float16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz"])
def test_cast_counts_equal_a_value_by_value_comparison(src, out):
    """The bit-level counts (tensors/numerics/castloss.py) agree with comparing every value before and after
    the cast."""
    from ckpt_tool.tensors.numerics.castloss import _rounds_to_max, cast_with_loss

    g = torch.Generator().manual_seed(0)
    base = torch.tensor(_SPECIALS + [-v for v in _SPECIALS], dtype=torch.float64)
    rand = torch.randn(5000, generator=g, dtype=torch.float64) * torch.logspace(-45, 6, 5000, dtype=torch.float64)
    x = torch.cat([base, rand]).to(getattr(torch, src))
    y, loss = cast_with_loss(x, getattr(torch, out))
    assert torch.equal(y.view(torch.uint8), x.to(getattr(torch, out)).view(torch.uint8))
    xd, yd = x.double(), y.double()
    tiny_out, tiny_src = torch.finfo(y.dtype).smallest_normal, torch.finfo(x.dtype).smallest_normal
    if torch.finfo(y.dtype).max >= torch.finfo(x.dtype).max and tiny_out <= tiny_src \
            and torch.finfo(y.dtype).eps <= torch.finfo(x.dtype).eps:
        assert not loss.any  # a widening cast loses nothing
        return
    assert loss.new_nonfinite == int((torch.isfinite(xd) & ~torch.isfinite(yd)).sum())
    assert loss.flushed == int(((xd != 0) & ~torch.isnan(xd) & (yd == 0)).sum())
    assert loss.subnormal == int(((yd.abs() < tiny_out) & (yd != 0) & (xd.abs() >= tiny_src)).sum())
    assert loss.saturated == int(((xd.abs() >= _rounds_to_max(y.dtype)) & torch.isfinite(yd)).sum())


class _WithExtraState(torch.nn.Module):
    """A module whose state_dict holds a non-tensor entry (``_extra_state``), as Transformer Engine's do."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(2, 2)

    def get_extra_state(self) -> dict:
        return {"amax_history": [1.0, 2.0], "version": 3}

    def set_extra_state(self, state: dict) -> None:
        self.state = state


def test_state_dict_entries_without_tensors_are_named_when_safetensors_cannot_keep_them(run_cli, tmp_path):
    src = tmp_path / "extra.pth"
    torch.save(_WithExtraState().state_dict(), src)
    out = tmp_path / "extra.safetensors"
    r = run_cli("migrate", str(src), "-o", str(out), "--json")
    assert r.code == 0, r
    warnings = json.loads(r.out)["warnings"]
    lost = [w for w in warnings if "hold no tensor" in w]
    assert lost and "_extra_state" in lost[0] and "write a .pth" in lost[0], warnings
    kept = tmp_path / "extra.pth.out.pth"
    r = run_cli("migrate", str(src), "-o", str(kept), "--json")
    assert r.code == 0 and not [w for w in json.loads(r.out)["warnings"] if "hold no tensor" in w], r
    target = _WithExtraState()
    target.load_state_dict(torch.load(kept, weights_only=True), strict=True)  # the .pth keeps the entry
    assert target.state == {"amax_history": [1.0, 2.0], "version": 3}


def test_a_cast_ckpt_cannot_check_is_refused_and_writes_nothing(run_cli, tmp_path):
    """float8_e8m0fnu (an exponent-only dtype) has no cast check yet: refused up front (a target) or
    before publishing (a source), exit 2 with one line, never written unchecked."""
    src = tmp_path / "e8.pth"
    torch.save({"e": torch.ones(3).to(torch.float8_e8m0fnu), "f": torch.ones(3, dtype=torch.float64)}, src)
    for args in (["--dtype", "float8_e8m0fnu"], ["--dtype", "fp16"]):
        out = tmp_path / "out.pth"
        r = run_cli("migrate", str(src), "-o", str(out), *args)
        assert r.code == 2 and "cannot yet prove" in r.err and "bug" not in r.err, (args, r)
        assert not out.exists() and [p.name for p in tmp_path.iterdir()] == ["e8.pth"], args
