"""``ckpt diff``: what happens when A's weights are loaded where B is expected."""
