"""The restricted unpickler and the inert stand-ins it builds instead of running anything."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...lazy import lazy_exports

if TYPE_CHECKING:
    from .placeholders import (
        DTypeRef as DTypeRef,
    )
    from .placeholders import (
        LayoutRef as LayoutRef,
    )
    from .placeholders import (
        LazyStorage as LazyStorage,
    )
    from .placeholders import (
        LazyTensor as LazyTensor,
    )
    from .placeholders import (
        NumpyArray as NumpyArray,
    )
    from .placeholders import (
        NumpyScalar as NumpyScalar,
    )
    from .placeholders import (
        Placeholder as Placeholder,
    )
    from .placeholders import (
        StorageType as StorageType,
    )
    from .placeholders import (
        SubclassTensor as SubclassTensor,
    )
    from .placeholders import (
        is_module_placeholder as is_module_placeholder,
    )
    from .rebuilders import ALLOWED as ALLOWED
    from .rebuilders import NumpyDType as NumpyDType
    from .unpickler import (
        BlobReader as BlobReader,
    )
    from .unpickler import (
        restricted_load_stream as restricted_load_stream,
    )
    from .unpickler import (
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
