"""Third-party classes in the catalog (ckpt_tool/pickles/catalog/third_party.py), checked with the libraries.

Every inert entry gets a sample built by the library's own constructors, unpickled for real in an audited child
(no side effect) and judged safe by ckpt. The files the libraries' own training code writes (Trainer,
Lightning, mmengine, ignite, accelerate) are tests/formats/test_third_party.py. Without a library, these tests skip
saying which.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from ckpt_tool import scan
from ckpt_tool.pickles.catalog import third_party
from tests.helpers.catalog_samples import judged_samples

LIBS = ("transformers", "accelerate", "omegaconf", "lightning_fabric", "pytorch_lightning", "mmengine", "torchao")
MISSING = [name for name in LIBS if importlib.util.find_spec(name) is None]
pytestmark = pytest.mark.skipif(bool(MISSING), reason=f"needs the test-only libraries {MISSING} "
                                                      "(requirements-test.txt)")

INERT = sorted((e for e in third_party.ENTRIES if e.decision == "inert"), key=lambda e: e.pair)
ROOT = Path(__file__).resolve().parents[2]

@pytest.fixture(scope="module")
def samples(tmp_path_factory):
    return judged_samples(INERT, tmp_path_factory.mktemp("third_party"), preload=sorted({e.module for e in INERT}))


@pytest.mark.parametrize("label", [f"{e.module}.{e.name}" for e in INERT])
def test_inert_third_party_entry_loads_without_side_effect_and_scans_safe(samples, label):
    paths, results, verdicts = samples
    if label not in paths:
        pytest.fail(f"{label}: the test builds no instance of it; add one to catalog_samples._SPECIAL")
    assert results[label] == "loaded", results[label]
    f = verdicts[label]
    assert f.verdict == "safe", (label, [(g.qualname, g.severity) for g in f.globals], f.findings)


def test_every_catalogued_torchao_tensor_uses_the_reviewed_setstate():
    """The review read TorchAOBaseTensor's __setstate__; a subclass that defines its own is not covered by it."""
    import torchao.quantization as q
    from torchao.utils import _torchao_base_tensor__setstate__

    names = [e.name for e in third_party.ENTRIES if e.module == "torchao.quantization"]
    assert names
    for name in names:
        assert getattr(q, name).__setstate__ is _torchao_base_tensor__setstate__, name


def test_an_excluded_entry_stays_dangerous(tmp_path):
    from lightning_fabric.utilities.data import _WrapAttrTag

    path = tmp_path / "tag.pt"
    torch.save({"tag": _WrapAttrTag.SET}, path)
    (f,) = scan([str(path)]).files
    assert f.verdict == "dangerous"
