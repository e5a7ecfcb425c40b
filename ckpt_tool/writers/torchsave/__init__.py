"""The torch.save zip format written without torch: the archive, ``data.pkl``, inert records, --sanitize."""
