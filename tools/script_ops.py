"""Generate ckpt_tool/pickles/script/ops.txt: the operators TorchScript code may run at load.

Run from the repository root with the pinned torch installed (the table records its version):

    python tools/script_ops.py > ckpt_tool/pickles/script/ops.txt

Every operator schema torch registers (``torch._C._jit_get_all_schemas()``) is
listed once per ``namespace::name`` (overloads share a verdict). An operator is
ALLOWED when its namespace computes on tensors and values only (NAMESPACES) and
no rule in DENIED names it; it is DENIED, with the reason written beside it,
when it touches files, processes, the network, or state that outlives the call
(the RNG seed, thread pools, grad mode, backend caches). Mutation of the
operator's own tensor arguments (``add_``, ``set_``) is allowed: it changes
nothing outside the objects being loaded. An operator torch does not register
(a custom op of another library, a name that does not exist) is absent from
the table, and ckpt judges an absent operator dangerous (unreviewed).

Decisions that are not obvious:
- random sampling (``rand``, ``normal_``, ``dropout``) is allowed: it consumes
  the global generator like any forward pass, and cannot choose its state;
  ``manual_seed``/``seed`` are denied: they overwrite the process's RNG state,
  which a caller relies on for reproducibility (a silent tampering of results).
- ``print`` (prim::Print), ``warn`` and ``_print`` are allowed: they write
  text to the process's stdout/stderr and reach nothing else.
- ``set_grad_enabled`` is allowed: grad mode is thread-local, it is what torch's own
  ``with torch.no_grad()`` compiles to (``no_grad.__enter__``/``__exit__`` in the
  archive's code set and restore it), and it reaches no file, process or network.
  Process-wide settings that no load-time idiom restores are denied (seed, cuFFT
  plan cache, backend selection).
"""
from __future__ import annotations

import re
import sys

# Namespaces of operators that compute on tensors and values (each op is still matched against DENIED).
NAMESPACES = ("aten", "prim", "prims", "quantized", "_quantized", "quantization", "sparse", "mkldnn",
              "mkldnn_prepacked", "mkl", "onednn")
# Namespaces left out whole, and why (an op of theirs is judged dangerous like any unreviewed op).
EXCLUDED_NAMESPACES = {
    "c10d": "collective communication: reaches other processes over the network",
    "_c10d_functional": "collective communication: reaches other processes over the network",
    "_c10d_functional_autograd": "collective communication: reaches other processes over the network",
    "symm_mem": "symmetric memory across processes (NVSHMEM/NCCL rendezvous)",
    "profiler": "process-wide profiler state",
    "debugprims": "load_tensor reads a file",
    "inductor": "compiler runtime internals, not for serialized code",
    "inductor_prims": "reserves RNG state",
    "rngprims": "RNG state",
    "static_runtime": "Static Runtime internals",
    "_test": "torch's own tests",
    "debug_mode_ops": "debug-mode hooks",
    "export": "torch.export internals",
    "_dtensor": "DTensor runtime internals",
    "onnx": "ONNX export internals",
    "_native": "internal native kernels",
}
# Namespaces of torch's C++ classes (torch.classes.NS.Class) that hold packed weights and only compute;
# the others, and why. A method of a class in neither is unreviewed.
CLASS_NAMESPACES = ("quantized", "sparse", "rnn", "mkldnn", "xnnpack", "onednn", "vulkan", "metal")
CLASS_NAMESPACES_DENIED = {
    "c10d": "process groups: reach other processes over the network",
    "dist_rpc": "remote procedure calls over the network",
    "profiling": "process-wide profiler state",
    "_nnapi": "compiles and runs an NNAPI model",
    "backendutils": "delegate backend internals",
    "aten": "opaque objects of torch.export internals",
}
# (pattern on namespace::name, reason): the first match denies the op.
DENIED: tuple[tuple[str, str], ...] = (
    (r"aten::from_file", "opens, creates and maps a file (shared=True writes it)"),
    (r"aten::save", "writes a file"),
    (r".*::.*load.*", "reads a file or loads code"),
    (r"aten::(manual_seed|seed)", "overwrites the process's RNG seed"),
    (r"aten::_cufft_(set|clear)_.*", "sets a process-wide cuFFT plan cache setting"),
    (r"aten::_set_(?!item$).*", "sets process-wide state"),
    (r"aten::_use_.*", "queries/selects a backend for the process"),
    (r"prim::(rpc_async|rpc_sync|rpc_remote)", "remote procedure call over the network"),
    (r"prim::(PythonOp|IgnoredPythonOp)", "calls a Python function"),
    (r"prim::(profile|profile_ivalue|AddStatValue|TimePoint)", "profiler/statistics state"),
    (r"prim::(BailOut|BailoutTemplate|Guard|TypeCheck|RequiresGradCheck|FallbackGraph|DifferentiableGraph"
     r"|FusionGroup|TensorExprGroup|TensorExprDynamicGroup|TensorExprDynamicGuard|StaticSubgraph"
     r"|oneDNNFusionGroup|oneDNNFusionGuard|CudaFusionGroup)", "executor-internal node that runs a subgraph"),
    (r"aten::wait", "waits on a future (an RPC's among them)"),
)


def main() -> int:
    import torch

    names = sorted({s.name for s in torch._C._jit_get_all_schemas()})
    print(f"# Operators TorchScript code may run when torch.jit.load loads an archive (torch {torch.__version__}).")
    print("# Generated by tools/script_ops.py; read its docstring for the rules. One op per line:")
    print("#   +ns::name            allowed (computes on tensors/values; may mutate its own arguments)")
    print("#   -ns::name  REASON    denied (files, processes, network, or state beyond the call)")
    print("#   +class::NS.method    a method of torch's own C++ classes torch.classes.NS.* (packed weights)")
    print("# An op absent from this table is unreviewed, and judged dangerous.")
    methods = set()
    for schema in torch._C._jit_get_custom_class_schemas():  # methods of torch's own C++ classes
        owner = str(schema.arguments[0].type)  # __torch__.torch.classes.NS.Class
        methods.add((owner.split(".")[3], schema.name))
    for ns, method in sorted(methods):
        if ns in CLASS_NAMESPACES:
            print(f"+class::{ns}.{method}")
        else:
            print(f"-class::{ns}.{method}  {CLASS_NAMESPACES_DENIED.get(ns, f'class namespace {ns} not reviewed')}")
    for name in names:
        ns = name.split("::")[0]
        if ns in EXCLUDED_NAMESPACES:
            print(f"-{name}  {EXCLUDED_NAMESPACES[ns]}")
            continue
        if ns not in NAMESPACES:
            print(f"-{name}  namespace {ns} not reviewed")
            continue
        reason = next((r for pat, r in DENIED if re.fullmatch(pat, name)), None)
        print(f"-{name}  {reason}" if reason else f"+{name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
