"""Model, data and training of the example: a small MLP on scikit-learn's bundled digits (offline)."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))


def data(partition: int, partitions: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """This partition's training split and the shared test split (a fixed shuffle, 80/20)."""
    x, y = load_digits(return_X_y=True)
    order = np.random.default_rng(0).permutation(len(y))
    x, y = torch.tensor(x[order] / 16.0, dtype=torch.float32), torch.tensor(y[order])
    cut = int(0.8 * len(y))
    mine = torch.arange(cut)[partition::partitions]
    return x[mine], y[mine], x[cut:], y[cut:]


def train(net: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, epochs: int, lr: float) -> float:
    opt = torch.optim.SGD(net.parameters(), lr=lr)
    g = torch.Generator().manual_seed(len(y))
    loss = torch.tensor(0.0)
    for _ in range(epochs):
        for idx in torch.randperm(len(y), generator=g).split(32):
            opt.zero_grad()
            loss = F.cross_entropy(net(x[idx]), y[idx])
            loss.backward()
            opt.step()
    return float(loss.detach())


def evaluate(net: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    with torch.no_grad():
        out = net(x)
        return float(F.cross_entropy(out, y)), float((out.argmax(1) == y).float().mean())
