"""ckpt gate: each check catches what it is for, passes a clean checkpoint, and reports for CI."""
from __future__ import annotations

import hashlib
import json
import os
import xml.etree.ElementTree as ET

import pytest
import torch
from models import TinyMLP

from ckpt_tool import gate
from ckpt_tool.commands.gate.policy import Policy, load_policy, parse_size
from ckpt_tool.errors import UsageError


def target_spec(fixtures_dir) -> str:
    return f"{fixtures_dir / 'models.py'}:TinyMLP"


def sd() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    return TinyMLP().state_dict()


def check(report, name: str, index: int = 0):
    (found,) = [c for c in report.files[index].checks if c.name == name]
    return found


@pytest.fixture
def clean(tmp_path):
    path = tmp_path / "clean.pth"
    torch.save({"model": sd(), "epoch": 3, "config": {"lr": 0.1}}, path)
    return path


def test_clean_checkpoint_passes_every_check(clean, fixtures_dir, tmp_path):
    digest = hashlib.sha256(clean.read_bytes()).hexdigest()
    policy = tmp_path / "policy.toml"
    policy.write_text(
        "[gate]\n"
        f"target = {json.dumps(target_spec(fixtures_dir))}\n"
        "strict = true\n"
        'allowed_float_dtypes = ["float16", "bfloat16", "float32"]\n'
        'max_file_size = "1 MiB"\n'
        'required_metadata = ["epoch", "config.lr"]\n'
        "[gate.sha256]\n"
        f'"clean.pth" = "{digest}"\n'
    )
    report = gate([str(clean)], policy=load_policy(policy))
    assert report.passed, report
    assert report.exit_code == 0
    names = [c.name for c in report.files[0].checks]
    assert names == ["loads-safely", "weights-only", "matches-target", "no-nan-inf", "dtype-policy", "file-size",
                     "required-metadata", "sha256", "warnings"]
    assert not any(c.skipped for c in report.files[0].checks)


def test_module_prefix_against_the_bare_target_fails_with_the_fix(fixtures_dir):
    report = gate([str(fixtures_dir / "tiny_mlp_dp.pth")], target=target_spec(fixtures_dir))
    c = check(report, "matches-target")
    assert not c.passed
    assert "unexpected 7" in c.detail and "module.encoder.weight" in c.detail
    assert "ckpt migrate" in c.detail and "--strip-prefix module." in c.detail
    assert report.exit_code == 1


def test_resized_head_fails_with_both_shapes(tmp_path, fixtures_dir):
    path = tmp_path / "head6.pth"
    torch.save(TinyMLP(d_out=6).state_dict(), path)
    c = check(gate([str(path)], target=target_spec(fixtures_dir)), "matches-target")
    assert not c.passed
    assert "head.weight [6, 16] in the checkpoint, [4, 16] in the target" in c.detail


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_nan_or_inf_fails_naming_the_tensor(tmp_path, bad):
    state = sd()
    state["head.bias"][1] = bad
    path = tmp_path / "bad.pth"
    torch.save(state, path)
    c = check(gate([str(path)]), "no-nan-inf")
    assert not c.passed
    import math

    assert "head.bias" in c.detail and ("1 NaN" if math.isnan(bad) else "1 Inf") in c.detail
    skipped = check(gate([str(path)], nan_check=False), "no-nan-inf")
    assert skipped.passed and skipped.skipped


def test_nan_check_reads_large_tensors_in_chunks(tmp_path, monkeypatch):
    import importlib

    g = importlib.import_module("ckpt_tool.tensors.numerics.nonfinite")  # the NaN/Inf counting behind the check
    monkeypatch.setattr(g, "_CHUNK", 64)  # 16 floats per read: the chunked path on a tiny file
    x = torch.arange(100, dtype=torch.float32)
    x[97] = float("nan")
    x[3] = float("-inf")
    path = tmp_path / "big.pth"
    torch.save({"x": x, "view": x[10:60]}, path)
    c = check(gate([str(path)]), "no-nan-inf")
    assert "x (1 NaN, 1 Inf)" in c.detail
    assert "view" not in c.detail  # the view starts after the Inf and ends before the NaN


@pytest.mark.parametrize("allowed", [["float16"], ["bfloat16"], ["float32"], ["fp16", "bf16", "fp32"]])
def test_fp64_tensor_fails_the_dtype_policy(tmp_path, allowed):
    state = {k: v.to(torch.float32) for k, v in sd().items()}
    state["head.weight"] = state["head.weight"].double()
    path = tmp_path / "fp64.pth"
    torch.save(state, path)
    c = check(gate([str(path)], allowed_float_dtypes=allowed), "dtype-policy")
    assert not c.passed
    assert "float64: 1 tensor(s) (head.weight)" in c.detail


def test_dtype_policy_ignores_integer_buffers(tmp_path):
    path = tmp_path / "bn.pth"
    torch.save(torch.nn.BatchNorm1d(4).half().state_dict(), path)  # num_batches_tracked stays int64
    assert check(gate([str(path)], allowed_float_dtypes=["float16"]), "dtype-policy").passed


def test_missing_required_metadata_key_fails(fixtures_dir):
    path = str(fixtures_dir / "training.pth")
    c = check(gate([path], required_metadata=["epoch", "global_step"]), "required-metadata")
    assert not c.passed and "missing global_step" in c.detail and "epoch" in c.detail
    assert check(gate([path], required_metadata=["epoch", "args.lr"]), "required-metadata").passed


def test_required_metadata_in_safetensors_header(fixtures_dir):
    path = str(fixtures_dir / "tiny_mlp.safetensors")
    assert check(gate([path], required_metadata=["format"]), "required-metadata").passed
    assert not check(gate([path], required_metadata=["epoch"]), "required-metadata").passed


def test_wrong_sha256_fails_and_the_right_one_passes(clean):
    right = hashlib.sha256(clean.read_bytes()).hexdigest()
    wrong = "0" * 64
    c = check(gate([str(clean)], sha256=wrong), "sha256")
    assert not c.passed and right in c.detail
    assert check(gate([str(clean)], sha256=right.upper()), "sha256").passed


def test_size_limit(clean):
    assert not check(gate([str(clean)], max_file_size="1KB"), "file-size").passed
    assert check(gate([str(clean)], max_file_size=10_000_000), "file-size").passed


def test_dangerous_checkpoint_fails_loads_safely(tmp_path):
    from tests.helpers.malicious import Reduce

    path = tmp_path / "evil.pth"
    torch.save({"model": sd(), "args": Reduce(os.system, "true")}, path)
    c = check(gate([str(path)]), "loads-safely")
    assert not c.passed and "posix.system" in c.detail


def test_strict_fails_on_unknown_classes_and_warnings(fixtures_dir, tmp_path):
    # issue 21: training.pth's argparse.Namespace is inert now; a global only referenced (an unreviewed function,
    # never called) is what stays suspicious, and --allow-global lifts it in every check
    training = tmp_path / "referenced.pth"
    torch.save({"model": sd(), "init": torch.nn.init.xavier_uniform_}, training)
    training = str(training)
    relaxed = gate([training])
    assert check(relaxed, "loads-safely").passed and "fails with --strict" in check(relaxed, "loads-safely").detail
    assert "fails with --strict" in check(relaxed, "warnings").detail
    strict = gate([training], strict=True)
    assert not strict.passed
    loads = check(strict, "loads-safely")
    assert not loads.passed and "torch.nn.init.xavier_uniform_" in loads.detail
    assert not check(strict, "warnings").passed
    allowed = gate([training], strict=True, allow_globals=["torch.nn.init.xavier_uniform_"])
    assert check(allowed, "loads-safely").passed and check(allowed, "weights-only").passed
    tied = tmp_path / "tied.pth"
    w = torch.ones(4, 4)
    torch.save({"a.weight": w, "b.weight": w, "c": torch.ones(8, 8).t()}, tied)
    detail = check(gate([str(tied)], strict=True), "warnings").detail
    assert "share storage" in detail and "unusual layout" in detail


def test_strict_fails_on_a_compressed_member_torch_save_never_writes(tmp_path, run_cli):
    """torch.load inflates a deflated member (so ckpt reads it too), but torch.save never writes one: a warning,
    which --strict turns into a failure, naming the member and how far it inflates."""
    import zipfile

    src = tmp_path / "plain.pth"
    torch.save({"w": torch.zeros(4096)}, src)
    packed = tmp_path / "packed.pth"
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(packed, "w") as zout:
        for info in zin.infolist():
            method = zipfile.ZIP_DEFLATED if "/data/" in info.filename else zipfile.ZIP_STORED
            zout.writestr(zipfile.ZipInfo(info.filename), zin.read(info), compress_type=method)
    assert torch.equal(torch.load(packed, weights_only=True)["w"], torch.zeros(4096))  # the loader reads it
    relaxed = gate([str(packed)])
    assert relaxed.passed and "compressed, which torch.save never writes" in check(relaxed, "warnings").detail
    strict = gate([str(packed)], strict=True)
    assert not strict.passed and "'plain/data/0' inflates" in check(strict, "warnings").detail
    r = run_cli("inspect", str(packed))
    assert r.code == 0 and "compressed, which torch.save never writes" in r.out
    assert gate([str(src)], strict=True).passed  # what torch.save writes: no such warning


def test_sparse_tensors_are_named_warned_under_strict_and_written_back_to_pth(tmp_path, run_cli):
    """Sparse COO/CSR tensors: ckpt keeps them as records (never dropped in silence): inspect says so, --strict
    fails on it, a .pth output loads in torch equal to the source, a .safetensors output is refused naming them."""
    src = tmp_path / "sparse.pth"
    dense = torch.tensor([[0.0, 1.5, 0.0], [2.0, 0.0, 3.0]])
    torch.save({"w": torch.ones(2), "coo": dense.to_sparse(), "csr": dense.to_sparse_csr(),
                "group": [dense.to_sparse_csc()]}, src)
    r = run_cli("inspect", str(src))
    assert r.code == 0 and "coo: sparse_coo [2, 3]" in r.out and "csr: sparse_csr [2, 3]" in r.out, r.out
    assert "group.0: sparse_csc [2, 3]" in r.out, r.out  # inside a list too
    assert gate([str(src)]).passed
    assert "sparse_coo" in check(gate([str(src)], strict=True), "warnings").detail
    out = tmp_path / "out.pth"
    assert run_cli("migrate", str(src), "-o", str(out)).code == 0
    got, want = torch.load(out, weights_only=True), torch.load(src, weights_only=True)
    for k in ("coo", "csr"):
        assert got[k].layout == want[k].layout and torch.equal(got[k].to_dense(), want[k].to_dense()), k
    r = run_cli("migrate", str(src), "-o", str(tmp_path / "out.safetensors"))
    assert r.code == 2 and "'coo'" in r.err + r.out and not (tmp_path / "out.safetensors").exists()


def test_unreadable_file_is_an_error_and_the_others_are_still_checked(tmp_path, clean, run_cli):
    broken = tmp_path / "broken.pth"
    broken.write_bytes(clean.read_bytes()[:300])
    report = gate([str(broken), str(clean)])
    assert report.files[0].error and not report.files[0].passed
    assert report.files[1].passed
    assert report.exit_code == 2
    r = run_cli("gate", str(broken), str(clean))
    assert r.code == 2 and "broken.pth" in r.err and "Traceback" not in r.err


def test_policy_options_override_the_file(tmp_path, clean):
    policy = tmp_path / "p.toml"
    policy.write_text('nan_check = false\nallowed_float_dtypes = "float16"\n')
    pol = load_policy(policy)
    report = gate([str(clean)], policy=pol)
    assert check(report, "no-nan-inf").skipped
    assert not check(report, "dtype-policy").passed
    report = gate([str(clean)], policy=pol, nan_check=True, allowed_float_dtypes=["float32"])
    assert not check(report, "no-nan-inf").skipped
    assert check(report, "dtype-policy").passed


@pytest.mark.parametrize(
    "text, message",
    [
        ("nan_chek = false\n", "unknown policy key"),
        ('allowed_float_dtypes = ["float17"]\n', "unknown dtype"),
        ('max_file_size = "lots"\n', "not a size"),
        ("strict = 1\n", "true or false"),
        ("[gate\n", "not valid TOML"),
        ('sha256 = "abc"\n', "64 hexadecimal"),
    ],
)
def test_bad_policy_is_a_usage_error(tmp_path, text, message):
    policy = tmp_path / "p.toml"
    policy.write_text(text)
    with pytest.raises(UsageError, match=message):
        load_policy(policy)


def test_parse_size():
    assert parse_size("2 GiB") == 2 << 30
    assert parse_size("500MB") == 500_000_000
    assert parse_size(1234) == 1234


def test_policy_target_file_is_relative_to_the_policy(tmp_path, fixtures_dir):
    import shutil

    shutil.copy(fixtures_dir / "models.py", tmp_path / "models.py")
    (tmp_path / "ci.toml").write_text('[gate]\ntarget = "models.py:TinyMLP"\n')
    pol = load_policy(tmp_path / "ci.toml")
    assert pol.target == f"{tmp_path / 'models.py'}:TinyMLP"
    assert check(gate([str(fixtures_dir / "tiny_mlp.pth")], policy=pol), "matches-target").passed


def test_sharded_folder_and_dcp_folder(fixtures_dir):
    for folder in ("sharded", "dcp"):
        report = gate([str(fixtures_dir / folder)], max_file_size="10MB")
        assert report.passed, report


def test_json_and_junit_reports(run_cli, tmp_path, fixtures_dir):
    junit = tmp_path / "report.xml"
    r = run_cli("gate", "--json", "--junit", str(junit), "--target", target_spec(fixtures_dir),
                str(fixtures_dir / "tiny_mlp.pth"), str(fixtures_dir / "tiny_mlp_dp.pth"))
    assert r.code == 1
    doc = json.loads(r.out)
    assert doc["passed"] is False
    assert [f["passed"] for f in doc["files"]] == [True, False]
    for f in doc["files"]:
        assert {"path", "passed", "checks"} <= set(f)
        for c in f["checks"]:
            assert {"name", "passed", "detail"} <= set(c)
    root = ET.parse(junit).getroot()  # valid XML, or this raises
    assert root.tag == "testsuites"
    suites = root.findall("testsuite")
    assert [s.get("name") for s in suites] == [f["path"] for f in doc["files"]]
    for suite, f in zip(suites, doc["files"], strict=True):
        cases = suite.findall("testcase")
        assert [c.get("name") for c in cases] == [c["name"] for c in f["checks"]]
        failed = [c.get("name") for c in cases if c.find("failure") is not None]
        assert failed == [c["name"] for c in f["checks"] if not c["passed"]]
        assert int(suite.get("failures")) == len(failed)
    assert root.get("failures") == "1"


def test_text_output_and_exit_codes(run_cli, fixtures_dir, clean):
    r = run_cli("gate", str(clean))
    assert r.code == 0 and "PASSED" in r.out and "gate passed" in r.out
    r = run_cli("gate", "--sha256", "0" * 64, str(clean))
    assert r.code == 1 and "FAIL  sha256" in r.out
    r = run_cli("gate", "--sha256", "0" * 64, str(clean), str(clean))
    assert r.code == 2 and "single PATH" in r.err
    r = run_cli("gate", "--policy", str(clean) + ".missing.toml", str(clean))
    assert r.code == 2 and "policy file not found" in r.err


def test_policy_defaults():
    p = Policy()
    assert p.nan_check and not p.strict and p.target is None


def test_check_names_are_declared_once_and_print_as_before(run_cli, clean, tmp_path):
    from ckpt_tool.commands.gate.command import CheckName

    r = run_cli("gate", str(clean), "--json", "--junit", str(tmp_path / "j.xml"))
    names = [c["name"] for c in json.loads(r.out)["files"][0]["checks"]]
    assert names == ["loads-safely", "weights-only", "matches-target", "no-nan-inf", "dtype-policy", "file-size",
                     "required-metadata", "sha256", "warnings"]
    assert set(names) | {"readable"} == {n.value for n in CheckName}
    cases = ET.parse(tmp_path / "j.xml").getroot().iter("testcase")
    assert [c.get("name") for c in cases] == names
    text = run_cli("gate", str(clean)).out
    assert "CheckName" not in text and all(n in text for n in names)
