"""Proving what migrate wrote, bit for bit: re-read tensors, keys and the pickled tree against the source.

``torch.load`` never checks zip CRCs and ``torch.equal`` is not bitwise (NaN,
-0.0), so every comparison here is of raw bytes, as ``bytes`` objects
(a memcmp; ``memoryview`` comparison runs element by element).
"""
from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence

from ....io import MemorySource, pread_exact
from ....model import TensorMeta
from ....pickles.unpickle import DTypeRef, LazyTensor, NumpyArray, Placeholder, SubclassTensor
from ....writers import CHUNK, OutTensor, Region, coalesced, file_location, small_location, tensor_data
from ....writers.torchsave import as_meta, written_device
from .quantizer import same_quantizer
from .reread import span_of
from .subclass import inner_pairs

MAX_REPORTED = 5
Advance = Callable[[int], None]


def same_stream(a: Iterable[bytes | bytearray], b: Iterable[bytes | bytearray]) -> int | None:
    """None when both streams hold the same bytes, else the offset of the first difference."""
    ia, ib = iter(a), iter(b)
    abuf: bytes | bytearray = b""
    bbuf: bytes | bytearray = b""
    pos = 0
    while True:
        if not abuf:
            abuf = next(ia, b"")
        if not bbuf:
            bbuf = next(ib, b"")
        if not abuf or not bbuf:
            return None if not abuf and not bbuf else pos + min(len(abuf), len(bbuf))
        n = min(len(abuf), len(bbuf))
        pa, pb = (abuf if n == len(abuf) else abuf[:n]), (bbuf if n == len(bbuf) else bbuf[:n])
        if pa != pb:
            return pos + _first_difference(pa, pb)
        abuf, bbuf = abuf[n:], bbuf[n:]
        pos += n


def _first_difference(a: bytes | bytearray, b: bytes | bytearray) -> int:
    lo, hi = 0, min(len(a), len(b))
    while hi - lo > 64:
        mid = (lo + hi) // 2
        if a[lo:mid] != b[lo:mid]:
            hi = mid
        else:
            lo = mid
    return next((i for i in range(lo, hi) if a[i] != b[i]), hi)


def compare_pairs(pairs: Sequence[tuple[str, OutTensor, TensorMeta]], advance: Advance | None = None,
                  proven: Mapping[str, tuple[int, int]] | None = None, workers: int | None = None) -> list[str]:
    """Each (label, expected, re-read) pair: same dtype, shape and bytes (those ``proven`` where they lie, not
    again: verify/early.py), large tensors on ``workers`` threads (default: the cores). The first problems."""
    problems: list[str] = []
    checked: list[tuple[str, OutTensor, TensorMeta]] = []
    pairs = inner_pairs(pairs, problems)
    for label, exp, act in pairs:
        problem = _pair_problem(label, exp, act)
        if problem is not None:
            problems.append(problem)
        elif proven and _proven_here(proven.get(label), act):
            if advance is not None:
                advance(exp.nbytes)
        else:
            checked.append((label, exp, act))
        if len(problems) >= MAX_REPORTED:
            return problems
    if not problems:  # fast paths; with a dtype or shape problem, every tensor's bytes are still compared below
        checked = _unproven_large(checked, advance, workers)
        if _same_in_runs(checked, advance):
            return problems
    return _compare_bytes(checked, advance, problems)


def _pair_problem(label: str, exp: OutTensor, act: TensorMeta) -> str | None:
    """What makes a re-read tensor another one than expected before its bytes are read (None: nothing)."""
    if act.dtype != exp.dtype:
        return f"{label}: dtype is {act.dtype}, expected {exp.dtype}"
    if tuple(act.shape) != tuple(exp.shape):
        return f"{label}: shape is {list(act.shape)}, expected {list(exp.shape)}"
    if act.storage is None:
        return f"{label}: holds no data"
    return None


def _compare_bytes(checked: Sequence[tuple[str, OutTensor, TensorMeta]], advance: Advance | None,
                   problems: list[str]) -> list[str]:
    """``problems`` and each pair whose bytes differ, named with its first differing byte, tensor by tensor."""
    to_read = [(label, exp, OutTensor(label, act, act.dtype)) for label, exp, act in checked]
    expected = tensor_data([e for _, e, _ in to_read])
    actual = tensor_data([a for _, _, a in to_read])
    for (label, exp, _), (_, want), (_, got) in zip(to_read, expected, actual, strict=False):
        if isinstance(want, Region) or isinstance(got, Region):  # only writers ask for regions
            raise TypeError("compare_pairs reads bytes, not regions")
        if type(want) is tuple and type(got) is tuple and len(want) == 1 and len(got) == 1:
            # the common case: both whole in memory, one memcmp
            a, b = want[0], got[0]
            diff = None if a == b else (_first_difference(a, b) if len(a) == len(b) else min(len(a), len(b)))
        else:
            diff = same_stream(want, got)
        if diff is not None:
            problems.append(f"{label}: bytes differ from the expected values (first at byte {diff})")
            if len(problems) >= MAX_REPORTED:
                break
        if advance is not None:
            advance(exp.nbytes)
    return problems


def _proven_here(span: tuple[int, int] | None, act: TensorMeta) -> bool:
    """Whether the re-read tensor's bytes are the file range an EarlyCheck compared (offset, length)."""
    return span is not None and span_of(act) == span


_LARGE = 4 << 20  # bytes: tensors from this size are compared chunk by chunk on every core


def _unproven_large(checked: list[tuple[str, OutTensor, TensorMeta]], advance: Advance | None,
                    workers: int | None = None) -> list[tuple[str, OutTensor, TensorMeta]]:
    """``checked`` less the large tensors proven bit-identical, read and compared on every core.

    tensordata.check_reads: each worker reads a chunk of the source and of
    the output and compares them where it read them. A tensor that differs
    stays in the list: the tensor-by-tensor pass then names its first
    differing byte.
    """
    from ....tensors.data import check_reads, group_reads, same_bytes

    large = [i for i, (_, exp, act) in enumerate(checked)
             if exp.nbytes >= _LARGE and exp.streamable and act.is_contiguous and act.nbytes == exp.nbytes]
    if not large:
        return checked
    reads, group = group_reads([(checked[i][1].source, checked[i][2]) for i in large])
    owner = [large[g] for g in group]
    differs: set[int] = set()
    results = check_reads(reads, lambda k, a, b: same_bytes(a, b), skip=lambda k: owner[k] in differs,
                          workers=workers)
    try:
        for k, same in enumerate(results):
            if same is False:
                differs.add(owner[k])
    finally:
        results.close()
    proven = set(large) - differs
    if advance is not None:
        for i in sorted(proven):
            advance(checked[i][1].nbytes)
    return [c for i, c in enumerate(checked) if i not in proven]


def _same_in_runs(to_read: Sequence[tuple[str, OutTensor, TensorMeta]], advance: Advance | None) -> bool:
    """True when every re-read tensor holds the expected bytes, compared a run of neighbours at a time.

    The fast path for many small tensors (200,000 in some files): the output
    stores them back to back, so each run of neighbours in it is read once
    and compared with one memcmp against the source bytes of the same
    tensors. False (nothing proven) when a tensor is not a small located
    one, or any run differs: the tensor-by-tensor comparison then runs and
    names the first difference.
    """
    if not to_read:
        return False
    exp_locs = [small_location(e) for _, e, _ in to_read]
    if None in exp_locs:
        return False
    sizes = [e.nbytes for _, e, _ in to_read]
    act_locs = [file_location(a, a.storage_offset * a.itemsize if a.storage_offset else 0, size)
                if a.is_contiguous else None for (_, _, a), size in zip(to_read, sizes, strict=True)]
    if None in act_locs:
        return False
    expected = coalesced(exp_locs, sizes)
    i, n = 0, len(to_read)
    while i < n:
        source, start = act_locs[i]  # type: ignore[misc]
        end = start + sizes[i]
        j = i + 1
        while j < n and act_locs[j][0] is source and act_locs[j][1] == end and end - start < CHUNK:  # type: ignore[index]
            end += sizes[j]
            j += 1
        pieces = []
        for _ in range(i, j):
            k, data = next(expected)
            if data is None:  # a tensor with no neighbour to share a read with
                src, at = exp_locs[k]  # type: ignore[misc]
                data = pread_exact(src.fd(), sizes[k], at, src.path)
            pieces.append(data)
        if b"".join(pieces) != pread_exact(source.fd(), end - start, start, source.path):
            return False
        if advance is not None:
            advance(end - start)
        i = j
    return True


def compare_state_dict(expected: Sequence[OutTensor], actual: Mapping[str, TensorMeta], advance: Advance | None = None,
                       proven: Mapping[str, tuple[int, int]] | None = None) -> list[str]:
    """Every expected tensor present and bit-identical, and nothing else."""
    problems: list[str] = []
    pairs = []
    keys = set()
    for t in expected:
        keys.add(t.key)
        found = actual.get(t.key)
        if found is None:
            problems.append(f"{t.key}: missing from the output")
        else:
            pairs.append((t.key, t, found))
    problems = problems[:MAX_REPORTED] + compare_pairs(pairs, advance, proven)
    extra = sorted(k for k in actual if k not in keys)
    if extra:
        problems.append(f"unexpected tensors in the output: {', '.join(extra[:MAX_REPORTED])}")
    return problems[:MAX_REPORTED + 1]


def compare_keys(expected: Sequence[OutTensor], keys: Sequence[str]) -> list[str]:
    """The state_dict ckpt finds in the output has exactly the expected keys."""
    want = [t.key for t in expected]
    if sorted(want) == sorted(keys):
        return []
    missing = [k for k in want if k not in set(keys)]
    extra = [k for k in keys if k not in set(want)]
    return [f"the output's state_dict differs in keys: missing {missing[:MAX_REPORTED]}, "
            f"unexpected {extra[:MAX_REPORTED]}"]


def _held(mapping: object) -> Mapping[str, object]:
    """The re-read state_dict's tensors by key, nested ones (an optimizer's state) under dotted keys as
    the reader names them."""
    from ....formats.checkpoint import tensors_of

    if not isinstance(mapping, Mapping):
        return {}
    return tensors_of(mapping) or {}


def tensor_keys(mapping: object) -> list[str]:
    """The keys of a re-read state_dict mapping that hold tensors."""
    return [str(k) for k, val in _held(mapping).items() if isinstance(val, (LazyTensor, TensorMeta, SubclassTensor))]


def tensors_in(mapping: object) -> dict[str, TensorMeta]:
    """The tensor entries of a re-read state_dict mapping, as TensorMetas."""
    out = {}
    for k, val in _held(mapping).items():
        meta = _tensorish(val)
        if meta is not None:
            out[str(k)] = meta
    return out


def _tensorish(obj: object) -> TensorMeta | None:
    if isinstance(obj, (LazyTensor, TensorMeta)):
        return as_meta(obj)
    if isinstance(obj, SubclassTensor):
        from ....formats.checkpoint import subclass_meta

        return subclass_meta("", obj, _NO_MEMORY)
    return None


_NO_MEMORY = MemorySource("<subclass>")


class _TreeWalk:
    """What was pickled and what was re-read, side by side: one method per kind of value.

    Problems are collected (at most MAX_REPORTED); tensors are paired up and
    their bytes compared in one pass at the end (compare_pairs).
    """

    def __init__(self) -> None:
        self.problems: list[str] = []
        self.pairs: list[tuple[str, OutTensor, TensorMeta]] = []
        self.memo: set[tuple[int, int]] = set()

    def walk(self, e: object, a: object, path: str, depth: int) -> None:
        if len(self.problems) >= MAX_REPORTED or depth > 200:
            return
        where = path or "<top>"
        if isinstance(e, OutTensor) or _tensorish(e) is not None:
            self.tensor(e, a, where)
        elif isinstance(e, Mapping):
            self.mapping(e, a, path, depth)
        elif isinstance(e, (list, tuple)):
            self.sequence(e, a, path, depth)
        elif e is None or isinstance(e, _VALUES):
            self.note(_value_problem(e, a, where))
        elif isinstance(e, Placeholder):  # written back as it was read: same class, construction, state, items
            self.placeholder(e, a, where, depth)
        else:  # another object (a real one under --unsafe is re-read as a placeholder): only these are compared
            self.note(_class_or_set_problem(e, a, where))

    def note(self, problem: str | None) -> None:
        if problem is not None:
            self.problems.append(problem)

    def tensor(self, e: object, a: object, where: str) -> None:
        if (id(e), id(a)) in self.memo:
            return
        self.memo.add((id(e), id(a)))
        if isinstance(e, OutTensor):
            exp = e
        else:
            meta = as_meta(e)  # type: ignore[arg-type]  # _tensorish said it is a LazyTensor or TensorMeta
            exp = OutTensor(where, meta, meta.dtype)
        act = _tensorish(a)
        if act is None:
            self.problems.append(f"{where}: expected a tensor, found {type(a).__name__}")
            return
        sub = exp.source.subclass
        if sub is not None and isinstance(sub.record, SubclassTensor) and isinstance(a, SubclassTensor):
            # the class, outer dtype and shape (compare_pairs), then its state as a tree: its tensors bit for bit
            # class, dtype and shape; a storage of its own compared here, the tensors of its state below
            self.pairs.extend(p for p in inner_pairs([(where, exp, act)], self.problems) if p[0] == where)
            self.walk(sub.record.state, a.state, f"{where}<state>", 1)
            if sub.record.requires_grad != a.requires_grad or written_device(sub.record) != a.device:
                self.problems.append(f"{where}: requires_grad or device differs from the source")
            return
        self.pairs.append((where, exp, act))
        problem = same_quantizer(where, exp.source.quantizer if not exp.cast else None, act.quantizer, self.pairs)
        if problem:
            self.problems.append(problem)

    def mapping(self, e: Mapping[object, object], a: object, path: str, depth: int) -> None:
        where = path or "<top>"
        if not isinstance(a, Mapping):
            self.problems.append(f"{where}: expected a mapping, found {type(a).__name__}")
            return
        if list(map(str, e.keys())) != list(map(str, a.keys())):
            missing = [str(k) for k in e if k not in a]
            extra = [str(k) for k in a if k not in e]
            detail = (f"missing {missing[:MAX_REPORTED]}" if missing else "") + \
                (f" unexpected {extra[:MAX_REPORTED]}" if extra else "") or "keys in another order"
            self.problems.append(f"{where}: keys differ ({detail.strip()})")
            return
        for k in e:
            self.walk(e[k], a[k], f"{path}.{k}" if path else str(k), depth + 1)

    def sequence(self, e: list[object] | tuple[object, ...], a: object, path: str, depth: int) -> None:
        if not isinstance(a, (list, tuple)) or type(a) is not type(e) or len(a) != len(e):
            self.problems.append(f"{path or '<top>'}: expected a {type(e).__name__} of {len(e)} items")
            return
        for i, (x, y) in enumerate(zip(e, a, strict=True)):
            self.walk(x, y, f"{path}.{i}" if path else str(i), depth + 1)

    def placeholder(self, e: Placeholder, a: object, where: str, depth: int) -> None:
        if not isinstance(a, Placeholder) or a.qualname != e.qualname:
            self.problems.append(f"{where}: expected an object of class {e.qualname}, found {type(a).__name__}")
            return
        ed, ad = e.__dict__, a.__dict__
        if isinstance(ed.get("_ckpt_via"), tuple) != isinstance(ad.get("_ckpt_via"), tuple) or (
                not isinstance(ed.get("_ckpt_via"), tuple) and ed.get("_ckpt_via") != ad.get("_ckpt_via")):
            self.problems.append(f"{where}: {e.qualname} is built another way than in the source")
            return
        for part in ("_ckpt_args", "_ckpt_state", "_ckpt_items", "_ckpt_setitems"):
            self.walk(ed[part], ad[part], f"{where}<{part[6:]}>", depth + 1)


_VALUES = (NumpyArray, DTypeRef, bool, int, str, bytes, bytearray, complex, float)


def _value_problem(e: object, a: object, where: str) -> str | None:
    """A value that holds no tensors, re-read otherwise than it was written (None: the same)."""
    if isinstance(e, NumpyArray):
        same = isinstance(a, NumpyArray) and a.shape == e.shape and a.data == e.data
        return None if same else f"{where}: NumPy array differs"
    if isinstance(e, DTypeRef):
        return None if isinstance(a, DTypeRef) and a.name == e.name else f"{where}: dtype differs"
    if isinstance(e, float):
        same = type(a) is type(e) and isinstance(a, float) and (a == e or (math.isnan(a) and math.isnan(e)))
        return None if same else f"{where}: value is {a!r}, expected {e!r}"
    return None if type(a) is type(e) and a == e else f"{where}: value is {a!r:.60}, expected {e!r:.60}"


def _class_or_set_problem(e: object, a: object, where: str) -> str | None:
    """A placeholder class or a set, re-read otherwise than it was written; other objects are not compared."""
    if isinstance(e, type) and issubclass(e, Placeholder):
        same = isinstance(a, type) and issubclass(a, Placeholder) and a is e
        return None if same else f"{where}: expected the class {e._ckpt_module}.{e._ckpt_name}"
    if isinstance(e, (set, frozenset)):
        return None if isinstance(a, (set, frozenset)) and set(a) == set(e) else f"{where}: set differs"
    return None


def compare_tree(expected: object, actual: object, advance: Advance | None = None) -> list[str]:
    """Walk what was pickled and what was re-read side by side: structure, scalars and tensor bytes."""
    tree = _TreeWalk()
    tree.walk(expected, actual, "", 0)
    if tree.problems:
        return tree.problems
    return compare_pairs(tree.pairs, advance)
