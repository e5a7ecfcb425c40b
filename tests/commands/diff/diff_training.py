"""A small transformer-shaped model trained a few steps with torch, saved with torch.save at two steps.

Shared by the diff metric, rollup and report tests: real files written by real torch, with the key
layout (``layers.N.attn.q.weight``) that rollups and the heatmap fold.
"""
from __future__ import annotations

from pathlib import Path

import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.attn = nn.ModuleDict({"q": nn.Linear(d, d), "k": nn.Linear(d, d)})
        self.mlp = nn.Linear(d, d)
        self.norm = nn.LayerNorm(d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(torch.relu(self.attn["q"](self.norm(x)) * self.attn["k"](x)))


class Net(nn.Module):
    def __init__(self, d: int = 16, n: int = 4) -> None:
        super().__init__()
        self.embed = nn.Linear(8, d)
        self.layers = nn.ModuleList(Block(d) for _ in range(n))
        self.head = nn.Linear(d, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def train(folder: Path, steps: tuple[int, ...] = (3, 6)) -> dict[int, Path]:
    """Train Net with AdamW; torch.save its state_dict after each step in ``steps``; {step: path}."""
    torch.manual_seed(0)
    net = Net()
    opt = torch.optim.AdamW(net.parameters(), lr=1e-2)
    x, y = torch.randn(64, 8), torch.randint(0, 3, (64,))
    out = {}
    for step in range(1, max(steps) + 1):
        opt.zero_grad()
        nn.functional.cross_entropy(net(x), y).backward()
        opt.step()
        if step in steps:
            out[step] = folder / f"step{step}.pth"
            torch.save(net.state_dict(), out[step])
    return out
