"""torch.save files in every form (zip, legacy, tar, TorchScript), plain pickle and dill, and ``--unsafe`` loads."""
