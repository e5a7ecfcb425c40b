"""What ``torch.load(path)`` (weights_only=True) does with a file or a folder, and the advice that follows."""
