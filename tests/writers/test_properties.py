"""Property-based tests: random state_dicts through every reader/writer pair, and the rules.

For every pair (files written by torch.save, torch.save's legacy format and
safetensors' save_file, read by ckpt; ckpt migrate's torch-zip, safetensors
and sharded writers, read back by torch, safetensors and ckpt) writing then
reading gives the same keys, dtypes, shapes and bytes (bitwise: NaN payloads
and -0.0 included). State_dicts cover every dtype torch and safetensors share,
0-dim and empty tensors, non-contiguous views, channels_last, shared storages
(tied weights), unicode and very long keys.

The rules: applying them is deterministic, --strip-prefix P after
--add-prefix P gives back the original keys, and a conflict (two keys
becoming one, an empty key) is always found before anything is written.

Examples per test: 20 in CI (derandomized, so a failure reproduces);
CKPT_PROPERTY_EXAMPLES=500 for a longer local run.
"""
from __future__ import annotations

import os
import string
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st
from safetensors.torch import load_file, save_file

from ckpt_tool.commands.migrate import migrate
from ckpt_tool.errors import RuleConflict
from ckpt_tool.formats import load
from ckpt_tool.keys.rules import RuleSet, make_plan
from ckpt_tool.model import TensorMeta
from ckpt_tool.tensors.data import tensor_bytes
from tests.helpers.bits import raw_bytes

EXAMPLES = int(os.environ.get("CKPT_PROPERTY_EXAMPLES", "20"))
PROFILE = settings(max_examples=EXAMPLES, deadline=None, derandomize=EXAMPLES <= 50,
                   suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                          HealthCheck.data_too_large])

# Every dtype both torch and safetensors store; the legacy format only has storage classes for some.
SHARED_DTYPES = ["bfloat16", "float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "bool",
                 "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "uint16", "uint32", "uint64",
                 "complex64"]
LEGACY_DTYPES = ["bfloat16", "float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "bool",
                 "complex64"]
LAYOUTS = ["contiguous", "transposed", "strided", "channels_last", "offset"]


# ------------------------------------------------------------------ strategies


@st.composite
def tensors(draw, dtypes=SHARED_DTYPES, layouts=LAYOUTS):
    """A tensor of any listed dtype and layout, with arbitrary bit patterns (NaNs, -0.0, subnormals)."""
    name = draw(st.sampled_from(dtypes))
    dtype = getattr(torch, name)
    layout = draw(st.sampled_from(layouts))
    rank = 4 if layout == "channels_last" else draw(st.integers(0, 3))
    if layout == "transposed" and rank < 2:
        rank = 2
    shape = tuple(draw(st.lists(st.integers(0, 4), min_size=rank, max_size=rank)))
    itemsize = torch.empty((), dtype=dtype).element_size()

    def filled(shp):
        n = 1
        for d in shp:
            n *= d
        if n == 0:
            return torch.empty(shp, dtype=dtype)
        if name == "bool":
            raw = bytes(draw(st.lists(st.integers(0, 1), min_size=n, max_size=n)))
        else:
            raw = draw(st.binary(min_size=n * itemsize, max_size=n * itemsize))
        return torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(dtype).reshape(shp)

    if layout == "transposed":
        base = filled((shape[1], shape[0], *shape[2:]))
        return base.transpose(0, 1)
    if layout == "strided" and rank >= 1:
        base = filled((shape[0] * 2, *shape[1:]))
        return base[::2]
    if layout == "channels_last":
        return filled(shape).contiguous(memory_format=torch.channels_last)
    if layout == "offset":
        flat = filled((sum(shape) + 3,))
        n = 1
        for d in shape:
            n *= d
        return flat[3:3 + n].view(shape) if n <= flat.numel() - 3 else flat[:0].reshape((0,))
    return filled(shape)


KEY_CHARS = string.ascii_letters + string.digits + "._-/ " + "éßλ中文🙂"
keys = st.one_of(
    st.text(alphabet=KEY_CHARS, min_size=1, max_size=24),
    st.builds(lambda a, n: (a * n)[:4000], st.text(alphabet=KEY_CHARS, min_size=1, max_size=8),
              st.integers(100, 600)),  # very long keys (up to 4,000 characters)
).filter(lambda k: k != "__metadata__")


@st.composite
def state_dicts(draw, dtypes=SHARED_DTYPES, layouts=LAYOUTS, shared=True, max_size=6):
    """A dict of tensors; some entries share storage with another (a view of it, or the same tensor)."""
    names = draw(st.lists(keys, min_size=1, max_size=max_size, unique=True))
    sd: dict[str, torch.Tensor] = {}
    for k in names:
        if shared and sd and draw(st.integers(0, 4)) == 0:
            other = sd[draw(st.sampled_from(sorted(sd)))]
            sd[k] = other if draw(st.booleans()) or other.dim() == 0 or other.numel() == 0 else other.view(-1)[:1] \
                if other.is_contiguous() else other
        else:
            sd[k] = draw(tensors(dtypes, layouts))
    return sd


# -------------------------------------------------------------------- checking


def assert_ckpt_reads(sd: dict[str, torch.Tensor], path: str) -> None:
    """ckpt's reader gives exactly sd's keys, dtypes, shapes and bytes."""
    ck = load(path)
    try:
        got = ck.by_key
        assert sorted(got) == sorted(sd), (sorted(got), sorted(sd))
        for k, t in sd.items():
            meta: TensorMeta = got[k]
            assert meta.dtype == str(t.dtype).replace("torch.", ""), k
            assert tuple(meta.shape) == tuple(t.shape), k
            assert tensor_bytes(meta) == raw_bytes(t), k
    finally:
        ck.close()


def assert_same_tensors(expected: dict[str, torch.Tensor], got: dict[str, torch.Tensor]) -> None:
    assert sorted(got) == sorted(expected)
    for k, t in expected.items():
        assert got[k].dtype == t.dtype and tuple(got[k].shape) == tuple(t.shape), k
        assert raw_bytes(got[k]) == raw_bytes(t), k


def tied_groups(sd: dict[str, torch.Tensor]) -> list[set[str]]:
    """Keys whose tensors are the very same view of one storage."""
    groups: dict[tuple, set[str]] = {}
    for k, t in sd.items():
        if t.numel():
            ident = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype)
            groups.setdefault(ident, set()).add(k)
    return [g for g in groups.values() if len(g) > 1]


# ------------------------------------------------------ files others write, read by ckpt


@PROFILE
@given(sd=state_dicts())
def test_torch_save_then_ckpt_reads_the_same(tmp_path_factory, sd):
    p = tmp_path_factory.mktemp("p") / "m.pth"
    torch.save(sd, p)
    assert_ckpt_reads(sd, str(p))


@PROFILE
@given(sd=state_dicts(dtypes=LEGACY_DTYPES))
def test_torch_legacy_save_then_ckpt_reads_the_same(tmp_path_factory, sd):
    p = tmp_path_factory.mktemp("p") / "m.pth"
    torch.save(sd, p, _use_new_zipfile_serialization=False)
    assert_ckpt_reads(sd, str(p))


@PROFILE
@given(sd=state_dicts(layouts=["contiguous"], shared=False))
def test_safetensors_save_file_then_ckpt_reads_the_same(tmp_path_factory, sd):
    p = tmp_path_factory.mktemp("p") / "m.safetensors"
    save_file(sd, p)
    assert_ckpt_reads(sd, str(p))


# --------------------------------------------------- ckpt's writers, read by everyone


@PROFILE
@given(sd=state_dicts())
def test_migrate_to_torch_zip_then_torch_and_ckpt_read_the_same(tmp_path_factory, sd):
    d = tmp_path_factory.mktemp("p")
    torch.save(sd, d / "src.pth")
    report = migrate(d / "src.pth", d / "out.pth", devices=["cpu"])
    assert report.written and report.ok
    back = torch.load(d / "out.pth", weights_only=True)
    assert_same_tensors(sd, back)
    for group in tied_groups(sd):  # tied weights stay tied (one storage)
        ptrs = {back[k].untyped_storage().data_ptr() for k in group}
        assert len(ptrs) == 1, group
    assert_ckpt_reads(sd, str(d / "out.pth"))


@PROFILE
@given(sd=state_dicts())
def test_migrate_to_safetensors_then_safetensors_and_ckpt_read_the_same(tmp_path_factory, sd):
    d = tmp_path_factory.mktemp("p")
    torch.save(sd, d / "src.pth")
    report = migrate(d / "src.pth", d / "out.safetensors", devices=["cpu"])
    assert report.written and report.ok
    stored = load_file(d / "out.safetensors")
    # tied tensors are stored once; the others name it in __metadata__ (save_model's convention)
    assert set(stored) <= set(sd) and set(sd) - set(stored) == set(report.aliases)
    assert_same_tensors({k: sd[k] for k in stored}, stored)
    assert_ckpt_reads(sd, str(d / "out.safetensors"))


@PROFILE
@given(sd=state_dicts(max_size=8), shard=st.sampled_from([1, 16, 64, 1 << 20]))
def test_migrate_to_shards_then_safetensors_and_ckpt_read_the_same(tmp_path_factory, sd, shard):
    d = tmp_path_factory.mktemp("p")
    torch.save(sd, d / "src.pth")
    report = migrate(d / "src.pth", d / "out", max_shard_size=shard, devices=["cpu"])
    assert report.written and report.ok
    stored: dict[str, torch.Tensor] = {}
    for name in report.shards:
        stored.update(load_file(d / "out" / name))
    assert_same_tensors({k: sd[k] for k in stored}, stored)
    assert_ckpt_reads(sd, str(d / "out"))


@PROFILE
@given(sd=state_dicts(dtypes=LEGACY_DTYPES, max_size=4))
def test_migrate_legacy_to_torch_zip_then_torch_reads_the_same(tmp_path_factory, sd):
    d = tmp_path_factory.mktemp("p")
    torch.save(sd, d / "src.pth", _use_new_zipfile_serialization=False)
    report = migrate(d / "src.pth", d / "out.pt", devices=["cpu"])
    assert report.written and report.ok
    assert_same_tensors(sd, torch.load(d / "out.pt", weights_only=True))


# ------------------------------------------------------------------------ rules

KEY_ALPHABET = "ab.01"
small_keys = st.lists(st.text(alphabet=KEY_ALPHABET, min_size=1, max_size=6), min_size=1, max_size=8, unique=True)
prefixes = st.text(alphabet=KEY_ALPHABET + "m_", min_size=1, max_size=4)
RENAMES = [(r"a\.(.*)", r"b.\1"), (r"(.*)\.0", r"\1.1"), (r"b(.*)", r"a\1"), (r"(.*)", r"x.\1"), (r"a", r"b"),
           (r"(.)(.*)", r"\2\1"), (r"0*(.*)", r"\1")]
rule_sets = st.builds(
    lambda strip, add, ren, drop: RuleSet(tuple(strip), add, tuple(ren), tuple(drop)),
    st.lists(st.sampled_from(["a.", "b.", "a.b.", "0"]), max_size=2),
    st.one_of(st.none(), st.sampled_from(["m.", "a.", "b"])),
    st.lists(st.sampled_from(RENAMES), max_size=2),
    st.lists(st.sampled_from(["*.0", "a*", "b"]), max_size=1),
)


def metas(names: list[str]) -> list[TensorMeta]:
    return [TensorMeta(k, "float32", (1,)) for k in names]


@settings(max_examples=max(200, EXAMPLES * 10), deadline=None, derandomize=EXAMPLES <= 50)
@given(names=small_keys, rules=rule_sets)
def test_rules_are_deterministic(names, rules):
    try:
        first = make_plan(metas(names), rules)
    except RuleConflict as exc:
        with pytest.raises(RuleConflict) as again:
            make_plan(metas(names), rules)
        assert str(again.value) == str(exc)
        return
    assert make_plan(metas(names), rules) == first
    # each key's fate depends on that key alone, not on the others around it
    for entry in first.entries:
        assert make_plan(metas([entry.source]), rules).entries[0].output == entry.output


@settings(max_examples=max(200, EXAMPLES * 10), deadline=None, derandomize=EXAMPLES <= 50)
@given(names=st.lists(st.text(alphabet=KEY_CHARS, min_size=1, max_size=12), min_size=1, max_size=10, unique=True),
       prefix=st.text(alphabet=KEY_CHARS, min_size=1, max_size=8))
def test_strip_prefix_after_add_prefix_is_the_identity(names, prefix):
    added = make_plan(metas(names), RuleSet(add_prefix=prefix))
    back = make_plan(metas([e.output for e in added.entries]), RuleSet(strip_prefix=(prefix,)))
    assert [e.output for e in back.entries] == names


@settings(max_examples=max(200, EXAMPLES * 10), deadline=None, derandomize=EXAMPLES <= 50)
@given(names=small_keys, rules=rule_sets)
def test_conflicts_are_always_detected(names, rules):
    """make_plan raises exactly when two kept keys meet or a key becomes empty."""
    outs = [rules.new_key(k) for k in names]
    kept = [o for o in outs if o is not None]
    conflict = len(set(kept)) < len(kept) or "" in kept
    if conflict:
        with pytest.raises(RuleConflict):
            make_plan(metas(names), rules)
    else:
        plan = make_plan(metas(names), rules)
        assert [e.output for e in plan.entries] == outs


@PROFILE
@given(names=small_keys, rules=rule_sets)
def test_conflicts_are_detected_before_anything_is_written(tmp_path_factory, names, rules):
    d = tmp_path_factory.mktemp("p")
    save_file({k: torch.zeros(1) for k in names}, d / "src.safetensors")
    before = sorted(os.listdir(d))
    outs = [rules.new_key(k) for k in names]
    kept = [o for o in outs if o is not None]
    try:
        report = migrate(d / "src.safetensors", d / "out.safetensors", rules=rules, devices=["cpu"])
    except RuleConflict:
        assert len(set(kept)) < len(kept) or "" in kept
        assert sorted(os.listdir(d)) == before  # no output, no temporary file
        return
    except Exception as exc:  # noqa: BLE001 - every rule drops every key: a usage error, nothing written
        assert not kept, exc
        assert sorted(os.listdir(d)) == before
        return
    assert report.written and len(set(kept)) == len(kept)
    assert sorted(load_file(d / "out.safetensors")) == sorted(kept)


@PROFILE
@given(sd=state_dicts(max_size=4), prefix=st.text(alphabet=KEY_CHARS, min_size=1, max_size=8))
def test_migrate_add_prefix_then_strip_prefix_gives_back_the_source(tmp_path_factory, sd, prefix):
    d = tmp_path_factory.mktemp("p")
    torch.save(sd, d / "src.pth")
    source = Path(d / "src.pth").read_bytes()
    migrate(d / "src.pth", d / "added.pth", add_prefix=prefix, devices=["cpu"])
    migrate(d / "added.pth", d / "back.pth", strip_prefix=[prefix], devices=["cpu"])
    assert_same_tensors(sd, torch.load(d / "back.pth", weights_only=True))
    assert Path(d / "src.pth").read_bytes() == source  # migrate never touches its input
    if sd:  # and the round trip went through a renamed file
        assert all(k.startswith(prefix) for k in torch.load(d / "added.pth", weights_only=True))


@PROFILE
@given(sd=state_dicts(max_size=4), target=st.sampled_from(["bfloat16", "float16", "float32", "float64"]),
       out=st.sampled_from(["out.pth", "out.safetensors"]))
def test_migrate_dtype_casts_floating_tensors_exactly_as_torch_does(tmp_path_factory, sd, target, out):
    d = tmp_path_factory.mktemp("p")
    torch.save(sd, d / "src.pth")
    report = migrate(d / "src.pth", d / out, dtype=target, devices=["cpu"])
    want = {k: (t.to(getattr(torch, target)) if t.is_floating_point() else t) for k, t in sd.items()}
    # Changed deliberately in issue 21: a cast that makes new inf/NaN fails unless allow_overflow accepts it
    # (it used to be written silently); with it, the output is still exactly torch's cast.
    overflow = sum(int((torch.isfinite(t.double()) & ~torch.isfinite(want[k].double())).sum())
                   for k, t in sd.items() if t.is_floating_point())
    assert report.ok == (not overflow) and report.written == (not overflow)
    assert sum(c.loss.new_nonfinite for c in report.cast_loss) == overflow
    if overflow:
        assert not (d / out).exists()
        report = migrate(d / "src.pth", d / out, dtype=target, devices=["cpu"], allow_overflow=True)
    assert report.written and report.ok
    assert_ckpt_reads(want, str(d / out))


# ------------------------------------------------ the pickle pre-check accepts real pickles

_plain = st.recursive(
    st.none() | st.booleans() | st.integers() | st.integers(min_value=-(2 ** 200), max_value=2 ** 200)
    | st.floats(allow_nan=False) | st.text(max_size=300) | st.binary(max_size=300),
    lambda inner: st.lists(inner, max_size=6) | st.tuples(inner, inner) | st.dictionaries(st.text(max_size=8), inner,
                                                                                          max_size=6)
    | st.frozensets(st.integers(), max_size=4) | st.sets(st.text(max_size=4), max_size=4),
    max_leaves=40,
)


@settings(max_examples=max(200, EXAMPLES * 10), deadline=None, derandomize=EXAMPLES <= 50)
@given(obj=_plain, protocol=st.integers(0, 5), shared=st.booleans())
def test_pickle_guard_accepts_every_pickle_python_writes(obj, protocol, shared):
    """The opcode pre-check never refuses what pickle itself writes (memo puts, frames, long strings)."""
    import io
    import pickle

    from ckpt_tool.pickles.unpickle import guard as pickle_guard

    value = [obj, obj, [obj]] if shared else obj  # shared references: memo gets
    data = pickle.dumps(value, protocol=protocol)
    assert pickle_guard.check_bytes(data, where="p", path="p") == len(data)
    stream = io.BytesIO(data + b"trailing bytes")
    assert pickle_guard.read_one(stream, where="p", path="p", max_bytes=1 << 30) == data
    assert stream.tell() == len(data)
