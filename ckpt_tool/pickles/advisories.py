"""Public advisories against torch.load that a file's shape can match, named by every command."""
from __future__ import annotations

# Public advisories a file's shape matches, whatever its pickles hold (informational: the verdict comes
# from the globals and calls; these say which old torch versions would be exposed).
CVE_2025_32434_TAR = ("CVE-2025-32434: torch before 2.6 unpickles the torch 0.1 tar format without restriction "
                      "even under torch.load(weights_only=True); torch 2.6 and later refuse it there")
CVE_2025_32434_SCRIPT = ("CVE-2025-32434: torch before 2.6 hands TorchScript archives to torch.jit.load even under "
                         "torch.load(weights_only=True); torch 2.6 and later refuse them there")
