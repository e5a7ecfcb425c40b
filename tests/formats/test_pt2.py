"""torch.export .pt2 archives: read from the archive's own configs and members, never torch.export.load.

Each archive is written by the real torch.export.save; what ckpt reports is
compared with what torch.export.load returns.
"""
from __future__ import annotations

import json
import pickle
import zipfile
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
export = pytest.importorskip("torch.export")


class Net(torch.nn.Module):
    """Parameters (one tied), a persistent and a non-persistent buffer, a constant tensor, two dtypes."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Linear(3, 4)
        self.head = torch.nn.Linear(3, 4)
        self.head.weight = self.emb.weight  # tied: one storage under two names
        self.scale = torch.nn.Parameter(torch.randn(2, 2).half())
        self.register_buffer("running", torch.randn(4))
        self.register_buffer("scratch", torch.arange(4.0), persistent=False)
        self.table = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64)  # a lifted tensor constant

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.emb(x) + self.head(x) + self.running + self.scratch + self.table.float()
        return y + self.scale.float().sum()


@pytest.fixture(scope="module")
def pt2(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("pt2") / "net.pt2"
    torch.manual_seed(0)
    ep = torch.export.export(Net(), (torch.randn(2, 3),))
    torch.export.save(ep, str(path))
    return path


def _metas(tensors: dict) -> dict[str, tuple[str, list[int]]]:
    return {k: (str(v.dtype).removeprefix("torch."), list(v.shape)) for k, v in tensors.items()}


def _inspect(run_cli, *args: str) -> dict:
    r = run_cli("inspect", *args, "--json")
    assert r.code == 0, r
    return json.loads(r.out)


def test_inspect_lists_the_state_dict_and_constants_of_the_exported_program(pt2, run_cli):
    ep = torch.export.load(str(pt2))
    report = _inspect(run_cli, str(pt2))
    assert report["format"] == "torch-export"
    assert {t["key"]: (t["dtype"], t["shape"]) for t in report["tensors"]} == _metas(ep.state_dict)
    assert [t["key"] for t in report["tensors"]] == list(ep.state_dict)
    constants = report["metadata"]["torch_export"]["constants"]
    assert {k: (v["dtype"], v["shape"]) for k, v in constants.items()} == _metas(ep.constants)
    meta = report["metadata"]["torch_export"]
    assert meta["parameters"] == sum(isinstance(v, torch.nn.Parameter) for v in ep.state_dict.values())


def test_inspect_reads_no_code_and_imports_no_torch(pt2):
    import subprocess
    import sys

    from conftest import ROOT

    code = ("import sys, ckpt_tool; ck = ckpt_tool.load(sys.argv[1]); "
            "assert 'torch' not in sys.modules, 'torch imported'; print(len(ck.tensors))")
    out = subprocess.run([sys.executable, "-c", code, str(pt2)], check=False, capture_output=True, text=True, cwd=ROOT,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(len(torch.export.load(str(pt2)).state_dict))


@pytest.mark.parametrize("suffix", [".safetensors", ".pth"])
def test_migrate_writes_the_weights_torch_export_load_returns(pt2, tmp_path, run_cli, suffix):
    out = tmp_path / f"net{suffix}"
    r = run_cli("migrate", str(pt2), "-o", str(out))
    assert r.code == 0, r
    if suffix == ".safetensors":
        from safetensors.torch import load_file

        written = load_file(str(out))
    else:
        written = torch.load(str(out), weights_only=True)
    expected = torch.export.load(str(pt2)).state_dict
    tied = {"head.weight"} if suffix == ".safetensors" else set()  # safetensors stores a tie once
    assert set(written) == set(expected) - tied
    for key, value in expected.items():
        assert torch.equal(written[key if key not in tied else "emb.weight"], value.detach()), key
    net = Net()
    missing, unexpected = net.load_state_dict(written, strict=False)
    assert set(missing) == tied and not unexpected  # the tie fills what safetensors left out
    assert torch.equal(net.head.weight, expected["head.weight"])


def test_scan_of_a_clean_archive_and_of_a_tree_holding_one_is_safe(pt2, tmp_path, run_cli):
    r = run_cli("scan", str(pt2))
    assert r.code == 0, r
    (tmp_path / "tree").mkdir()
    (tmp_path / "tree" / "model.pt2").write_bytes(pt2.read_bytes())
    torch.save({"w": torch.ones(2)}, tmp_path / "tree" / "w.pth")
    r = run_cli("scan", str(tmp_path / "tree"))
    assert r.code == 0, r


class _Boom:
    def __reduce__(self):
        import os

        return (os.system, ("echo pwned",))


def _rewrite(src: Path, dst: Path, replace: dict[str, bytes], order=None, extra: dict[str, bytes] | None = None):
    with zipfile.ZipFile(src) as zin:
        infos = zin.infolist()
        if order is not None:
            infos = order(infos)
        with zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as zout:
            for info in infos:
                data = replace.get(info.filename.split("/", 1)[1], zin.read(info))
                zout.writestr(info.filename, data)
            for name, data in (extra or {}).items():
                zout.writestr(infos[0].filename.split("/", 1)[0] + "/" + name, data)


def test_a_hostile_sample_inputs_pickle_is_flagged(pt2, tmp_path, run_cli):
    bad = tmp_path / "bad.pt2"
    _rewrite(pt2, bad, {"data/sample_inputs/model.pt": pickle.dumps(_Boom())})
    r = run_cli("scan", str(bad), "--json")
    assert r.code == 1, r
    found = json.loads(r.out)["files"][0]
    assert any(g["name"] == "system" for g in found["globals"]), found
    r = run_cli("gate", str(bad))
    assert r.code == 1 and "system" in r.out, r  # every command reports what scan does


def test_a_use_pickle_weight_is_walked_as_the_pickle_torch_export_load_unpickles(pt2, tmp_path, run_cli):
    with zipfile.ZipFile(pt2) as z:
        config = json.loads(z.read("net/data/weights/model_weights_config.json"))
    entry = config["config"]["running"]
    entry["use_pickle"] = True
    bad = tmp_path / "bad.pt2"
    _rewrite(pt2, bad, {"data/weights/model_weights_config.json": json.dumps(config).encode(),
                        "data/weights/" + entry["path_name"]: pickle.dumps(_Boom())})
    r = run_cli("scan", str(bad))
    assert r.code == 1, r
    r = run_cli("inspect", str(bad))
    assert r.code != 0 or "dangerous" in r.out + r.err


@pytest.mark.parametrize("field,value", [("sizes", [{"as_int": 4096}, {"as_int": 4096}]),
                                         ("storage_offset", {"as_int": 1 << 20}),
                                         ("strides", [{"as_int": 1}])])
def test_a_config_claiming_more_than_its_member_holds_fails_closed(pt2, tmp_path, run_cli, field, value):
    """The config is the archive's word; the member's bytes decide: no tensor is reported that is not stored."""
    with zipfile.ZipFile(pt2) as z:
        config = json.loads(z.read("net/data/weights/model_weights_config.json"))
    entry = next(e for e in config["config"].values() if len(e["tensor_meta"]["sizes"]) == 2)
    entry["tensor_meta"][field] = value
    bad = tmp_path / "bad.pt2"
    _rewrite(pt2, bad, {"data/weights/model_weights_config.json": json.dumps(config).encode()})
    for command in ("inspect", "gate"):
        r = run_cli(command, str(bad))
        assert r.code == 2 and ("reaches past the end" in r.err or "could store" in r.err), r


def test_a_member_outside_the_layout_fails_closed(pt2, tmp_path, run_cli):
    odd = tmp_path / "odd.pt2"
    _rewrite(pt2, odd, {}, extra={"notes/readme.bin": b"hello"})
    r = run_cli("scan", str(odd))
    assert r.code == 2, r
    assert "never writes" in r.out + r.err


def test_compiled_code_is_dangerous(pt2, tmp_path, run_cli):
    aoti = tmp_path / "aoti.pt2"
    _rewrite(pt2, aoti, {}, extra={"data/aotinductor/model/model.so": b"\x7fELF"})
    r = run_cli("scan", str(aoti))
    assert r.code == 1, r


def test_an_archive_whose_members_were_reordered_is_still_read(pt2, tmp_path, run_cli):
    moved = tmp_path / "moved.pt2"
    _rewrite(pt2, moved, {}, order=lambda infos: sorted(infos, key=lambda i: not i.filename.endswith("byteorder")))
    report = _inspect(run_cli, str(moved))
    assert report["format"] == "torch-export"
    assert len(report["tensors"]) == len(torch.export.load(str(pt2)).state_dict)
