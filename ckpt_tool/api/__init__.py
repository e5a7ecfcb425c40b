"""The typed public API behind ``ckpt_tool.inspect`` and its siblings: one module per command.

Each module wraps its command with the command's own signature (a ParamSpec,
so mypy checks every keyword) and returns a subclass of the command's report
whose ``str()`` is the text the CLI prints. ``commands/`` may not import
``render/`` (tests/test_layers.py); this layer sits above both and joins them.
docs/api.md explains the choice. Nothing is re-exported here: ``ckpt_tool``
imports each module on first use, so ``import ckpt_tool`` stays light.
"""
