"""Will ``torch.load(weights_only=True)`` load this pickle: the facts a walk finds, and torch's rules replayed."""
