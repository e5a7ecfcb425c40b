"""The reviewed catalog (ckpt_tool/pickles/catalog/): complete for the installed torch, and each inert entry
unpickled for real, in an audited subprocess, without a side effect, and judged safe by ckpt.

Every inert class entry gets a real instance (an Enum member, a dataclass or namedtuple with values, a
torch.nn module built with small sizes), saved with torch.save. One subprocess loads them all with
``torch.load(weights_only=False)`` under an audit hook that fails on any write, process, socket, or
import of a module outside torch, the standard library and the entry's own; ckpt's scan of the same
files must say safe.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from ckpt_tool.pickles.catalog import CATALOG, stdlib, torch_lib
from ckpt_tool.pickles.catalog.entry import Entry
from tests.helpers.catalog_samples import judged_samples

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

# the standard library's and torch's entries; third-party ones: test_third_party_catalog.py (needs the libraries)
INERT = sorted((e for e in (*stdlib.ENTRIES, *torch_lib.ENTRIES) if e.decision == "inert"), key=lambda e: e.pair)


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


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    """(entry label -> path) for every entry with a sample, what torch.load did with each, and ckpt's verdicts."""
    return judged_samples(INERT, tmp_path_factory.mktemp("catalog"))


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
