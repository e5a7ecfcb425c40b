"""``ckpt gate``: the pre-deploy checks, their policy file, and the report CI reads."""
