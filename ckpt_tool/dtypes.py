"""The dtype vocabulary shared by every format, without importing torch.

Names are torch's dtype names without the ``torch.`` prefix; each format maps
its own codes (safetensors ``F16``, torch storage classes, NumPy type strings)
onto them here and nowhere else.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DType:
    name: str
    itemsize: int
    kind: str  # "float", "int", "uint", "bool", "complex", "quantized", "bits"
    safetensors: str | None
    storage: str | None  # legacy torch storage class name (torch.FloatStorage)
    numpy: str | None  # NumPy type string of the same bytes, when NumPy has one
    per_byte: int = 1  # elements packed in one byte (quint4x2: 2, quint2x4: 4); itemsize is then 1
    # safetensors elements per torch element: 2 for F4, whose header counts fp4 values where torch's
    # float4_e2m1fn_x2 counts bytes (the last dimension is doubled in the header)
    safetensors_per_item: int = 1
    torch_saves: bool = True  # False: torch.save raises on it (int1..int7, uint1..uint7 in torch 2.13)
    # The dtype whose values torch can compare, of the same width: bits types are compared as their
    # unsigned bit patterns, sub-byte integers as the byte each takes (torch has no ==, no cast for them)
    compare_as: str | None = None

    def nbytes(self, numel: int) -> int:
        """Bytes that ``numel`` elements take in a storage (sub-byte types round up)."""
        return numel * self.itemsize if self.per_byte == 1 else -(-numel // self.per_byte)

    @property
    def is_quantized(self) -> bool:
        return self.kind == "quantized"

    @property
    def is_floating(self) -> bool:
        return self.kind == "float"


_TABLE = [
    DType("float64", 8, "float", "F64", "DoubleStorage", "<f8"),
    DType("float32", 4, "float", "F32", "FloatStorage", "<f4"),
    DType("float16", 2, "float", "F16", "HalfStorage", "<f2"),
    DType("bfloat16", 2, "float", "BF16", "BFloat16Storage", None),
    DType("float8_e4m3fn", 1, "float", "F8_E4M3", None, None),
    DType("float8_e5m2", 1, "float", "F8_E5M2", None, None),
    DType("float8_e4m3fnuz", 1, "float", "F8_E4M3FNUZ", None, None),
    DType("float8_e5m2fnuz", 1, "float", "F8_E5M2FNUZ", None, None),
    DType("float8_e8m0fnu", 1, "float", "F8_E8M0", None, None),  # MX scales: an exponent byte, no sign; NaN 0xff
    # Two fp4 values (sign, 2 exponent bits, 1 mantissa bit; no NaN, no Inf) per byte; torch's numel counts bytes.
    DType("float4_e2m1fn_x2", 1, "float", "F4", None, None, safetensors_per_item=2),
    DType("int64", 8, "int", "I64", "LongStorage", "<i8"),
    DType("int32", 4, "int", "I32", "IntStorage", "<i4"),
    DType("int16", 2, "int", "I16", "ShortStorage", "<i2"),
    DType("int8", 1, "int", "I8", "CharStorage", "|i1"),
    DType("uint64", 8, "uint", "U64", None, "<u8"),
    DType("uint32", 4, "uint", "U32", None, "<u4"),
    DType("uint16", 2, "uint", "U16", None, "<u2"),
    DType("uint8", 1, "uint", "U8", "ByteStorage", "|u1"),
    DType("bool", 1, "bool", "BOOL", "BoolStorage", "|b1"),
    # Sub-byte integers: torch 2.13 defines them (one byte per element) and torch.load reads a pickle that names
    # them, but torch.save refuses them and torch has no kernels for them (compared as the byte each one takes).
    *(DType(f"int{n}", 1, "int", None, None, None, torch_saves=False, compare_as="int8") for n in range(1, 8)),
    *(DType(f"uint{n}", 1, "uint", None, None, None, torch_saves=False, compare_as="uint8") for n in range(1, 8)),
    # Bits types: opaque bit patterns (custom kernels' packed data); torch has no arithmetic on them.
    DType("bits8", 1, "bits", None, None, None, compare_as="uint8"),
    DType("bits16", 2, "bits", None, None, None, compare_as="uint16"),
    DType("bits1x8", 1, "bits", None, None, None, compare_as="uint8"),
    DType("bits2x4", 1, "bits", None, None, None, compare_as="uint8"),
    DType("bits4x2", 1, "bits", None, None, None, compare_as="uint8"),
    DType("complex64", 8, "complex", "C64", "ComplexFloatStorage", "<c8"),
    DType("complex128", 16, "complex", None, "ComplexDoubleStorage", "<c16"),
    DType("complex32", 4, "complex", None, None, None),  # torch.chalf: two float16s; NumPy has no such type
    # Quantized tensors (torch._utils._rebuild_qtensor): integer storage plus a scale and zero point.
    DType("qint8", 1, "quantized", None, "QInt8Storage", None),
    DType("quint8", 1, "quantized", None, "QUInt8Storage", None),
    DType("qint32", 4, "quantized", None, "QInt32Storage", None),
    DType("quint4x2", 1, "quantized", None, "QUInt4x2Storage", None, per_byte=2),
    DType("quint2x4", 1, "quantized", None, "QUInt2x4Storage", None, per_byte=4),
]

BY_NAME: dict[str, DType] = {d.name: d for d in _TABLE}
BY_SAFETENSORS: dict[str, DType] = {d.safetensors: d for d in _TABLE if d.safetensors}
BY_STORAGE: dict[str, DType] = {d.storage: d for d in _TABLE if d.storage}
# NumPy type strings, with every byte order spelling NumPy writes in a pickle.
BY_NUMPY: dict[str, DType] = {}
for _d in _TABLE:
    if _d.numpy:
        code = _d.numpy[1:]
        for order in ("<", "|", "=", ""):
            BY_NUMPY[order + code] = _d
BY_NUMPY.update({"b1": BY_NAME["bool"], "?": BY_NAME["bool"], "|b1": BY_NAME["bool"]})

# Aliases torch accepts on the command line (--dtype fp16) and in policies.
ALIASES = {
    "fp16": "float16", "half": "float16", "f16": "float16",
    "bf16": "bfloat16",
    "fp32": "float32", "float": "float32", "f32": "float32",
    "fp64": "float64", "double": "float64", "f64": "float64",
    "long": "int64", "int": "int32", "short": "int16",
}


def lookup(name: str) -> DType:
    """The DType for a torch name or a common alias; KeyError if unknown."""
    found = BY_NAME.get(name)
    if found is not None:
        return found
    key = name.lower().removeprefix("torch.")
    return BY_NAME[ALIASES.get(key, key)]


def is_known(name: str) -> bool:
    try:
        lookup(name)
    except KeyError:
        return False
    return True


# Floating dtypes whose casts migrate can prove (tensors/castloss.py reads their bits): a cast to or from any
# other floating dtype is refused before anything is written, never published unchecked.
CAST_CHECKED = frozenset(["float64", "float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2",
                          "float8_e4m3fnuz", "float8_e5m2fnuz"])


def safetensors_shape(dt: DType, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The shape a safetensors header gives a tensor of torch shape ``shape``: F4 counts fp4 values, so the
    last dimension of a float4_e2m1fn_x2 tensor doubles (safetensors.torch writes it so)."""
    if dt.safetensors_per_item == 1 or not shape:
        return shape
    return (*shape[:-1], shape[-1] * dt.safetensors_per_item)


def torch_shape(dt: DType, header_shape: tuple[int, ...]) -> tuple[int, ...] | None:
    """The torch shape of a safetensors header's ``header_shape`` (the inverse of safetensors_shape);
    None where torch has no such tensor (an F4 scalar, or an odd number of fp4 values in the last dimension)."""
    per = dt.safetensors_per_item
    if per == 1:
        return header_shape
    if not header_shape or header_shape[-1] % per:
        return None
    return (*header_shape[:-1], header_shape[-1] // per)
