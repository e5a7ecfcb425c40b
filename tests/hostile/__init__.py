"""A corpus of hostile and unusual checkpoints for the loader-parity harness (issue 13).

``generate.build(folder)`` writes it; ``tests/helpers/reference_loaders.py`` records what
torch.load and safetensors do with each file; ``tests/pickles/test_parity.py`` compares
that with ckpt. Nothing here is committed as binary: the corpus is rebuilt.
"""
