"""The TorchScript code torch.jit.load runs, read statically, call by call.

torch.jit.load compiles every ``code/**.py`` of an archive and, while it
rebuilds the objects of data.pkl and constants.pkl, runs the ``__setstate__``
of each module and class that defines one. Those methods, and everything they
reach (functions of any code file, methods of modules and classes, dunder
methods an operator or ``with`` calls, constructors), are read here op by op
with Python's ``ast`` (TorchScript's serialized form is a subset of Python).

The reading over-approximates: a method called on a value of unknown type
follows every archive method of that name, and when an archive runs any
code at load, every dunder method of its classes is read as if reached. What
cannot be resolved is never assumed safe: an unknown callee, a name built at
run time (``getattr`` of a non-literal), code that does not parse, is a
finding "unreviewed". Nothing is imported or run.
"""
from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass, field

from .ops import BUILTINS, Judged, denied_in_chain, judge_chain, judge_method

MAX_FUNCTIONS = 20_000  # functions read per archive (a generated archive has far fewer)
_IGNORED_DUNDERS = frozenset(["__getstate__"])  # torch.jit.load never calls it


@dataclass(frozen=True)
class CodeFinding:
    """An operator (or a callee ckpt could not resolve) that code run at load reaches."""

    file: str  # archive member, e.g. "archive/code/__torch__.py"
    function: str  # qualified name of the function holding the call, e.g. "__torch__.M.__setstate__"
    line: int
    spelled: str  # how the code spells it: "torch.from_file", "ops.aten.save", ".foo()"
    judged: Judged
    entry: str  # the load-time method it is reached from

    @property
    def where(self) -> str:
        via = "" if self.entry == self.function else f", reached from {self.entry}"
        return f"{self.function}:{self.line} ({self.file}{via})"

    @property
    def message(self) -> str:
        what = (f"{self.judged.op}: {self.judged.reason}" if self.judged.kind == "denied"
                else f"unreviewed: {self.judged.reason}")
        return f"TorchScript code that torch.jit.load runs calls {self.spelled} ({what}) at {self.where}"


@dataclass
class _Func:
    qualname: str
    file: str
    node: ast.AST  # FunctionDef, or the module / class body outside functions
    cls: str | None = None
    module: str = ""  # the code file's module (``__torch__.a.b``): where a bare name is looked up


@dataclass
class _Index:
    functions: dict[str, list[_Func]] = field(default_factory=dict)  # qualname -> every definition of it
    by_method: dict[str, list[_Func]] = field(default_factory=dict)  # method name -> every class's method
    classes: set[str] = field(default_factory=set)
    bodies: list[_Func] = field(default_factory=list)  # top-level / class-level statements
    broken: list[CodeFinding] = field(default_factory=list)


def _module_of(member: str) -> str:
    """``archive/code/__torch__/a/b.py`` -> ``__torch__.a.b``."""
    inner = member.split("code/", 1)[1] if "code/" in member else member
    return inner[:-3].replace("/", ".")


def _index(files: dict[str, str]) -> _Index:
    idx = _Index()
    for member, text in sorted(files.items()):
        module = _module_of(member)
        try:
            tree = ast.parse(text, filename=member)
        except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:  # nesting past the parser's limits
            line = getattr(exc, "lineno", 0) or 0
            idx.broken.append(CodeFinding(member, module, line, "<unparsable code>", Judged(
                "unreviewed", "<unparsable code>", f"ckpt cannot parse it ({type(exc).__name__}), torch may"),
                module))
            continue
        loose: list[ast.stmt] = []
        for stmt in tree.body:
            if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef):
                q = f"{module}.{stmt.name}"
                idx.functions.setdefault(q, []).append(_Func(q, member, stmt, None, module))
            elif isinstance(stmt, ast.ClassDef):
                cq = f"{module}.{stmt.name}"
                idx.classes.add(cq)
                body: list[ast.stmt] = [ast.Expr(d) for d in stmt.decorator_list]
                for item in stmt.body:
                    if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                        f = _Func(f"{cq}.{item.name}", member, item, cq, module)
                        idx.functions.setdefault(f.qualname, []).append(f)
                        idx.by_method.setdefault(item.name, []).append(f)
                    else:
                        body.append(item)
                if body:
                    idx.bodies.append(_Func(f"{cq} (class body)", member, ast.Module(body=body, type_ignores=[]),
                                              None, module))
            else:
                loose.append(stmt)
        if loose:
            idx.bodies.append(_Func(f"{module} (top level)", member, ast.Module(body=loose, type_ignores=[]),
                                          None, module))
    return idx


def _chain(node: ast.AST) -> list[str] | None:
    """``a.b.c`` as ["a", "b", "c"]; ``getattr(a.b, "c")`` too (a literal name); None for anything else."""
    parts: list[str] = []
    while True:
        if isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr"
              and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant)
              and isinstance(node.args[1].value, str)):
            parts.extend(reversed(node.args[1].value.split(".")))
            node = node.args[0]
        elif isinstance(node, ast.Name):
            parts.append(node.id)
            return parts[::-1]
        else:
            return None


class _Reader:
    def __init__(self, idx: _Index) -> None:
        self.idx = idx
        self.findings: list[CodeFinding] = []
        self.queue: list[tuple[_Func, str]] = []
        self.seen: set[int] = set()  # ids of the nodes read (a name defined twice is read twice)

    def reach(self, f: _Func, entry: str) -> None:
        if id(f.node) in self.seen:
            return
        if len(self.seen) >= MAX_FUNCTIONS:  # never read as safe what was not read
            self.flag(f, f.node, f.qualname, Judged("unreviewed", f.qualname,
                                                    f"over {MAX_FUNCTIONS} functions reached; not read"), entry)
            return
        self.seen.add(id(f.node))
        self.queue.append((f, entry))

    def run(self) -> None:
        while self.queue:
            f, entry = self.queue.pop(0)
            self.read(f, entry)

    def flag(self, f: _Func, node: ast.AST, spelled: str, j: Judged, entry: str) -> None:
        if j.kind != "allowed":
            self.findings.append(CodeFinding(f.file, f.qualname, getattr(node, "lineno", 0), spelled, j, entry))

    def follow_qualified(self, f: _Func, node: ast.AST, chain: list[str], entry: str, called: bool) -> None:
        """``__torch__.a.fn`` / ``__torch__.a.Cls`` / ``__torch__.a.Cls.method``: the archive's own code."""
        q = ".".join(chain)
        if chain[-1] == "__new__" and ".".join(chain[:-1]) in self.idx.classes:
            chain, q = chain[:-1], ".".join(chain[:-1])  # Cls.__new__(Cls): an object made as Cls(...) makes it
        if q in self.idx.functions:
            for g in self.idx.functions[q]:
                self.reach(g, entry)
        elif q in self.idx.classes:
            for name, defs in self.idx.functions.items():  # constructing it runs __init__ (and any dunder)
                for g in defs:
                    if g.cls == q and name.rsplit(".", 1)[1].startswith("__"):
                        self.reach(g, entry)
        elif chain[:3] == ["__torch__", "torch", "classes"]:
            self.flag(f, node, q, judge_chain(chain[1:]), entry)
        elif called:
            self.flag(f, node, q, Judged("unreviewed", q, "code ckpt cannot find in the archive"), entry)

    def call(self, f: _Func, node: ast.Call, aliases: dict[str, list[str]], entry: str, local_names: set[str]) -> None:
        fn = node.func
        if isinstance(fn, ast.Name) and fn.id in aliases:
            chain: list[str] | None = aliases[fn.id]
        elif isinstance(fn, ast.Name) and fn.id in local_names:  # a parameter or a local, perhaps shadowing a builtin
            self.flag(f, node, fn.id, Judged("unreviewed", fn.id, "a call of a local value ckpt cannot resolve"),
                      entry)
            return
        elif isinstance(fn, ast.Name):
            if fn.id in ("getattr", "hasattr") and not (len(node.args) >= 2 and isinstance(node.args[1], ast.Constant)):
                self.flag(f, node, f"{fn.id}(..., <computed name>)",
                          Judged("unreviewed", fn.id, "a name built at run time"), entry)
                return
            local = f"{f.module}.{fn.id}"
            if fn.id == "getattr":  # getattr(torch, "from_file"): a reference, maybe called later
                chain = _chain(node)
                if chain is not None:
                    self.reference(f, node, chain, entry)
                return
            if fn.id in BUILTINS:
                return
            if local in self.idx.functions or local in self.idx.classes:
                self.follow_qualified(f, node, local.split("."), entry, True)
                return
            self.flag(f, node, fn.id, Judged("unreviewed", fn.id, "a callee ckpt cannot resolve"), entry)
            return
        else:
            chain = _chain(fn)
        if chain is not None and chain[0] in aliases:
            chain = aliases[chain[0]] + chain[1:]
        if chain is not None and chain[0] == "__torch__":
            self.follow_qualified(f, node, chain, entry, True)
        elif chain is not None and chain[0] in ("torch", "ops", "math"):
            self.flag(f, node, ".".join(chain), judge_chain(chain), entry)
        elif isinstance(fn, ast.Attribute):
            self.method(f, node, fn.attr, entry)
        else:
            spelled = f"<call of a {type(fn).__name__} expression>"  # never ast.unparse: it recurses
            self.flag(f, node, spelled, Judged("unreviewed", "call", "a callee ckpt cannot resolve"), entry)

    def method(self, f: _Func, node: ast.AST, name: str, entry: str) -> None:
        """A method of a value ckpt does not type: every archive class's method of that name is followed,
        and the operator of that name is judged unless an archive class defines it (a denied one always)."""
        defined = self.idx.by_method.get(name, [])
        for g in defined:
            self.reach(g, entry)
        judged = judge_method(name)
        if not defined or (judged.kind == "denied" and not judged.op.startswith("class::")):
            self.flag(f, node, f".{name}()", judged, entry)

    def read(self, f: _Func, entry: str) -> None:
        aliases: dict[str, list[str]] = {}
        local_names = _local_names(f.node)
        for node in _walk(f.node):
            if isinstance(node, ast.Assign | ast.AnnAssign):
                value = node.value
                chain = _chain(value) if value is not None else None
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for t in targets:
                    if isinstance(t, ast.Name) and chain is not None and chain[0] in ("torch", "ops", "math",
                                                                                        "__torch__"):
                        aliases[t.id] = chain
            elif isinstance(node, ast.ImportFrom | ast.Import):
                for a in node.names:
                    root = (node.module.split(".") if isinstance(node, ast.ImportFrom) and node.module else [])
                    aliases[(a.asname or a.name).split(".")[0]] = root + a.name.split(".") if root else [a.name]
            elif isinstance(node, ast.Call):
                self.call(f, node, aliases, entry, local_names)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
                chain = _chain(node)
                if chain is not None:
                    self.reference(f, node, chain, entry)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
                for g in self.idx.functions.get(f"{f.module}.{node.id}", []):
                    self.reach(g, entry)
            elif isinstance(node, ast.With | ast.AsyncWith):
                for name in ("__enter__", "__exit__"):
                    self.method(f, node, name, entry)

    def reference(self, f: _Func, node: ast.AST, chain: list[str], entry: str) -> None:
        """A name used as a value (``fn = torch.from_file``, ``torch.jit._fork(__torch__.g, x)``)."""
        if chain[0] == "__torch__":
            self.follow_qualified(f, node, chain, entry, False)
            return
        denied = denied_in_chain(chain)
        if denied is not None:
            self.flag(f, node, ".".join(chain), denied, entry)


def _local_names(node: ast.AST) -> set[str]:
    """Every name a function binds (parameters, assignments, loop and with targets): none is a builtin there."""
    out: set[str] = set()
    for n in _walk(node):
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store | ast.Del):
            out.add(n.id)
        elif isinstance(n, ast.arg):
            out.add(n.arg)
    return out


def _walk(node: ast.AST) -> Iterator[ast.AST]:
    """Every node, each attribute chain once (its inner Attribute/Name nodes are the same reference)."""
    stack = [node]
    while stack:
        n = stack.pop()
        yield n
        if isinstance(n, ast.Attribute) and _chain(n) is not None:
            continue
        if isinstance(n, ast.Call) and _chain(n.func) is not None:
            stack.extend(n.args)
            stack.extend(k.value for k in n.keywords)
            if isinstance(n.func, ast.Attribute) and _chain(n.func.value) is None:
                stack.append(n.func.value)
            continue
        stack.extend(reversed(list(ast.iter_child_nodes(n))))


def judge_code(files: dict[str, str], *, every_function: bool = False) -> list[CodeFinding]:
    """What the code torch.jit.load runs (``__setstate__`` and all it reaches) calls outside the allowlist.

    ``files`` maps each ``code/**.py`` member to its text. A finding's
    ``judged.kind`` is "denied" (a reviewed operator with side effects) or
    "unreviewed" (an operator or callee ckpt cannot vouch for): both dangerous.
    ``every_function`` reads every function as if load ran it (``forward`` too).
    """
    idx = _index(files)
    reader = _Reader(idx)
    if every_function:
        for defs in idx.functions.values():
            for g in defs:
                reader.reach(g, g.qualname)
    for body in idx.bodies:  # class and top-level statements run when torch compiles the file
        reader.reach(body, body.qualname)
    setstates = [g for g in idx.by_method.get("__setstate__", [])]
    for g in setstates:
        reader.reach(g, g.qualname)
    reader.run()  # first: what each __setstate__ reaches is named from it
    if setstates:  # code runs at load: any dunder an operator, a with or a constructor reaches
        for name, methods in sorted(idx.by_method.items()):
            if name.startswith("__") and name.endswith("__") and name not in _IGNORED_DUNDERS:
                for g in methods:
                    reader.reach(g, g.qualname)
    reader.run()
    out = {(x.file, x.function, x.line, x.spelled): x for x in [*idx.broken, *reader.findings]}
    return sorted(out.values(), key=lambda x: (x.file, x.line, x.spelled))
