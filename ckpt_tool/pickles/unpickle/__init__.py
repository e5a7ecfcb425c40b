"""The restricted unpickler and the inert stand-ins it builds instead of running anything."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...lazy import lazy_exports

if TYPE_CHECKING:
    from .placeholders import (
        DTypeRef as DTypeRef,
        LayoutRef as LayoutRef,
        LazyStorage as LazyStorage,
        LazyTensor as LazyTensor,
        NumpyArray as NumpyArray,
        NumpyScalar as NumpyScalar,
        Placeholder as Placeholder,
        StorageType as StorageType,
        SubclassTensor as SubclassTensor,
        is_module_placeholder as is_module_placeholder,
    )
    from .rebuilders import ALLOWED as ALLOWED, NumpyDType as NumpyDType
    from .unpickler import (
        BlobReader as BlobReader,
        restricted_load_stream as restricted_load_stream,
        restricted_loads as restricted_loads,
    )

# What other packages import from this one, each name imported from its module on first use
# (ckpt_tool/lazy.py); tests/test_surfaces.py keeps it the only way in.
EXPORTS: dict[str, tuple[str, ...]] = {
    "placeholders": (
        "DTypeRef", "LayoutRef", "LazyStorage", "LazyTensor", "NumpyArray", "NumpyScalar", "Placeholder",
        "StorageType", "SubclassTensor", "is_module_placeholder",
    ),
    "rebuilders": ("ALLOWED", "NumpyDType"),
    "unpickler": ("BlobReader", "restricted_load_stream", "restricted_loads"),
}
__getattr__ = lazy_exports(__name__, EXPORTS)
__all__ = [
    "ALLOWED", "BlobReader", "DTypeRef", "LayoutRef", "LazyStorage", "LazyTensor", "NumpyArray", "NumpyDType",
    "NumpyScalar", "Placeholder", "StorageType", "SubclassTensor", "is_module_placeholder", "restricted_load_stream",
    "restricted_loads",
]
