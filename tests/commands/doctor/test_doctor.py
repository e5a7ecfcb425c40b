"""ckpt doctor: versions, devices and a real computation on each, with a clear verdict."""
from __future__ import annotations

import json

import pytest
import torch

from ckpt_tool.commands.doctor.command import check_device, run_doctor


def test_doctor_reports_versions_and_checks_the_cpu():
    report = run_doctor()
    assert report.torch == torch.__version__
    assert report.devices[0].device == "cpu"
    assert report.devices[0].ok, report.devices[0]
    assert "relative error" in report.devices[0].detail
    assert report.ok and report.verdict.startswith("OK")


def test_cli_json_and_text(run_cli):
    r = run_cli("doctor", "--json")
    assert r.code == 0
    doc = json.loads(r.out)
    assert {"python", "torch", "cuda", "devices", "ok", "verdict"} <= set(doc)
    assert doc["devices"][0]["device"] == "cpu"
    r = run_cli("doctor")
    assert r.code == 0 and "torch" in r.out and r.out.strip().splitlines()[-1].startswith("OK")


def test_a_device_that_cannot_compute_is_a_failure():
    bad = check_device("cuda:99" if not torch.cuda.is_available() else f"cuda:{torch.cuda.device_count()}")
    assert not bad.ok and bad.detail


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_every_cuda_device_computes_correctly():
    report = run_doctor()
    gpus = [d for d in report.devices if d.device.startswith("cuda")]
    assert len(gpus) == torch.cuda.device_count()
    assert all(d.ok for d in gpus), gpus
    assert all(d.properties["total_memory"] > 0 for d in gpus)
