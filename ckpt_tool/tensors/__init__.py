"""The only torch and NumPy adapter, by concern: data (bytes, torch objects), numerics, target, runtime.

Each sub-package exports what its siblings use in its ``__init__``, imported
on first use, so that ``import ckpt_tool`` and naming a package stay torch-free.
"""
