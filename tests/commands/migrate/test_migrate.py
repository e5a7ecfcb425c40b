"""ckpt migrate on real files: key rules, formats, metadata, ties, conflicts and verification."""
from __future__ import annotations

import json
import os
import stat
import struct
import sys
from collections import OrderedDict
from pathlib import Path

import pytest
import torch
from models import TinyMLP, TinyMLPv2
from safetensors import safe_open
from safetensors.torch import load_file, load_model

from ckpt_tool.commands.migrate import migrate
from ckpt_tool.errors import OutputExists, RuleConflict, UnsafeContentError, UsageError
from tests.helpers.bits import raw_bytes, same_bits

MODELS = str(Path(__file__).resolve().parents[3] / "fixtures" / "models.py")


def leftovers(folder: Path) -> list[str]:
    """Temporary files migrate might have left behind."""
    return sorted(p.name for p in folder.iterdir() if ".ckpt-tmp-" in p.name)


def reference() -> dict:
    return torch.load(Path(MODELS).parent / "tiny_mlp.pth", weights_only=True)


# ------------------------------------------------------------------ prefixes


@pytest.mark.parametrize("fixture, prefix", [
    ("tiny_mlp_dp.pth", "module."),        # DataParallel / DDP
    ("tiny_mlp_compiled.pth", "_orig_mod."),  # torch.compile
    ("lightning.ckpt", "model."),          # Lightning (under "state_dict")
])
@pytest.mark.parametrize("ext", [".safetensors", ".pth"])
def test_wrapper_prefix_stripped_loads_strictly_and_is_bit_identical(tmp_path, fixtures_dir, run_cli, fixture,
                                                                     prefix, ext):
    out = tmp_path / f"bare{ext}"
    r = run_cli("migrate", str(fixtures_dir / fixture), "-o", str(out), "--strip-prefix", prefix,
                "--target", f"{MODELS}:TinyMLP")
    assert r.code == 0, r
    assert "verified: cpu passed" in r.out
    if ext == ".safetensors":
        sd = load_file(str(out))
    else:
        full = torch.load(out, weights_only=True)
        sd = full["state_dict"] if fixture == "lightning.ckpt" else full
        mapped = torch.load(out, weights_only=True, mmap=True)
        mapped = mapped["state_dict"] if fixture == "lightning.ckpt" else mapped
        assert same_bits(dict(mapped), dict(sd))
    model = TinyMLP()
    model.load_state_dict(sd, strict=True)
    ref = reference()
    assert same_bits({k: sd[k] for k in ref}, ref)
    assert set(sd) == set(ref)


def test_json_report_has_the_contract_keys(tmp_path, fixtures_dir, run_cli):
    out = tmp_path / "bare.safetensors"
    r = run_cli("migrate", str(fixtures_dir / "tiny_mlp_dp.pth"), "-o", str(out), "--strip-prefix", "module.",
                "--json")
    assert r.code == 0, r
    doc = json.loads(r.out)
    for key in ("source", "output", "format", "renamed", "dropped", "tensors", "verified", "warnings"):
        assert key in doc
    assert doc["format"] == "safetensors"
    assert doc["verified"]["cpu"] is True
    assert {"from": "module.encoder.weight", "to": "encoder.weight"} in doc["renamed"]
    assert doc["dropped"] == []
    assert {t["key"] for t in doc["tensors"]} == set(reference())


def test_auto_infers_and_prints_rules_before_applying(tmp_path, fixtures_dir, run_cli):
    out = tmp_path / "fixed.pth"
    r = run_cli("migrate", str(fixtures_dir / "tiny_mlp_compiled.pth"), "-o", str(out),
                "--target", f"{MODELS}:TinyMLP", "--auto")
    assert r.code == 0, r
    assert r.out.splitlines()[0] == "inferred rules: --strip-prefix _orig_mod."
    TinyMLP().load_state_dict(torch.load(out, weights_only=True), strict=True)


def test_auto_needs_a_target(fixtures_dir, tmp_path, run_cli):
    r = run_cli("migrate", str(fixtures_dir / "tiny_mlp_dp.pth"), "-o", str(tmp_path / "x.pth"), "--auto")
    assert r.code == 2 and "--target" in r.err


# ------------------------------------------------------------- v1 -> v2


V1_TO_V2 = ["--rename", r"encoder\.(.*)=embed.\1", "--drop", "head.*", "--target", f"{MODELS}:TinyMLPv2"]


def test_v1_to_v2_reports_the_remaining_missing_keys_and_writes_nothing(tmp_path, fixtures_dir, run_cli):
    out = tmp_path / "v2.pth"
    r = run_cli("migrate", str(fixtures_dir / "tiny_mlp.pth"), "-o", str(out), *V1_TO_V2)
    assert r.code == 1, r
    assert "would NOT load with strict=True; nothing was written" in r.out
    assert "missing (the target has them, the output does not): extra.weight, extra.bias, head.weight, head.bias" \
        in r.out
    assert "--allow-missing 'head.*'" in r.out
    assert not out.exists() and not leftovers(tmp_path)


def test_v1_to_v2_json_names_the_missing_keys(tmp_path, fixtures_dir, run_cli):
    r = run_cli("migrate", str(fixtures_dir / "tiny_mlp.pth"), "-o", str(tmp_path / "v2.pth"), *V1_TO_V2, "--json")
    assert r.code == 1
    doc = json.loads(r.out)
    assert doc["target"]["missing"] == ["extra.weight", "extra.bias", "head.weight", "head.bias"]
    assert doc["written"] is False and doc["dropped"] == ["head.weight", "head.bias"]


def test_v1_to_v2_with_allowed_missing_head_loads(tmp_path, fixtures_dir, run_cli):
    out = tmp_path / "v2.safetensors"
    r = run_cli("migrate", str(fixtures_dir / "tiny_mlp.pth"), "-o", str(out), *V1_TO_V2,
                "--allow-missing", "head.*", "--allow-missing", "extra.*")
    assert r.code == 0, r
    model = TinyMLPv2()
    result = model.load_state_dict(load_file(str(out)), strict=False)
    assert sorted(result.missing_keys) == ["extra.bias", "extra.weight", "head.bias", "head.weight"]
    assert result.unexpected_keys == []
    assert raw_bytes(model.embed.weight) == raw_bytes(reference()["encoder.weight"])


def test_dry_run_prints_the_plan_and_writes_nothing(tmp_path, fixtures_dir, run_cli):
    out = tmp_path / "v2.pth"
    r = run_cli("migrate", str(fixtures_dir / "tiny_mlp.pth"), "-o", str(out), "--rename", r"encoder\.(.*)=embed.\1",
                "--drop", "head.*", "--dtype", "bf16", "--dry-run")
    assert r.code == 0, r
    assert "dry run: nothing written" in r.out
    lines = {" ".join(line.split()) for line in r.out.splitlines()}
    assert "encoder.weight embed.weight float32 -> bfloat16" in lines
    assert "head.bias (dropped) float32" in lines
    assert not out.exists() and list(tmp_path.iterdir()) == []


# ------------------------------------------------------------ conflicts


def test_two_keys_onto_one_is_rejected_before_writing(tmp_path, run_cli):
    src = tmp_path / "both.pth"
    torch.save({"module.w": torch.ones(2), "w": torch.zeros(2)}, src)
    out = tmp_path / "out.safetensors"
    r = run_cli("migrate", str(src), "-o", str(out), "--strip-prefix", "module.")
    assert r.code == 2
    assert "'module.w' and 'w' would both become 'w'" in r.err
    assert not out.exists() and not leftovers(tmp_path)


def test_rename_to_an_empty_key_is_rejected(tmp_path, fixtures_dir, run_cli):
    out = tmp_path / "out.pth"
    r = run_cli("migrate", str(fixtures_dir / "tiny_mlp.pth"), "-o", str(out), "--rename", "scale=")
    assert r.code == 2 and "turn 'scale' into an empty key" in r.err
    assert not out.exists()


def test_cast_of_a_non_floating_tensor_is_rejected(tmp_path, run_cli):
    src = tmp_path / "bn.pth"
    torch.save(torch.nn.BatchNorm1d(3).state_dict(), src)
    rules = tmp_path / "rules.toml"
    rules.write_text('[cast]\n"*" = "bfloat16"\n')
    out = tmp_path / "out.pth"
    r = run_cli("migrate", str(src), "-o", str(out), "--rules", str(rules))
    assert r.code == 2
    assert "cannot cast 'num_batches_tracked' (int64) to bfloat16" in r.err
    assert not out.exists() and not leftovers(tmp_path)


def test_dtype_casts_floating_tensors_only(tmp_path, run_cli):
    src = tmp_path / "bn.pth"
    bn = torch.nn.BatchNorm1d(3)
    bn.running_mean.copy_(torch.tensor([0.1, -0.0, float("nan")]))
    torch.save(bn.state_dict(), src)
    out = tmp_path / "bf16.safetensors"
    r = run_cli("migrate", str(src), "-o", str(out), "--dtype", "bf16")
    assert r.code == 0, r
    got = load_file(str(out))
    assert got["num_batches_tracked"].dtype == torch.int64
    for k, v in bn.state_dict().items():
        if v.is_floating_point():
            assert raw_bytes(got[k]) == raw_bytes(v.to(torch.bfloat16))


def test_unknown_dtype_and_bad_regex_are_usage_errors(tmp_path, fixtures_dir, run_cli):
    src = str(fixtures_dir / "tiny_mlp.pth")
    assert run_cli("migrate", src, "-o", str(tmp_path / "a.pth"), "--dtype", "fp7").code == 2
    r = run_cli("migrate", src, "-o", str(tmp_path / "a.pth"), "--rename", "([=x")
    assert r.code == 2 and "--rename" in r.err
    r = run_cli("migrate", src, "-o", str(tmp_path / "a.weird"))
    assert r.code == 2 and "--to" in r.err


# ------------------------------------------------------------- rules file


def test_rules_file_matches_the_options(tmp_path, fixtures_dir, run_cli):
    rules = tmp_path / "rules.toml"
    rules.write_text(
        'strip_prefix = ["module."]\n'
        'rename = ["encoder\\\\.(.*)=embed.\\\\1"]\n'
        'drop = ["head.*"]\n'
        'dtype = "float16"\n'
    )
    a, b = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    assert run_cli("migrate", str(fixtures_dir / "tiny_mlp_dp.pth"), "-o", str(a), "--rules", str(rules)).code == 0
    r = run_cli("migrate", str(fixtures_dir / "tiny_mlp_dp.pth"), "-o", str(b), "--strip-prefix", "module.",
                "--rename", r"encoder\.(.*)=embed.\1", "--drop", "head.*", "--dtype", "float16")
    assert r.code == 0, r
    sa, sb = load_file(str(a)), load_file(str(b))
    assert same_bits(sa, sb) and "embed.weight" in sa and sa["embed.weight"].dtype == torch.float16


def test_bad_rules_file_is_one_clear_error(tmp_path, fixtures_dir, run_cli):
    rules = tmp_path / "rules.toml"
    rules.write_text('strip = ["module."]\n')
    r = run_cli("migrate", str(fixtures_dir / "tiny_mlp.pth"), "-o", str(tmp_path / "a.pth"), "--rules", str(rules))
    assert r.code == 2 and "unknown keys in rules file: strip" in r.err and "Traceback" not in r.err


# --------------------------------------------------------------- metadata


def test_training_checkpoint_keeps_metadata_in_a_torch_output(tmp_path, fixtures_dir, run_cli):
    out = tmp_path / "light.ckpt"
    r = run_cli("migrate", str(fixtures_dir / "lightning.ckpt"), "-o", str(out), "--strip-prefix", "model.")
    assert r.code == 0, r
    src = torch.load(fixtures_dir / "lightning.ckpt", weights_only=True)
    got = torch.load(out, weights_only=True)
    assert list(got) == list(src)
    assert got["epoch"] == 1 and got["hyper_parameters"] == {"hidden": 16, "lr": 0.1}
    assert got["optimizer_states"][0]["param_groups"] == src["optimizer_states"][0]["param_groups"]
    for k, v in src["optimizer_states"][0]["state"].items():
        assert raw_bytes(got["optimizer_states"][0]["state"][k]["momentum_buffer"]) == raw_bytes(v["momentum_buffer"])
    assert list(got["state_dict"]) == [k[len("model."):] for k in src["state_dict"]]


def test_placeholder_metadata_is_written_back_as_it_was(tmp_path, fixtures_dir, run_cli):
    """Issue 15: an argparse.Namespace read as a placeholder is kept without --unsafe (same global and state)."""
    out = tmp_path / "train.pth"
    r = run_cli("migrate", str(fixtures_dir / "training.pth"), "-o", str(out))
    assert r.code == 0, r
    src = torch.load(fixtures_dir / "training.pth", weights_only=False)
    got = torch.load(out, weights_only=False)
    assert type(got["args"]) is type(src["args"]) and vars(got["args"]) == vars(src["args"])
    assert got["epoch"] == src["epoch"] and same_bits(dict(got["model"]), dict(src["model"]))
    out.unlink()
    r = run_cli("migrate", str(fixtures_dir / "training.pth"), "-o", str(out), "--state-dict-only")
    assert r.code == 0, r
    got = torch.load(out, weights_only=True)
    assert list(got) == list(torch.load(fixtures_dir / "training.pth", weights_only=False)["model"])


def test_unsafe_keeps_real_objects(tmp_path, fixtures_dir, run_cli):
    out = tmp_path / "train.pth"
    r = run_cli("migrate", str(fixtures_dir / "training.pth"), "-o", str(out), "--unsafe")
    assert r.code == 0, r
    src = torch.load(fixtures_dir / "training.pth", weights_only=False)
    got = torch.load(out, weights_only=False)
    assert got["args"] == src["args"] and got["epoch"] == 3
    assert same_bits(dict(got["model"]), dict(src["model"]))


def test_safetensors_output_keeps_string_metadata_and_names_the_rest(tmp_path, run_cli):
    src = tmp_path / "c.pth"
    torch.save({"state_dict": TinyMLP().state_dict(), "arch": "tiny_mlp", "epoch": 7}, src)
    out = tmp_path / "c.safetensors"
    r = run_cli("migrate", str(src), "-o", str(out), "--json")
    assert r.code == 0, r
    doc = json.loads(r.out)
    assert any("not kept in safetensors" in w and "epoch" in w for w in doc["warnings"])
    with safe_open(str(out), "pt") as f:
        assert f.metadata() == {"arch": "tiny_mlp", "format": "pt"}


def test_extra_state_entries_follow_the_key_rules(tmp_path, run_cli):
    src = tmp_path / "x.pth"
    sd = OrderedDict([("module.lin.weight", torch.ones(2, 2)), ("module.lin._extra_state", {"fp8": True})])
    torch.save(sd, src)
    out = tmp_path / "y.pth"
    assert run_cli("migrate", str(src), "-o", str(out), "--strip-prefix", "module.").code == 0
    got = torch.load(out, weights_only=True)
    assert list(got) == ["lin.weight", "lin._extra_state"] and got["lin._extra_state"] == {"fp8": True}


# --------------------------------------------------------------- ties


class Tied(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(10, 4)
        self.body = torch.nn.Linear(4, 4)
        self.lm_head = torch.nn.Linear(4, 10, bias=False)
        self.lm_head.weight = self.embed.weight


def test_tied_weights_round_trip_through_safetensors(tmp_path, run_cli):
    torch.manual_seed(0)
    model = Tied()
    src = tmp_path / "tied.pth"
    torch.save(model.state_dict(), src)
    st = tmp_path / "tied.safetensors"
    r = run_cli("migrate", str(src), "-o", str(st), "--json")
    assert r.code == 0, r
    assert json.loads(r.out)["aliases"] == {"lm_head.weight": "embed.weight"}
    with safe_open(str(st), "pt") as f:
        assert sorted(f.keys()) == ["body.bias", "body.weight", "embed.weight"]  # stored once
        assert f.metadata()["lm_head.weight"] == "embed.weight"
    # a reader using load_model gets the tie back from the model itself
    fresh = Tied()
    load_model(fresh, str(st), strict=True)  # strict: raises on a missing or unexpected key
    assert fresh.lm_head.weight is fresh.embed.weight and raw_bytes(fresh.embed.weight) == raw_bytes(model.embed.weight)
    # ckpt restores the tie: both keys, one storage
    r = run_cli("inspect", str(st), "--json")
    rows = {t["key"]: t for t in json.loads(r.out)["tensors"]}
    assert any("shares storage with embed.weight" in n for n in rows["lm_head.weight"]["notes"])
    # and a torch output written from it shares one storage again
    back = tmp_path / "back.pth"
    assert run_cli("migrate", str(st), "-o", str(back)).code == 0
    sd = torch.load(back, weights_only=True)
    assert sd["lm_head.weight"].untyped_storage().data_ptr() == sd["embed.weight"].untyped_storage().data_ptr()
    Tied().load_state_dict(sd, strict=True)


def test_torch_output_keeps_shared_storage_and_views(tmp_path):
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    sd = {"full": base, "t": base.t(), "row": base[1], "col": base[:, 2], "other": torch.ones(3)}
    src = tmp_path / "views.pth"
    torch.save(sd, src)
    out = tmp_path / "views_out.pth"
    report = migrate(src, out, rename=[("row", "row1")])
    assert report.ok and report.written
    got = torch.load(out, weights_only=True)
    ptrs = {k: v.untyped_storage().data_ptr() for k, v in got.items()}
    assert ptrs["full"] == ptrs["t"] == ptrs["row1"] == ptrs["col"] != ptrs["other"]
    assert got["t"].stride() == base.t().stride() and not got["t"].is_contiguous()
    assert raw_bytes(got["col"]) == raw_bytes(base[:, 2]) and raw_bytes(got["row1"]) == raw_bytes(base[1])


def test_safetensors_output_makes_views_contiguous_copies(tmp_path):
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    src = tmp_path / "views.pth"
    torch.save({"full": base, "t": base.t(), "col": base[:, 2]}, src)
    out = tmp_path / "views.safetensors"
    report = migrate(src, out)
    assert report.ok
    assert any("different views of one storage" in w for w in report.warnings)
    got = load_file(str(out))
    assert raw_bytes(got["t"]) == raw_bytes(base.t()) and raw_bytes(got["col"]) == raw_bytes(base[:, 2])


# ------------------------------------------------------- writer fidelity


DTYPES = [torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16,
          torch.int8, torch.uint8, torch.bool, torch.uint16, torch.uint32, torch.uint64, torch.float8_e4m3fn,
          torch.float8_e5m2, torch.complex64]


def _every_dtype() -> dict:
    out = {}
    for i, dt in enumerate(DTYPES):
        x = torch.arange(-6, 6, dtype=torch.float32).reshape(3, 4) * 1.5
        if dt == torch.bool:
            x = x > 0
        elif not dt.is_floating_point and not dt.is_complex:
            x = x.abs()
        out[f"t{i}.{str(dt)[6:]}"] = x.to(dt)
    out["scalar"] = torch.tensor(3.25)
    out["empty"] = torch.zeros(0, 5)
    out["nan"] = torch.tensor([float("nan"), -0.0, float("inf")])
    return out


@pytest.mark.parametrize("ext", [".pth", ".safetensors"])
def test_every_dtype_round_trips_bit_for_bit(tmp_path, ext):
    sd = _every_dtype()
    src = tmp_path / "all.pth"
    torch.save(sd, src)
    out = tmp_path / f"out{ext}"
    report = migrate(src, out, devices=["cpu"])
    assert report.ok and report.verified == {"cpu": True}
    got = load_file(str(out)) if ext == ".safetensors" else torch.load(out, weights_only=True)
    assert set(got) == set(sd)
    assert all(got[k].dtype == v.dtype and raw_bytes(got[k]) == raw_bytes(v) for k, v in sd.items())
    if ext == ".pth":
        assert same_bits(dict(torch.load(out, weights_only=True, mmap=True)), sd)
        import zipfile

        with zipfile.ZipFile(out) as z:
            assert z.testzip() is None  # real CRCs
            names = z.namelist()
        stem = "out"
        assert names[:4] == [f"{stem}/data.pkl", f"{stem}/.format_version", f"{stem}/.storage_alignment",
                             f"{stem}/byteorder"]
        assert names[-2:] == [f"{stem}/version", f"{stem}/.data/serialization_id"]


def test_torch_zip_storages_are_64_byte_aligned(tmp_path, fixtures_dir):
    import struct
    import zipfile

    out = tmp_path / "a.pth"
    assert migrate(fixtures_dir / "tiny_mlp.pth", out).ok
    data = out.read_bytes()
    with zipfile.ZipFile(out) as z:
        for info in z.infolist():
            if "/data/" in info.filename:
                n, x = struct.unpack("<HH", data[info.header_offset + 26:info.header_offset + 30])
                assert (info.header_offset + 30 + n + x) % 64 == 0


def test_zip64_records_are_read_by_torch_and_zipfile(tmp_path, fixtures_dir, monkeypatch):
    import zipfile

    from ckpt_tool.writers.torchsave import archive as torchzip

    monkeypatch.setattr(torchzip, "ZIP64_LIMIT", 64)  # force the >4 GiB code path on a small file
    out = tmp_path / "z64.pth"
    assert migrate(fixtures_dir / "tiny_mlp.pth", out).ok
    with zipfile.ZipFile(out) as z:
        assert z.testzip() is None
    assert same_bits(dict(torch.load(out, weights_only=True)), dict(reference()))
    assert same_bits(dict(torch.load(out, weights_only=True, mmap=True)), dict(reference()))


def test_numpy_state_dict_becomes_torch_tensors(tmp_path, fixtures_dir):
    out = tmp_path / "np.pth"
    assert migrate(fixtures_dir / "numpy_dict.pkl", out).ok
    assert same_bits(dict(torch.load(out, weights_only=True)), {k: v for k, v in reference().items()})


@pytest.mark.parametrize("fixture", ["tiny_mlp.safetensors", "sharded", "sharded_bin", "legacy.pth", "torchscript.pt",
                                     "whole_model.pth", "dcp", "numpy_dict.pkl"])
@pytest.mark.parametrize("ext", [".safetensors", ".pth"])
def test_every_input_format_migrates(tmp_path, fixtures_dir, fixture, ext):
    out = tmp_path / f"out{ext}"
    report = migrate(fixtures_dir / fixture, out, state_dict_only=True, devices=["cpu"])
    assert report.ok and report.written, report.failures
    got = load_file(str(out)) if ext == ".safetensors" else torch.load(out, weights_only=True)
    assert set(got) == {t.key for t in report.tensors}


# ------------------------------------------------------- folder outputs


def test_sharded_output_with_index(tmp_path, fixtures_dir, run_cli):
    out = tmp_path / "shards"
    r = run_cli("migrate", str(fixtures_dir / "tiny_mlp_dp.pth"), "-o", str(out), "--strip-prefix", "module.",
                "--max-shard-size", "500B")
    assert r.code == 0, r
    index = json.loads((out / "model.safetensors.index.json").read_text())
    shards = sorted({*index["weight_map"].values()})
    assert len(shards) >= 2 and all(os.path.getsize(out / s) <= 500 + 200 for s in shards[:-1])
    merged = {}
    for s in shards:
        merged.update(load_file(str(out / s)))
    ref = reference()
    assert set(merged) == set(index["weight_map"]) == set(ref)
    assert all(raw_bytes(merged[k]) == raw_bytes(ref[k]) for k in ref)
    assert index["metadata"]["total_size"] == sum(v.numel() * v.element_size() for v in ref.values())


def test_sharded_force_never_wipes_a_folder_with_other_files(tmp_path, fixtures_dir, run_cli):
    out = tmp_path / "model_dir"
    out.mkdir()
    (out / "config.json").write_text("{}")
    r = run_cli("migrate", str(fixtures_dir / "tiny_mlp.pth"), "-o", str(out), "--max-shard-size", "1GB", "--force")
    assert r.code == 2 and "config.json" in r.err
    assert (out / "config.json").read_text() == "{}"


def test_sharded_force_replaces_an_old_set_only_when_the_new_one_is_complete(tmp_path, fixtures_dir, run_cli):
    out = tmp_path / "shards"
    src = str(fixtures_dir / "tiny_mlp.pth")
    assert run_cli("migrate", src, "-o", str(out), "--max-shard-size", "300B").code == 0
    old = sorted(os.listdir(out))
    r = run_cli("migrate", src, "-o", str(out), "--max-shard-size", "300B")
    assert r.code == 2 and "--force" in r.err
    assert run_cli("migrate", src, "-o", str(out), "--max-shard-size", "5GB", "--force").code == 0
    assert sorted(os.listdir(out)) == ["model-00001-of-00001.safetensors", "model.safetensors.index.json"] != old
    assert not leftovers(tmp_path)


def test_dcp_output_loads_with_torch_distributed_checkpoint(tmp_path, fixtures_dir, run_cli):
    import warnings

    import torch.distributed.checkpoint as dcp

    out = tmp_path / "dcp"
    r = run_cli("migrate", str(fixtures_dir / "tiny_mlp_dp.pth"), "-o", str(out), "--strip-prefix", "module.",
                "--to", "dcp")
    assert r.code == 0, r
    ref = reference()
    got = {k: torch.empty_like(v) for k, v in ref.items()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load(got, checkpoint_id=str(out), no_dist=True)
    assert same_bits(got, dict(ref))


# ---------------------------------------------------------- write safety


def test_refuses_to_overwrite_without_force(tmp_path, fixtures_dir, run_cli):
    out = tmp_path / "out.pth"
    out.write_bytes(b"precious")
    r = run_cli("migrate", str(fixtures_dir / "tiny_mlp.pth"), "-o", str(out))
    assert r.code == 2 and "--force" in r.err
    assert out.read_bytes() == b"precious"
    os.chmod(out, 0o600)
    r = run_cli("migrate", str(fixtures_dir / "tiny_mlp.pth"), "-o", str(out), "--force")
    assert r.code == 0, r
    assert same_bits(dict(torch.load(out, weights_only=True)), dict(reference()))
    assert stat.S_IMODE(os.stat(out).st_mode) == 0o600  # --force keeps the replaced file's permissions


@pytest.mark.parametrize("how", ["same", "symlink", "hardlink"])
def test_output_equal_to_source_is_refused(tmp_path, fixtures_dir, run_cli, how):
    src = tmp_path / "src.pth"
    src.write_bytes((fixtures_dir / "tiny_mlp.pth").read_bytes())
    before = src.read_bytes()
    out = src
    if how == "symlink":
        out = tmp_path / "link.pth"
        out.symlink_to(src)
    elif how == "hardlink":
        out = tmp_path / "hard.pth"
        os.link(src, out)
    r = run_cli("migrate", str(src), "-o", str(out), "--force")
    assert r.code == 2 and "is the source" in r.err
    assert src.read_bytes() == before


def test_new_files_get_0644_minus_umask(tmp_path, fixtures_dir):
    code = ("import os, sys; os.umask(0o027); from ckpt_tool.commands.migrate import migrate; "
            f"migrate({str(fixtures_dir / 'tiny_mlp.pth')!r}, sys.argv[1])")
    import subprocess

    out = tmp_path / "m.safetensors"
    env = dict(os.environ, PYTHONPATH=str(Path(MODELS).parent.parent))
    subprocess.run([sys.executable, "-c", code, str(out)], check=True, env=env, timeout=120)
    assert stat.S_IMODE(os.stat(out).st_mode) == 0o640
    out2 = tmp_path / "n.safetensors"
    assert migrate(fixtures_dir / "tiny_mlp.pth", out2).ok
    from ckpt_tool.io.atomic.write import current_umask

    assert stat.S_IMODE(os.stat(out2).st_mode) == 0o644 & ~current_umask()


def test_missing_output_folder_is_a_usage_error(tmp_path, fixtures_dir, run_cli):
    r = run_cli("migrate", str(fixtures_dir / "tiny_mlp.pth"), "-o", str(tmp_path / "no" / "such" / "x.pth"))
    assert r.code == 2 and "does not exist" in r.err


def test_failed_verification_leaves_no_output(tmp_path, fixtures_dir):
    out = tmp_path / "out.safetensors"

    def corrupt(path: str) -> None:  # flip one byte of the last tensor between write and verify
        with open(path, "r+b") as f:
            f.seek(-3, os.SEEK_END)
            b = f.read(1)
            f.seek(-3, os.SEEK_END)
            f.write(bytes([b[0] ^ 0x55]))

    report = migrate(fixtures_dir / "tiny_mlp_dp.pth", out, strip_prefix=["module."], _after_write=corrupt)
    assert not report.ok and not report.written
    assert report.failures and "bytes differ" in report.failures[0]
    assert report.verified == {"cpu": False}
    assert not out.exists() and not leftovers(tmp_path)


def _flip_member_byte(path: str, member: str, at: int = 1) -> None:
    """Corrupt one byte of a stored zip member's data (torch.load would not notice: it skips CRCs)."""
    import struct
    import zipfile

    with zipfile.ZipFile(path) as z:
        info = next(i for i in z.infolist() if i.filename.endswith(member))
    data = bytearray(Path(path).read_bytes())
    n, x = struct.unpack("<HH", data[info.header_offset + 26:info.header_offset + 30])
    data[info.header_offset + 30 + n + x + at] ^= 0x01
    Path(path).write_bytes(bytes(data))


def test_failed_verification_keeps_the_old_output(tmp_path, fixtures_dir):
    out = tmp_path / "out.pth"
    out.write_bytes(b"the old output")
    report = migrate(fixtures_dir / "tiny_mlp.pth", out, force=True,
                     _after_write=lambda p: _flip_member_byte(p, "/data/1"))
    assert not report.ok and report.failures
    assert "encoder.weight: bytes differ" in report.failures[0]
    assert out.read_bytes() == b"the old output" and not leftovers(tmp_path)


def test_unreadable_output_is_a_failed_verification(tmp_path, fixtures_dir):
    out = tmp_path / "out.pth"

    def break_directory(path: str) -> None:
        data = bytearray(Path(path).read_bytes())
        data[data.rfind(b"PK\x01\x02")] ^= 0xFF  # the last central directory entry
        Path(path).write_bytes(bytes(data))

    report = migrate(fixtures_dir / "tiny_mlp.pth", out, _after_write=break_directory)
    assert not report.ok and "cannot be read back" in report.failures[0]
    assert not out.exists() and not leftovers(tmp_path)


def test_failed_verification_exits_1_on_the_command_line(tmp_path, fixtures_dir):
    """The CLI path, through a subprocess whose migrate has a corrupting hook installed."""
    out = tmp_path / "o.pth"
    code = (
        "import dataclasses, importlib, sys\n"
        "m = importlib.import_module('ckpt_tool.commands.migrate')  # the CLI imports run_migration from here\n"
        "orig = m.run_migration\n"
        "from test_migrate import _flip_member_byte\n"
        "flip = lambda p: _flip_member_byte(p, '/data/2')\n"
        "m.run_migration = lambda *a: orig(*a[:4], dataclasses.replace(a[4], after_write=flip))\n"
        "from ckpt_tool.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    import subprocess

    root = Path(MODELS).parent.parent
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), str(Path(__file__).parent), str(root / "fixtures")]))
    r = subprocess.run([sys.executable, "-c", code, "migrate", str(fixtures_dir / "tiny_mlp.pth"), "-o", str(out)],
                       check=False, capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 1, r.stderr
    assert "VERIFICATION FAILED" in r.stdout and "bytes differ" in r.stdout
    assert not out.exists()


def test_plain_migrate_does_not_import_torch(tmp_path, fixtures_dir):
    code = ("import sys; from ckpt_tool.commands.migrate import migrate; "
            f"r = migrate({str(fixtures_dir / 'tiny_mlp_dp.pth')!r}, sys.argv[1], strip_prefix=['module.'], "
            "devices=['cpu']); print(r.ok, 'torch' in sys.modules)")
    import subprocess

    env = dict(os.environ, PYTHONPATH=str(Path(MODELS).parent.parent))
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path / "o.safetensors")], check=False, capture_output=True,
                       text=True, env=env, timeout=120)
    assert r.stdout.split() == ["True", "False"], r.stderr


def test_api_errors_are_raised_before_writing(tmp_path, fixtures_dir):
    with pytest.raises(RuleConflict):
        migrate(fixtures_dir / "tiny_mlp.pth", tmp_path / "a.pth", rename=[(".*", "same")])
    (tmp_path / "exists.pth").write_bytes(b"x")
    with pytest.raises(OutputExists):
        migrate(fixtures_dir / "tiny_mlp.pth", tmp_path / "exists.pth")
    with pytest.raises(UsageError):
        migrate(fixtures_dir / "tiny_mlp.pth", tmp_path / "a.pth", drop=["*"])
    hostile = tmp_path / "exists.pth"  # a metadata entry calling os.system: never written back
    hostile.write_bytes(_pickled_call_in_zip())
    with pytest.raises(UnsafeContentError, match="system"):
        migrate(hostile, tmp_path / "a.pth")
    assert sorted(os.listdir(tmp_path)) == ["exists.pth"]


def _pickled_call_in_zip() -> bytes:
    """A torch zip whose metadata holds ``os.system("true")`` as a pickle records it (never run here)."""
    import io

    class Call:
        def __reduce__(self):
            return os.system, ("true",)

    buf = io.BytesIO()
    torch.save({"w": torch.ones(2), "hook": Call()}, buf)
    return buf.getvalue()


# ---------------------------------------------------------------- devices


def test_cpu_only_machine_reports_cuda_as_not_available(tmp_path, fixtures_dir, run_cli):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    r = run_cli("migrate", str(fixtures_dir / "tiny_mlp_dp.pth"), "-o", str(tmp_path / "a.pth"),
                "--strip-prefix", "module.", "--target", f"{MODELS}:TinyMLP", "--json")
    doc = json.loads(r.out)
    assert r.code == 0
    assert doc["verified"] == {"cpu": True}  # cuda is never reported as passed
    assert doc["devices"]["cuda"] == "not available"
    r = run_cli("migrate", str(fixtures_dir / "tiny_mlp_dp.pth"), "-o", str(tmp_path / "b.pth"),
                "--strip-prefix", "module.", "--device", "cuda")
    assert r.code == 2 and "CUDA is not available" in r.err and not (tmp_path / "b.pth").exists()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_verification_runs_for_real(tmp_path, fixtures_dir, run_cli):
    r = run_cli("migrate", str(fixtures_dir / "tiny_mlp_dp.pth"), "-o", str(tmp_path / "a.safetensors"),
                "--strip-prefix", "module.", "--target", f"{MODELS}:TinyMLP", "--json")
    assert r.code == 0, r
    doc = json.loads(r.out)
    cudas = [d for d in doc["verified"] if d.startswith("cuda:")]
    assert len(cudas) == torch.cuda.device_count() and all(doc["verified"][d] is True for d in cudas)
    assert doc["verified"]["cpu"] is True


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_verification_of_a_cast_on_every_cuda_device(tmp_path, fixtures_dir, run_cli):
    out = tmp_path / "a.pth"
    r = run_cli("migrate", str(fixtures_dir / "tiny_mlp.pth"), "-o", str(out), "--device", "cuda",
                "--target", f"{MODELS}:TinyMLP", "--dtype", "bf16", "--json")
    assert r.code == 0, r
    doc = json.loads(r.out)
    assert set(doc["verified"]) == {"cpu"} | {f"cuda:{i}" for i in range(torch.cuda.device_count())}
    assert all(doc["verified"].values())


def test_output_onto_a_shard_of_the_source_is_refused(tmp_path, fixtures_dir, run_cli):
    shards = tmp_path / "sharded"
    shards.mkdir()
    for p in (fixtures_dir / "sharded").iterdir():
        (shards / p.name).write_bytes(p.read_bytes())
    shard = shards / "model-00001-of-00002.safetensors"
    before = shard.read_bytes()
    r = run_cli("migrate", str(shards), "-o", str(shard), "--force")
    assert r.code == 2 and "is the source" in r.err and shard.read_bytes() == before
    r = run_cli("migrate", str(shards), "-o", str(shards), "--max-shard-size", "1GB", "--force")
    assert r.code == 2 and shard.read_bytes() == before


def test_to_must_agree_with_the_output_name(tmp_path, fixtures_dir, run_cli):
    r = run_cli("migrate", str(fixtures_dir / "tiny_mlp.pth"), "-o", str(tmp_path / "a.safetensors"), "--to", "pth")
    assert r.code == 2 and "matching name" in r.err


def test_disk_full_is_one_clear_error_and_leaves_nothing(tmp_path, fixtures_dir):
    """RLIMIT_FSIZE makes the write fail part-way (EFBIG), as a full disk would (ENOSPC)."""
    import subprocess

    code = ("import resource, sys; resource.setrlimit(resource.RLIMIT_FSIZE, (1500, 1500)); "
            "from ckpt_tool.cli import main; sys.exit(main(sys.argv[1:]))")
    out = tmp_path / "out" / "big.pth"
    out.parent.mkdir()
    env = dict(os.environ, PYTHONPATH=str(Path(MODELS).parent.parent))
    r = subprocess.run([sys.executable, "-c", code, "migrate", str(fixtures_dir / "training.pth"), "-o", str(out),
                        "--state-dict-only"], check=False, capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1 and "cannot write" in r.stderr and "nothing was left behind" in r.stderr
    assert list(out.parent.iterdir()) == []


def test_placeholder_inside_the_state_dict_is_written_back(tmp_path, run_cli):
    import argparse
    import io

    src = tmp_path / "te.pth"
    torch.save({"lin.weight": torch.ones(2), "lin._extra_state": argparse.Namespace(fmt="e4m3")}, src)
    r = run_cli("migrate", str(src), "-o", str(tmp_path / "o.pth"), "--state-dict-only")
    assert r.code == 0, r  # issue 15: written back as it was read (same global, same state)
    assert vars(torch.load(tmp_path / "o.pth", weights_only=False)["lin._extra_state"]) == {"fmt": "e4m3"}
    # io.BytesIO is judged dangerous (the _io module opens files): never written back, --drop suggested
    torch.save({"lin.weight": torch.ones(2), "lin._extra_state": io.BytesIO(b"fp8 meta")}, src)
    r = run_cli("migrate", str(src), "-o", str(tmp_path / "p.pth"), "--state-dict-only")
    assert r.code == 2 and "--drop 'lin._extra_state'" in r.err and "_io.BytesIO" in r.err
    r = run_cli("migrate", str(src), "-o", str(tmp_path / "p.pth"), "--drop", "lin._extra_state")
    assert r.code == 0, r


def test_state_dict_module_metadata_follows_the_prefix_rules(tmp_path):
    src = tmp_path / "dp.pth"
    torch.save(torch.nn.DataParallel(TinyMLP()).state_dict(), src)
    out = tmp_path / "bare.pth"
    assert migrate(src, out, strip_prefix=["module."], devices=["cpu"]).ok
    sd = torch.load(out, weights_only=True)
    assert list(sd._metadata) == ["", "encoder", "norm", "head"]
    assert list(sd._metadata) == list(TinyMLP().state_dict()._metadata)


# ----------------------------------------------- large tensors (streamed paths)


def _big_state_dict() -> dict:
    g = torch.Generator().manual_seed(0)
    big = torch.randn(1536, 1024, generator=g)  # 6 MiB: streamed in chunks, copied in the kernel
    return {"module.small": torch.randn(7, generator=g), "module.big": big, "module.big_t": big.t(),
            "module.half": torch.randn(1100, 1024, generator=g).to(torch.float16), "module.tail": torch.ones(3)}


@pytest.mark.parametrize("kernel_copy", [True, False])
@pytest.mark.parametrize("ext", [".pth", ".safetensors"])
def test_large_tensors_stream_bit_for_bit(tmp_path, monkeypatch, ext, kernel_copy):
    import zipfile

    if not kernel_copy:
        def refuse(*args, **kwargs):
            raise OSError(18, "Invalid cross-device link")  # EXDEV: what an old kernel says across file systems
        monkeypatch.setattr(os, "copy_file_range", refuse, raising=False)
    sd = _big_state_dict()
    src = tmp_path / "big.pth"
    torch.save(sd, src)
    out = tmp_path / f"big_out{ext}"
    report = migrate(src, out, strip_prefix=["module."], devices=["cpu"])
    assert report.ok and report.written, report.failures
    want = {k[len("module."):]: v for k, v in sd.items()}
    got = load_file(str(out)) if ext == ".safetensors" else torch.load(out, weights_only=True)
    assert set(got) == set(want) and all(raw_bytes(got[k]) == raw_bytes(v) for k, v in want.items())
    if ext == ".pth":
        with zipfile.ZipFile(out) as z:
            assert z.testzip() is None  # the CRC computed beside the kernel copy is right
        assert got["big_t"].untyped_storage().data_ptr() == got["big"].untyped_storage().data_ptr()


def test_a_flipped_byte_deep_in_a_large_tensor_is_caught(tmp_path):
    src = tmp_path / "big.pth"
    torch.save(_big_state_dict(), src)
    out = tmp_path / "big.safetensors"

    def corrupt(path: str) -> None:
        with open(path, "r+b") as f:
            f.seek(5 << 20)  # inside "big", in its second streamed chunk
            b = f.read(1)
            f.seek(5 << 20)
            f.write(bytes([b[0] ^ 0x80]))

    report = migrate(src, out, _after_write=corrupt, devices=["cpu"])
    assert not report.ok and any("bytes differ" in f for f in report.failures)
    assert not out.exists()


def test_large_tensors_checked_on_every_core_name_the_one_that_differs(tmp_path):
    # several tensors over 4 MiB (compared chunk by chunk on worker threads): one byte flipped
    # in the last chunk of one of them fails the migration and names that tensor and byte
    g = torch.Generator().manual_seed(5)
    sd = {f"w{i}": torch.randn(3_000_000, generator=g) for i in range(4)}
    src = tmp_path / "four.pth"
    torch.save(sd, src)
    out = tmp_path / "four.safetensors"
    flipped = {}

    def corrupt(path: str) -> None:
        with open(path, "r+b") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
            flipped["at"] = header["w2"]["data_offsets"][1] - 3  # in w2's last chunk
            f.seek(8 + n + flipped["at"])
            b = f.read(1)
            f.seek(8 + n + flipped["at"])
            f.write(bytes([b[0] ^ 0x01]))
            flipped["rel"] = flipped["at"] - header["w2"]["data_offsets"][0]

    report = migrate(src, out, _after_write=corrupt, devices=["cpu"])
    assert not report.ok
    assert list(report.failures) == [f"w2: bytes differ from the expected values (first at byte {flipped['rel']})"]
    assert not out.exists()
    assert migrate(src, out, devices=["cpu"]).ok  # and without the flip, all four are proven equal


def _ema_checkpoint(tmp_path):
    torch.manual_seed(0)
    a, b = TinyMLP().state_dict(), TinyMLP().state_dict()
    src = tmp_path / "ema.pth"
    torch.save({"model": a, "ema": {f"module.{k}": v for k, v in b.items()}, "step": 5}, src)
    return src, a, b


def test_key_writes_the_selected_state_dict_alone(tmp_path, run_cli):
    """Issue 23: `--key ema -o sub.pth` is the sub-dict users ask for (before, it needed --state-dict-only too)."""
    src, _, b = _ema_checkpoint(tmp_path)
    out = tmp_path / "out.pth"
    r = run_cli("migrate", str(src), "-o", str(out), "--key", "ema", "--strip-prefix", "module.")
    assert r.code == 0, r
    got = torch.load(out, weights_only=True)
    assert list(got) == list(b) and same_bits(dict(got), dict(b))
    TinyMLP().load_state_dict(got, strict=True)


def test_keep_container_writes_the_selected_state_dict_back_among_the_others(tmp_path, run_cli):
    src, a, b = _ema_checkpoint(tmp_path)
    out = tmp_path / "out.pth"
    r = run_cli("migrate", str(src), "-o", str(out), "--key", "ema", "--strip-prefix", "module.", "--keep-container")
    assert r.code == 0, r
    got = torch.load(out, weights_only=True)
    assert list(got) == ["model", "ema", "step"] and got["step"] == 5
    assert same_bits(dict(got["ema"]), dict(b)) and same_bits(dict(got["model"]), dict(a))


def test_keep_container_with_state_dict_only_is_a_usage_error(tmp_path, run_cli):
    src, _, _ = _ema_checkpoint(tmp_path)
    r = run_cli("migrate", str(src), "-o", str(tmp_path / "o.pth"), "--key", "ema", "--keep-container",
                "--state-dict-only")
    assert r.code == 2 and "contradict" in r.err and not (tmp_path / "o.pth").exists()


@pytest.mark.parametrize("out_name", ["late.pth", "late_shards"])
def test_an_output_that_appears_during_the_run_is_not_overwritten(tmp_path, fixtures_dir, out_name):
    """Another job creates OUT while this one writes: without --force, it is left alone."""
    out = tmp_path / out_name

    def someone_else_writes(path: str) -> None:
        if out_name.endswith(".pth"):
            out.write_bytes(b"the other job's output")
        else:
            out.mkdir()
            (out / "theirs.safetensors").write_bytes(b"x")

    with pytest.raises(OutputExists):
        migrate(fixtures_dir / "tiny_mlp.pth", out, max_shard_size="1GB" if "shards" in out_name else None,
                _after_write=someone_else_writes)
    if out_name.endswith(".pth"):
        assert out.read_bytes() == b"the other job's output"
    else:
        assert os.listdir(out) == ["theirs.safetensors"]
    assert not leftovers(tmp_path)


def test_a_flipped_byte_among_many_small_tensors_names_that_tensor(tmp_path):
    """Small tensors are verified a run at a time; a difference must still name its tensor."""
    src = tmp_path / "many.pth"
    torch.save({f"t{i:04d}": torch.full((8,), float(i)) for i in range(2000)}, src)
    out = tmp_path / "many.safetensors"
    ok = migrate(src, tmp_path / "fine.safetensors")
    assert ok.ok and ok.written

    def corrupt(path: str) -> None:  # one byte of tensor t1234's data, found through the header
        from safetensors import safe_open

        with safe_open(path, "np") as f:
            assert "t1234" in set(f.keys())
        with open(path, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(n))
        begin = 8 + n + header["t1234"]["data_offsets"][0] + 5
        with open(path, "r+b") as f:
            f.seek(begin)
            b = f.read(1)
            f.seek(begin)
            f.write(bytes([b[0] ^ 0x01]))

    report = migrate(src, out, _after_write=corrupt)
    assert not report.ok and not out.exists()
    assert report.failures[0].startswith("t1234: bytes differ"), report.failures


def test_verification_reports_byte_differences_beside_a_dtype_problem(tmp_path):
    # a dtype mismatch in one tensor must not hide that a large one differs too
    from safetensors.torch import save_file

    from ckpt_tool import load
    from ckpt_tool.commands.migrate.verify.compare import compare_pairs
    from ckpt_tool.writers.base import OutTensor

    g = torch.Generator().manual_seed(6)
    big = torch.randn(2_000_000, generator=g)
    save_file({"a": torch.ones(4), "b": big}, str(tmp_path / "src.safetensors"))
    save_file({"a": torch.ones(4, dtype=torch.float64), "b": big + 1}, str(tmp_path / "out.safetensors"))
    src, out = load(tmp_path / "src.safetensors"), load(tmp_path / "out.safetensors")
    pairs = [(k, OutTensor(k, src.by_key[k], "float32"), out.by_key[k]) for k in ("a", "b")]
    problems = compare_pairs(pairs)
    assert problems[0] == "a: dtype is float64, expected float32"
    assert problems[1:] == ["b: bytes differ from the expected values (first at byte 0)"]
