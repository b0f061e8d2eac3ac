"""What the PyTorch reference scripts share: one tensor of ndmesh's against PyTorch's, by the
largest difference relative to PyTorch's largest magnitude, failing the script past a bound."""
import sys

import torch


class Comparison:
    """compare(what, ours, ref) for each tensor; worst is the largest relative difference."""

    def __init__(self, bound, label=""):
        self.bound = bound
        self.label = f"{label} " if label else ""
        self.worst = 0.0

    def __call__(self, what, ours, ref):
        ours = torch.tensor(ours, dtype=torch.float64).reshape(ref.shape)
        rel = ((ours - ref).abs().max() / ref.abs().max()).item()
        self.worst = max(self.worst, rel)
        print(f"{self.label}{what}: max |ndmesh - torch| / max |torch| = {rel:.3g}")
        if not rel < self.bound:
            sys.exit(f"FAIL: {self.label}{what} differs from PyTorch by {rel:.3g} (bound {self.bound})")
