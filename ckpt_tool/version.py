"""The package version, in the vocabulary layer so every layer may name it."""

__version__ = "0.1.0"
