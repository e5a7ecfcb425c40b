"""NumPy's ``.npy`` and ``.npz`` weight files (np.save, np.savez, MLX's mx.save/mx.savez)."""
from .header import MAGIC, NpyHeader, parse_header
from .read import SINGLE_KEY, is_npz, read_npy, read_npz

__all__ = ["MAGIC", "SINGLE_KEY", "NpyHeader", "is_npz", "parse_header", "read_npy", "read_npz"]
