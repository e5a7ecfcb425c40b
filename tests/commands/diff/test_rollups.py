"""``ckpt diff --values`` ordering (--sort, --top), rollups that add up, and key rules applied while comparing."""
from __future__ import annotations

import json
import shlex

import pytest
import torch
import torch.nn.functional as F
from diff_training import train

from ckpt_tool.commands.diff.rollup import common_prefix, fold_layers, layer_and_role, module_of


@pytest.fixture(scope="module")
def steps(tmp_path_factory):
    return train(tmp_path_factory.mktemp("run"))


@pytest.fixture(scope="module")
def ddp(steps, tmp_path_factory):
    """step3 as DistributedDataParallel saves it: every key under ``module.``."""
    path = tmp_path_factory.mktemp("ddp") / "ddp.pth"
    torch.save({"module." + k: v for k, v in torch.load(steps[3]).items()}, path)
    return path


def run_json(run_cli, *args):
    r = run_cli("diff", "--json", *map(str, args))
    assert r.code in (0, 1), r
    return r.code, json.loads(r.out)


def group_truth(a: dict, b: dict, keys: list[str]) -> dict[str, float]:
    """The figures of a group as torch computes them on the concatenation of its tensors."""
    x = torch.cat([a[k].double().flatten() for k in keys])
    y = torch.cat([b[k].double().flatten() for k in keys])
    return {"numel": x.numel(), "mean_abs": float((y - x).abs().mean()), "max_abs": float((y - x).abs().max()),
            "rel_l2": float(torch.linalg.vector_norm(y - x) / torch.linalg.vector_norm(x)),
            "cosine": float(F.cosine_similarity(x, y, dim=0))}


@pytest.mark.parametrize("depth", [0, 1, 2, 3])
def test_rollups_by_depth_add_up(steps, run_cli, depth):
    _, doc = run_json(run_cli, "--values", "--rollup-depth", depth, steps[3], steps[6])
    a, b = torch.load(steps[3]), torch.load(steps[6])
    groups = doc["rollups"]["groups"]
    members = {g["name"]: [k for k in a if module_of(k, depth) == g["name"]] for g in groups}
    assert sorted(k for ks in members.values() for k in ks) == sorted(a)  # each tensor in exactly one group
    assert sum(g["numel"] for g in groups) == sum(t.numel() for t in a.values())
    assert sum(g["tensors"] for g in groups) == len(a)
    for g in groups:
        want = group_truth(a, b, members[g["name"]])
        assert g["numel"] == want["numel"]
        for name in ("mean_abs", "rel_l2", "cosine"):
            assert g[name] == pytest.approx(want[name], rel=1e-9), (g["name"], name)
        assert g["max_abs"] == pytest.approx(want["max_abs"], rel=1e-6)
    if depth == 0:
        assert [g["name"] for g in groups] == ["(all)"]


def test_rollups_with_layers_folded_add_up(steps, run_cli):
    _, doc = run_json(run_cli, "--values", "--rollup-layers", steps[3], steps[6])
    a, b = torch.load(steps[3]), torch.load(steps[6])
    groups = {g["name"]: g for g in doc["rollups"]["groups"]}
    assert "layers.*.attn.q.weight" in groups and groups["layers.*.attn.q.weight"]["tensors"] == 4
    for name, g in groups.items():
        keys = [k for k in a if fold_layers(k) == name]
        want = group_truth(a, b, keys)
        for m in ("mean_abs", "rel_l2", "cosine"):
            assert g[m] == pytest.approx(want[m], rel=1e-9), (name, m)
    # the element-weighted mean of the groups' means is the whole model's mean
    total = sum(g["mean_abs"] * g["numel"] for g in groups.values()) / sum(g["numel"] for g in groups.values())
    assert total == pytest.approx(group_truth(a, b, list(a))["mean_abs"], rel=1e-9)
    assert doc["rollups"]["aggregation"]["mean_abs"].startswith("sum |B-A| / sum numel")


def test_rollups_count_identical_tensors_norms(steps, tmp_path, run_cli):
    # a group where only one tensor changed: its rel_l2 divides by the norm of all of them, identical ones included
    a = torch.load(steps[3])
    b = dict(a)
    b["layers.0.mlp.weight"] = a["layers.0.mlp.weight"] + 0.5
    torch.save(b, tmp_path / "b.pth")
    _, doc = run_json(run_cli, "--values", "--rollup-depth", 1, steps[3], tmp_path / "b.pth")
    layers = next(g for g in doc["rollups"]["groups"] if g["name"] == "layers")
    keys = [k for k in a if k.startswith("layers.")]
    assert layers["rel_l2"] == pytest.approx(group_truth(a, b, keys)["rel_l2"], rel=1e-9)
    assert layers["cosine"] == pytest.approx(group_truth(a, b, keys)["cosine"], rel=1e-9)


@pytest.mark.parametrize("metric", ["rel_l2", "max_abs", "mean_abs", "max_rel", "mismatched_share", "numel"])
def test_sort_puts_the_largest_change_first(steps, run_cli, metric):
    _, doc = run_json(run_cli, "--values", "--sort", metric, steps[3], steps[6])
    got = [v[metric] for v in doc["values"]]
    assert got == sorted(got, reverse=True) and doc["sort"] == metric


def test_sort_by_cosine_is_lowest_first_and_top_cuts(steps, run_cli):
    _, full = run_json(run_cli, "--values", "--sort", "cosine", steps[3], steps[6])
    cos = [v["cosine"] for v in full["values"]]
    assert cos == sorted(cos)
    _, top = run_json(run_cli, "--values", "--sort", "cosine", "--top", 5, steps[3], steps[6])
    assert [v["key"] for v in top["values"]] == [v["key"] for v in full["values"][:5]]
    assert top["values_total"] == len(full["values"]) and top["top"] == 5
    # the verdict still counts every tensor, not only the first five
    assert len(top["value_mismatch"]) == len(full["value_mismatch"])


def test_top_without_sort_keeps_as_order_and_text_shows_it(steps, run_cli):
    _, doc = run_json(run_cli, "--values", "--top", 3, steps[3], steps[6])
    assert [v["key"] for v in doc["values"]] == list(torch.load(steps[3]))[:3]
    r = run_cli("diff", "--values", "--sort", "rel_l2", "--top", "2", str(steps[3]), str(steps[6]))
    assert "by rel_l2, first 2:" in r.out and r.code == 1


@pytest.mark.parametrize("option", [["--sort", "rel_l2"], ["--top", "3"], ["--rollup-depth", "1"],
                                    ["--rollup-layers"], ["--csv", "x.csv"], ["--html", "x.html"]])
def test_value_options_need_values(steps, run_cli, option):
    r = run_cli("diff", str(steps[3]), str(steps[6]), *option)
    assert r.code == 2 and "--values" in r.err


def test_strip_prefix_while_comparing_compares_every_tensor(steps, ddp, run_cli):
    code, plain = run_json(run_cli, "--values", ddp, steps[3])
    assert code == 1 and plain["values_total"] == 0  # nothing pairs up without the rule
    code, doc = run_json(run_cli, "--values", "--strip-prefix", "module.", ddp, steps[3])
    assert code == 0 and doc["equal"] and doc["values_total"] == len(torch.load(steps[3]))
    assert doc["rules_applied"]["options"] == ["--strip-prefix", "module."]
    assert doc["rules_applied"]["renamed"] == doc["values_total"]
    code, doc = run_json(run_cli, "--values", "--strip-prefix", "module.", ddp, steps[6])
    assert code == 1 and len(doc["value_mismatch"]) == doc["values_total"] == len(torch.load(steps[6]))


def test_auto_infers_the_rewrite_and_rename_applies_like_migrate(steps, ddp, run_cli):
    code, doc = run_json(run_cli, "--values", "--auto", ddp, steps[3])
    assert code == 0 and doc["values_total"] == len(torch.load(steps[3]))
    code, doc = run_json(run_cli, "--values", "--rename", r"module\.(.*)=\1", ddp, steps[3])
    assert code == 0 and doc["rules_applied"]["steps"] == [["--rename", r"module\.(.*)=\1"]]


def test_fix_command_accounts_for_the_rules_given(steps, ddp, tmp_path, run_cli):
    # --add-prefix x. then a strip of x.module. cannot be one rule set: the command is the rewrite of A's own keys
    code, doc = run_json(run_cli, "--add-prefix", "x.", ddp, steps[3])
    assert code == 1
    command = doc["suggestion"]["command"]
    out = tmp_path / "fixed.pth"
    argv = shlex.split(command)
    argv[argv.index("-o") + 1] = str(out)
    assert run_cli(*argv[1:]).code == 0
    assert run_cli("diff", "--values", str(out), str(steps[3])).code == 0
    # rules that merge are stated as given: strip module. then the fix command is exactly that
    code, doc = run_json(run_cli, "--strip-prefix", "module.", ddp, steps[3])
    assert code == 0 and doc["rules_applied"]["command"].endswith("--strip-prefix module.")


def test_key_helpers():
    assert fold_layers("model.layers.12.attn.q.weight") == "model.layers.*.attn.q.weight"
    assert layer_and_role("model.layers.12.attn.q.weight") == (12, "model.layers.*.attn.q.weight")
    assert layer_and_role("model.layers.12.mlp.experts.3.w1") == (12, "model.layers.*.mlp.experts.3.w1")
    assert common_prefix(["m.layers.*.a.w", "m.layers.*.b.w"]) == "m.layers.*."
    assert common_prefix(["enc.layers.*.q", "dec.layers.*.q"]) == "" and common_prefix(["a.b", "a.b"]) == "a."
    assert layer_and_role("embed.weight") is None
    assert module_of("a.b.c", 2) == "a.b" and module_of("a", 3) == "a" and module_of("a.b", 0) == "(all)"
