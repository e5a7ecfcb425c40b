"""ckpt scan: every payload of the malicious corpus is flagged, clean checkpoints are not.

The bypass tests are named after the trick they guard against; their
payloads are live (test_corpus_payloads_are_live loads them like a victim
would, in a subprocess, and sees the marker files appear).
"""
from __future__ import annotations

import io
import json
import os
import pickle
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from conftest import ROOT, run_subprocess
from hypothesis import given, settings, strategies as st

from ckpt_tool import scan
from ckpt_tool.pickles.scanner import scan_pickle_bytes
from tests.helpers.malicious import Case, Reduce, build_corpus, memo_stack_global

HERE = str(Path(__file__).resolve().parents[3])  # the repository root: tests.helpers.malicious


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> dict[str, Case]:
    folder = tmp_path_factory.mktemp("corpus")
    return {c.name: c for c in build_corpus(str(folder))}


def only(path: str | os.PathLike[str]):
    report = scan([os.fspath(path)])
    assert len(report.files) >= 1
    return report


def dangerous_names(report) -> set[str]:
    return {g.qualname for f in report.files for g in f.globals if g.severity == "dangerous"}


# ---------------------------------------------------------------- clean inputs


@pytest.mark.parametrize(
    "name, verdict",
    [
        ("tiny_mlp.pth", "safe"),
        ("tiny_mlp_dp.pth", "safe"),
        ("tiny_mlp_compiled.pth", "safe"),
        ("tiny_mlp.safetensors", "safe"),
        ("legacy.pth", "safe"),
        ("lightning.ckpt", "safe"),
        ("torchscript.pt", "safe"),
        ("numpy_dict.pkl", "safe"),
        # issue 21: argparse.Namespace is on the reviewed inert list (was suspicious)
        ("training.pth", "safe"),
        # issue 21: a whole-model pickle constructs its classes (NEWOBJ/REDUCE): dangerous (was suspicious)
        ("whole_model.pth", "dangerous"),
        # issue 21: dill calls its by-value constructors (classes, code, a lambda): dangerous (was suspicious)
        ("dill_model.dill", "dangerous"),
    ],
)
def test_fixtures_verdicts_by_allowlist(fixtures_dir, name, verdict):
    report = only(fixtures_dir / name)
    (f,) = report.files
    assert f.verdict == verdict, f
    assert not f.errors
    assert report.exit_code == (1 if verdict == "dangerous" else 0)
    assert scan([os.fspath(fixtures_dir / name)], strict=True).exit_code == (0 if verdict == "safe" else 1)


@pytest.mark.parametrize("folder", ["sharded", "sharded_bin", "dcp", "megatron/dense", "megatron/tp2",
                                    "dist_safetensors/run"])
def test_clean_folders_are_safe(fixtures_dir, folder):
    # megatron/: real megatron-core saves, whose .metadata holds every rank's SavePlan (all_local_plans);
    # dist_safetensors/: rank files of a distributed save, each a safetensors file safetensors loads as it is
    report = only(fixtures_dir / folder)
    assert {f.verdict for f in report.files} == {"safe"}
    assert report.exit_code == 0
    assert all(p.endswith(".json") for p in report.skipped)


def test_a_distributed_safetensors_rank_file_scans_as_safetensors_loads_it(fixtures_dir):
    from safetensors import safe_open

    path = fixtures_dir / "dist_safetensors" / "run" / "shard-00001-model-00001-of-00001.safetensors"
    with safe_open(str(path), "np") as f:  # the loader reads it as it is: the rank's slices
        keys = sorted(f.keys())
    (f,) = only(path).files
    assert f.verdict == "safe" and not f.errors and keys


def test_shard_index_scans_its_shards(fixtures_dir):
    report = only(fixtures_dir / "sharded_bin" / "pytorch_model.bin.index.json")
    assert sorted(os.path.basename(f.path) for f in report.files) == [
        "pytorch_model-00001-of-00002.bin", "pytorch_model-00002-of-00002.bin"]
    assert report.exit_code == 0


def test_whole_model_lists_its_classes_as_dangerous(fixtures_dir):
    # issue 21: the classes are constructed, so they are dangerous (were suspicious), and the message says why
    (f,) = only(fixtures_dir / "whole_model.pth").files
    dangerous = {g.qualname for g in f.globals if g.severity == "dangerous"}
    assert "__main__.WholeModel" in dangerous
    # issue 32: torch's own layers only store data when unpickled (the reviewed catalog); the user's class is not
    assert "torch.nn.modules.linear.Linear" in {g.qualname for g in f.globals if g.severity == "safe"}
    assert any(x.message.startswith("constructs __main__.WholeModel, which is not on the inert allowlist")
               for x in f.findings), f.findings
    assert "torch._utils._rebuild_tensor_v2" in {g.qualname for g in f.globals if g.severity == "safe"}


def test_plain_pickle_of_tensors_is_safe_and_its_storages_are_followed(tmp_path):
    import torch

    sd = {"w": torch.ones(3), "b": torch.zeros(2, dtype=torch.float16)}
    path = tmp_path / "tensors.pkl"
    path.write_bytes(pickle.dumps(sd))  # storages become torch.storage._load_from_bytes(<torch.save bytes>)
    (f,) = only(path).files
    assert f.verdict == "safe"
    assert f.pickles > 1
    assert any("_load_from_bytes" in g.where for g in f.globals)


def test_model_with_a_logger_attribute_names_the_logger_call(tmp_path):
    import logging

    import torch

    model = torch.nn.Linear(2, 2)
    model.logger = logging.getLogger("train")  # pickles as logging.getLogger("train")
    path = tmp_path / "with_logger.pth"
    torch.save(model, path)
    (f,) = only(path).files
    # issue 21: calling logging.getLogger at load is dangerous; issue 32: nn.Linear only stores data (catalog)
    assert f.verdict == "dangerous", f
    judged = {g.qualname: g.severity for g in f.globals}
    assert judged["logging.getLogger"] == "dangerous" and judged["torch.nn.modules.linear.Linear"] == "safe"
    assert not any("torch.nn.modules.linear.Linear" in x.message for x in f.findings), f.findings


def test_dill_state_dict_is_safe(tmp_path):
    import dill
    import torch

    path = tmp_path / "sd.dill"
    path.write_bytes(dill.dumps({"w": torch.ones(2), "epoch": 3}))
    (f,) = only(path).files
    assert f.verdict == "safe", f


def test_folder_is_scanned_recursively_and_other_files_are_skipped(tmp_path, fixtures_dir):
    import shutil

    (tmp_path / "a" / "b").mkdir(parents=True)
    shutil.copy(fixtures_dir / "tiny_mlp.pth", tmp_path / "a" / "b" / "model.bin")
    (tmp_path / "README.md").write_text("# class Model\nimport torch\n")
    (tmp_path / "config.json").write_text('{"hidden": 16}')
    (tmp_path / "modeling.py").write_text("class Net:\n    pass\n")
    report = scan([str(tmp_path)])
    assert [os.path.basename(f.path) for f in report.files] == ["model.bin"]
    assert sorted(os.path.basename(p) for p in report.skipped) == ["README.md", "config.json", "modeling.py"]
    assert report.exit_code == 0


# ------------------------------------------------------------- malicious corpus


def test_every_payload_in_the_corpus_is_dangerous(corpus):
    report = scan([c.path for c in corpus.values()])
    by_path: dict[str, list] = {}
    for f in report.files:
        by_path.setdefault(f.path, []).append(f)
    for case in corpus.values():
        files = [f for p, fs in by_path.items() for f in fs if p == case.path or p.startswith(case.path + os.sep)]
        assert files, case.name
        assert any(f.verdict == "dangerous" for f in files), (case.name, files)
    assert report.exit_code == 1


@pytest.mark.parametrize(
    "name, expected",
    [
        ("os_system", "os.system"),
        ("posix_system", "posix.system"),
        ("builtins_exec", "builtins.exec"),
        ("builtins_eval", "builtins.eval"),
        ("subprocess_popen", "subprocess.Popen"),
        ("runpy_run_code", "runpy._run_code"),
        ("importlib_chain", "importlib.import_module"),
        ("inst_opcode", "os.system"),
        ("optimizer_entry", "builtins.exec"),
        ("args_entry", "posix.system"),
        ("legacy_format", "posix.system"),
        ("dill_os_system", "posix.system"),
    ],
)
def test_payload_global_is_named(corpus, name, expected):
    names = dangerous_names(only(corpus[name].path))
    # protocol 2 spells builtins as __builtin__
    assert expected in names or expected.replace("builtins.", "__builtin__.") in names, names


def test_bypass_payload_in_a_zip_member_other_than_data_pkl(corpus):
    (f,) = only(corpus["second_zip_member"].path).files
    hits = [g for g in f.globals if g.severity == "dangerous"]
    assert hits and all(g.where.endswith("/extra.pkl") for g in hits)


def test_bypass_misleading_extension(corpus):
    path = corpus["misleading_extension"].path
    assert path.endswith(".safetensors")
    (f,) = only(path).files
    assert f.format == "pickle" and f.verdict == "dangerous"


def test_bypass_zip_member_names_with_dotdot(corpus):
    (f,) = only(corpus["dotdot_member_names"].path).files
    assert f.verdict == "dangerous"
    assert any(g.where == "../data.pkl" and g.qualname == "posix.system" for g in f.globals)
    assert any("odd archive member names" in x.message for x in f.findings)


@pytest.mark.parametrize("name", ["broken_zip_crc", "broken_zip_local_name", "broken_zip_directory"])
def test_bypass_broken_zip_that_torch_still_reads(corpus, name):
    (f,) = only(corpus[name].path).files
    assert f.verdict == "dangerous"
    assert "posix.system" in {g.qualname for g in f.globals}


def test_bypass_truncated_zip_falls_back_to_local_headers(corpus):
    report = only(corpus["truncated_zip"].path)
    (f,) = report.files
    assert f.verdict == "dangerous"
    assert any("local file headers" in e for e in f.errors)
    assert report.exit_code == 1  # a dangerous finding outranks the read error


def test_bypass_pickle_prepended_to_a_zip(corpus):
    (f,) = only(corpus["pickle_before_zip"].path).files
    assert f.verdict == "dangerous"
    top = [g for g in f.globals if g.where == ""]
    assert {g.qualname for g in top} == {"posix.system"}
    assert any(g.where.endswith("data.pkl") for g in f.globals)  # and the zip behind it was read too


def _zip_with_payload_member(name: str) -> bytearray:
    """A clean ``archive/data.pkl`` and a payload pickle in member ``name`` (a placeholder for byte edits)."""
    z = io.BytesIO()
    with zipfile.ZipFile(z, "w") as zf:
        zf.writestr("archive/data.pkl", pickle.dumps({}, protocol=2))
        zf.writestr(name, pickle.dumps(Reduce(os.system, "true"), protocol=2))
    return bytearray(z.getvalue())


def test_bypass_member_past_the_end_record_count(tmp_path):
    # zipfile reads every entry the directory holds; an end record counting fewer hides the rest from torch
    raw = _zip_with_payload_member("archive/extra.pkl")
    eocd = bytes(raw).rfind(b"PK\x05\x06")
    raw[eocd + 8 : eocd + 12] = b"\x01\x00\x01\x00"
    p = tmp_path / "count.zip"
    p.write_bytes(bytes(raw))
    assert len(zipfile.ZipFile(p).namelist()) == 2
    (f,) = only(p).files
    assert any(g.where == "archive/extra.pkl" and g.qualname == "posix.system" for g in f.globals)


def test_bypass_cp437_member_name_behind_a_prefix(tmp_path):
    # without the UTF-8 flag zipfile reads a name as cp437, and allows bytes before the archive
    raw = _zip_with_payload_member("archive/Q.pkl").replace(b"archive/Q.pkl", b"archive/\x82.pkl")
    p = tmp_path / "prefixed.zip"
    p.write_bytes(b"\0" * 100 + bytes(raw))
    assert "archive/\u00e9.pkl" in zipfile.ZipFile(p).namelist()
    (f,) = only(p).files
    assert any(g.where == "archive/\u00e9.pkl" and g.qualname == "posix.system" for g in f.globals)


def test_bypass_nested_pickle_loads(corpus):
    (f,) = only(corpus["nested_pickle_loads"].path).files
    inner = [g for g in f.globals if "loads(...)" in g.where]
    assert {g.qualname for g in inner} == {"posix.system"}


def test_bypass_nested_torch_storage_load_from_bytes(corpus):
    # _load_from_bytes itself is allowed (torch pickles every storage that way); what it loads is not.
    (f,) = only(corpus["nested_load_from_bytes"].path).files
    assert f.verdict == "dangerous"
    hit = [g for g in f.globals if g.qualname == "posix.system"]
    assert hit and "torch.storage._load_from_bytes(...) > archive/data.pkl" in hit[0].where


def test_bypass_nested_loader_on_computed_bytes_is_dangerous():
    # pickle.loads(bytes(...)) where the bytes come from a call the walk cannot evaluate
    data = b"\x80\x04\x8c\x06pickle\x8c\x05loads\x93\x8c\x0bcollections\x8c\x0bOrderedDict\x93)R\x85R."
    result = scan_pickle_bytes(data, "x")
    assert any("computed at load time" in f.message for f in result.findings)


def test_bypass_memo_stack_global(corpus):
    assert "os.system" in dangerous_names(only(corpus["memo_stack_global"].path))


def test_bypass_stack_global_name_memoized_inside_a_discarded_tuple(corpus):
    assert "os.system" in dangerous_names(only(corpus["tuple_memo_stack_global"].path))


def test_bypass_stack_global_with_a_computed_name_is_unresolvable(corpus):
    (f,) = only(corpus["computed_stack_global"].path).files
    assert f.verdict == "dangerous"
    assert "?.?" in {g.qualname for g in f.globals}
    assert any("cannot be resolved statically" in x.message for x in f.findings)


def test_bypass_python2_module_names_mapped_by_compat_pickle(corpus):
    assert "commands.getoutput" in dangerous_names(only(corpus["compat_commands"].path))


def test_bypass_dill_function_built_from_code_and_called(corpus):
    (f,) = only(corpus["dill_function_call"].path).files
    assert f.verdict == "dangerous"
    assert any("_create_function" in x.message and x.severity == "dangerous" for x in f.findings)


def test_bypass_numpy_object_array(corpus):
    (f,) = only(corpus["numpy_object_array"].path).files
    assert f.format == "numpy" and "posix.system" in {g.qualname for g in f.globals}


def test_bypass_dcp_bytes_item_and_metadata(corpus):
    report = only(corpus["dcp_bytes_item"].path)
    data = [f for f in report.files if f.path.endswith(".distcp")]
    assert data and data[0].verdict == "dangerous"
    assert any(g.where.startswith("extra @") for g in data[0].globals)
    report = only(corpus["dcp_metadata"].path)
    meta = [f for f in report.files if f.path.endswith(".metadata")]
    assert meta[0].verdict == "dangerous"


def test_build_on_an_imported_object_is_dangerous():
    # BUILD on a class overwrites its attributes for the whole process
    data = b"\x80\x02ccollections\nOrderedDict\n}X\x03\x00\x00\x00keyK\x01sb."
    result = scan_pickle_bytes(data, "x")
    assert result.verdict == "dangerous"
    assert any("BUILD" in f.message for f in result.findings)


def test_truncated_pickle_reports_what_ran_before_the_cut():
    data = pickle.dumps(Reduce(os.system, "true"), protocol=2)
    cut = data[: data.index(b"R") + 1]  # the call happens, then the stream ends
    result = scan_pickle_bytes(cut, "x")
    assert result.verdict == "dangerous"
    assert result.error and "STOP" in result.error


def test_memo_trick_resolves_from_bytes_alone():
    assert scan_pickle_bytes(memo_stack_global("os", "system", "true"), "x").verdict == "dangerous"


# ----------------------------------------------------------------------- CLI


def test_cli_exit_codes_and_json(run_cli, corpus, fixtures_dir, tmp_path):
    import torch

    r = run_cli("scan", str(fixtures_dir / "tiny_mlp.pth"))
    assert r.code == 0 and "SAFE" in r.out
    # issue 21: training.pth (argparse.Namespace) is safe now; a global only referenced, never called, is suspicious
    referenced = tmp_path / "referenced.pth"
    torch.save({"w": torch.ones(2), "init": torch.nn.init.xavier_uniform_}, referenced)
    r = run_cli("scan", str(referenced))
    assert r.code == 0, r.out
    assert "suspicious  torch.nn.init.xavier_uniform_" in r.out and "never calls or constructs" in r.out, r.out
    r = run_cli("scan", "--strict", str(referenced))
    assert r.code == 1
    r = run_cli("scan", "--json", str(fixtures_dir / "tiny_mlp.pth"), corpus["os_system"].path)
    assert r.code == 1
    doc = json.loads(r.out)
    assert [f["verdict"] for f in doc["files"]] == ["safe", "dangerous"]
    for f in doc["files"]:
        assert {"path", "verdict", "globals"} <= set(f)
        for g in f["globals"]:
            assert {"module", "name", "severity"} <= set(g)
    assert {"module": "os", "name": "system", "severity": "dangerous", "where": ""} in doc["files"][1]["globals"]


def test_cli_unreadable_input_exits_2_with_one_line(run_cli, tmp_path):
    r = run_cli("scan", str(tmp_path / "missing.pth"))
    assert r.code == 2
    assert "missing.pth" in r.err and "Traceback" not in r.err
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes((20).to_bytes(8, "little") + b'{"w": {"dtype": "F32"' + b" " * 8)
    r = run_cli("scan", str(bad))
    assert r.code == 2 and "bad.safetensors" in r.err


def test_cli_skip_other_for_hooks_that_pass_every_file(run_cli, tmp_path, fixtures_dir):
    readme = tmp_path / "README.md"
    readme.write_text("# model card\n")
    r = run_cli("scan", str(readme), str(fixtures_dir / "tiny_mlp.pth"))
    assert r.code == 2 and "nothing ckpt can scan" in r.err
    r = run_cli("scan", "--skip-other", str(readme), str(fixtures_dir / "tiny_mlp.pth"))
    assert r.code == 0 and "skipped 1 file" in r.out


def test_cli_many_files_at_once(run_cli, corpus):
    paths = [c.path for c in corpus.values()]
    r = run_cli("scan", "-q", *paths)
    assert r.code == 1
    assert "dangerous" in r.out.splitlines()[-1] or "dangerous" in r.out


def test_scan_does_not_import_torch(fixtures_dir):
    code = (
        "import sys; from ckpt_tool import scan; "
        f"r = scan([{str(fixtures_dir)!r}]); "
        # issue 21: the whole-model and dill fixtures construct their classes: dangerous (exit 1; was 0)
        # issue 32: FSDP1's per-rank ShardedTensor files (fsdp1/, bad_overlap/) are judged by the catalog (safe),
        # as are the DTensor files
        "bad = sorted(f.path.split('fixtures/', 1)[1] for f in r.files if f.verdict != 'safe'); "
        "assert bad == ['dill_model.dill', 'whole_model.pth'], bad; "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120,
                          check=False)
    assert proc.returncode == 0, proc.stderr


def test_torchzip_keeps_using_scan_pickle_bytes():
    payload = pickle.dumps(Reduce(os.system, "true"), protocol=2)
    result = scan_pickle_bytes(payload, "archive/extra.pkl")
    assert [g.qualname for g in result.globals] == ["posix.system"]
    assert result.globals[0].where == "archive/extra.pkl"


# ------------------------------------------------- payloads are live, never run


LIVE = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
from tests.helpers.malicious import Case, load_like_a_victim
for c in json.loads(sys.argv[2]):
    try:
        load_like_a_victim(Case(**c))
    except Exception as exc:  # the payload ran or not: the marker tells
        print(c["name"], type(exc).__name__, exc, file=sys.stderr)
"""


def test_corpus_payloads_are_live(tmp_path_factory):
    """Loading like a victim runs every payload a stock loader reads: the no-run test below could fail."""
    cases = build_corpus(str(tmp_path_factory.mktemp("live")))
    victims = [c for c in cases if c.loader is not None]
    proc = subprocess.run(
        [sys.executable, "-c", LIVE, HERE, json.dumps([c.__dict__ for c in victims])],
        capture_output=True, text=True, timeout=300, check=False, cwd=str(tmp_path_factory.getbasetemp()),
    )
    dead = [c.name for c in victims if not os.path.exists(c.marker)]
    assert dead == [], proc.stderr[-3000:]
    assert len(victims) >= len(cases) - 1  # only the truncated zip has no stock loader


DRIVER = r"""
import json, os, sys
sys.path.insert(0, sys.argv[1])
from ckpt_tool.cli import main
cases = json.loads(sys.argv[2])
clean = sys.argv[3]
out = sys.argv[4]
codes = {}
paths = [c["path"] for c in cases]
codes["scan"] = main(["scan", "-q", *paths])
codes["gate"] = main(["gate", "-q", "--strict", *paths])
for i, c in enumerate(cases):
    p = c["path"]
    codes["inspect " + c["name"]] = main(["inspect", p])
    codes["diff " + c["name"]] = main(["diff", p, clean])
    codes["migrate " + c["name"]] = main(["migrate", p, "-o", os.path.join(out, f"{i}.safetensors")])
print(json.dumps(codes))
"""


def test_no_payload_runs_during_scan_gate_inspect_diff_migrate(corpus, tmp_path, fixtures_dir):
    cases = [{"name": c.name, "path": c.path} for c in corpus.values()]
    proc = subprocess.run(
        [sys.executable, "-c", DRIVER, str(ROOT), json.dumps(cases), str(fixtures_dir / "tiny_mlp.pth"),
         str(tmp_path)],
        capture_output=True, text=True, timeout=600, cwd=str(tmp_path), check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    codes = json.loads(proc.stdout.strip().splitlines()[-1])
    ran = [c.name for c in corpus.values() if os.path.exists(c.marker)]
    assert ran == [], f"payloads ran: {ran}"
    assert codes["scan"] == 1
    assert codes["gate"] != 0
    assert "Traceback" not in proc.stderr
    # the unreadable and the refused exit 2, the rest report a finding or succeed, but nothing runs
    assert all(code in (0, 1, 2) for code in codes.values()), codes


def test_scan_cli_in_a_fresh_interpreter(corpus):
    proc = run_subprocess("scan", corpus["os_system"].path)
    assert proc.returncode == 1
    assert "os.system" in proc.stdout
    assert not os.path.exists(corpus["os_system"].marker)


def test_in_memory_zip_member_scan_handles_deflate(tmp_path):
    payload = pickle.dumps(Reduce(os.system, "true"), protocol=2)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("archive/data.pkl", pickle.dumps({"a": 1}))
        z.writestr("archive/other.pkl", payload)
    path = tmp_path / "deflated.pth"
    path.write_bytes(buf.getvalue())
    (f,) = only(path).files
    assert f.verdict == "dangerous"
    assert any(g.where == "archive/other.pkl" for g in f.globals)


# ------------------------------------------------------------------ properties

_plain = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20)
    | st.binary(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.tuples(inner, inner) | st.dictionaries(st.text(max_size=5), inner,
                                                                                          max_size=4),
    max_leaves=20,
)


@settings(max_examples=200, deadline=None)
@given(_plain, st.integers(min_value=0, max_value=5))
def test_plain_data_walks_to_stop_without_globals(value, protocol):
    from ckpt_tool.io.regions import Blob
    from ckpt_tool.pickles.walk.walker import walk

    data = pickle.dumps(value, protocol=protocol)
    w = walk(Blob.from_bytes(data).stream(), "x", size=len(data))
    assert w.complete and w.end == len(data)
    assert all(g.severity == "safe" for g in w.globals), w.globals  # protocol 0-2 name builtins for bytes
    assert not w.findings


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_arbitrary_bytes_never_raise(data):
    result = scan_pickle_bytes(data, "x")
    assert result.verdict in ("safe", "suspicious", "dangerous")
