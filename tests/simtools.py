"""Shared by the simulator's tests: the digits data set, loaded once, and a tiny, fast configuration."""

from __future__ import annotations

from mucsc.fedsim.config import SimConfig
from mucsc.fedsim.datasets import load_digits

DIGITS = load_digits(seed=0)


def tiny(**kw) -> SimConfig:
    """Logistic regression on digits, N = 6, K = 3, E = 2, B = 4, 2 rounds, every round evaluated."""
    base = dict(dataset="digits", model="logreg", clients=6, per_round=3, local_iters=2, batch_size=4,
                rounds=2, target=0.0, eval_every=1, samples_per_client=20, codecs=("none",))
    base.update(kw)
    return SimConfig(**base)
