"""levels_floor.beyond is a true bound: never "beyond" where k values come within the error (the
exact 1-D k-means optimum, by a dense DP), on both backends; and it decides tiny tensors."""

import numpy as np
import pytest

from mucsc.codec import kernels
from mucsc.codec.numerics import levels_floor

pytestmark = pytest.mark.backends  # .ci/run's torch and numpy passes run it too


def least_error(x: np.ndarray, k: int) -> float:
    """The exact least squared error of x by at most k values: a dense DP over every split."""
    xs = np.sort(x.astype(np.float64))
    xs -= xs.mean()
    n = xs.size
    P1, P2 = np.concatenate(([0.0], np.cumsum(xs))), np.concatenate(([0.0], np.cumsum(xs * xs)))
    a, b = np.meshgrid(np.arange(n + 1), np.arange(n + 1), indexing="ij")
    s1 = P1[b] - P1[a]
    cost = np.where(b >= a, np.maximum(P2[b] - P2[a] - s1 * s1 / np.maximum(b - a, 1), 0.0), np.inf)
    D = cost[0].copy()
    for _ in range(k - 1):
        D = np.min(D[:, None] + cost, axis=0)
    return float(D[n])


@pytest.mark.parametrize("backend", ["c", "numpy"])
def test_never_beyond_a_reachable_error(monkeypatch, backend):
    if backend == "c" and kernels.c_module() is None:
        pytest.skip("compiled kernels not built")
    monkeypatch.setattr(kernels, "BACKEND", backend)
    rng = np.random.default_rng(1)
    for i in range(120):
        n = int(rng.integers(1, 80))
        x = [rng.standard_normal(n), rng.integers(0, 5, n) * 0.25, rng.standard_t(2, n)][i % 3].astype(np.float32)
        k = int(rng.integers(1, n + 1))
        J = least_error(x, k)
        assert not levels_floor.beyond(x, k, J * (1 + 1e-12))
        if backend == "c" and J > 1e-6 * float(np.square(x - x.mean(dtype=np.float64)).sum()):
            # the compiled bound is the optimum itself (where it is not rounding noise)
            assert levels_floor.beyond(x, k, J * 0.999)


def test_edges():
    assert not levels_floor.beyond(np.arange(3.0), 3, 0.0)  # x itself
    assert levels_floor.beyond(np.arange(3.0), 0, 1e9)  # no value at all
    assert not levels_floor.beyond(np.zeros(0), 0, 0.0)
    assert levels_floor.beyond(np.arange(10.0), 1, 1.0)  # one value: the variance, 82.5
