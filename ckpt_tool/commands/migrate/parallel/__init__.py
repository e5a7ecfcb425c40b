"""One migrate output written by several processes: ``--workers N`` or torchrun ranks."""
