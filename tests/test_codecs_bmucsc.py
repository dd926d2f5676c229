"""B-MUCSC (paper IV-E): the top d0 are clustered and unbiased, the rest is their mean, positions cost
about 8.1 bits at d0 = 0.01 d (entropy bound 8.08) or the paper's ceil(log2 d)."""

import math

import numpy as np
import pytest

import mucsc
from mucsc.codec.numerics import quantize
from mucsc.codec.wire import sparse
from mucsc.codec.codecs.base import codec_class, get_codec

pytestmark = pytest.mark.backends  # .ci/run's torch and numpy passes run it too


def _x(n, seed=0):
    return np.random.default_rng(seed).standard_normal(n).astype(np.float32)


def test_kept_set_and_mean_of_the_rest():
    x = _x(20_000, 1)
    y = mucsc.decode(mucsc.encode(x, "bmucsc", keep=0.02, z=16))
    k = math.ceil(0.02 * x.size)
    top = sparse.top_k(x, k)
    rest = np.setdiff1d(np.arange(x.size), top)
    mean = np.float32(x[rest].astype(np.float64).mean())
    assert np.all(y[rest] == mean)
    # kept values are centroids in [min, max] of the kept set, at most z distinct
    assert len(np.unique(y[top])) <= 16
    assert y[top].min() >= x[top].min() - 1e-6 and y[top].max() <= x[top].max() + 1e-6


def test_kept_part_is_unbiased():
    x = _x(400, 2).astype(np.float64)
    c, cls = get_codec("bmucsc", keep=0.25, z=4), codec_class("bmucsc")
    k = 100
    top = sparse.top_k(x, k)
    reps = 1200
    samples = np.empty((reps, k))
    for s in range(reps):
        enc = c.encode_array(x, np.random.default_rng(s))
        secs = {t.tag: memoryview(bytes(t.tobytes())) for t in enc.sections}
        samples[s] = cls.decode_array(x.size, enc.params, secs, np.dtype(np.float64))[top]
    # the optimal solver is deterministic: the same centroids every seed, so the exact per-element
    # variance (eq. 8) gives the standard error even where a rare rounding never happened
    cent = np.frombuffer(secs["CENT"], "<f4").astype(np.float64)
    se = np.sqrt(quantize.expected_sq_error(x[top], cent) / reps)
    moving = se > 0
    assert np.all(np.abs(samples.mean(0) - x[top])[moving] < 5 * se[moving])
    assert np.allclose(samples.mean(0)[~moving], x[top][~moving], atol=1e-6)


def test_position_bits_near_entropy():
    d = 400_000
    x = _x(d, 3)
    k = math.ceil(0.01 * d)
    info = mucsc.inspect(mucsc.encode(x, "bmucsc", compress="off"))
    indx = next(s for s in info.sections if s.tag == "INDX").raw_bytes
    bound = (math.lgamma(d + 1) - math.lgamma(k + 1) - math.lgamma(d - k + 1)) / math.log(2) / k
    assert bound < 8 * indx / k < bound + 0.06
    assert info.groups[0].params["pos"] == "rice"
    paper = mucsc.inspect(mucsc.encode(x, "bmucsc", positions="paper", compress="off"))
    indx_paper = next(s for s in paper.sections if s.tag == "INDX").raw_bytes
    assert indx_paper == math.ceil(k * 19 / 8)  # ceil(log2 400000) = 19


def test_dense_keep_uses_a_bitmap():
    x = _x(10_000, 4)
    info = mucsc.inspect(mucsc.encode(x, "bmucsc", keep=0.6, z=16))
    assert info.groups[0].params["pos"] == "bitmap"


def test_constant_and_tiny_inputs():
    for x in (np.full(50, 0.1, np.float64), np.array([1e-300, -2e-300]), np.array([3.0], np.float32)):
        y = mucsc.decode(mucsc.encode(x, "bmucsc", keep=0.5))
        assert y.shape == x.shape and np.all(np.isfinite(y))
        assert np.allclose(y, x, atol=1e-6 * max(1.0, float(np.abs(x).max()))) or x.size == 2


@pytest.mark.parametrize("solver", ["optimal", "uniform", "paper", "exact"])
def test_solver_passed_through(solver):
    x = _x(3000, 5)
    blob = mucsc.encode(x, "bmucsc", keep=0.1, z=8, solver=solver)
    assert mucsc.inspect(blob).groups[0].params["solver"] == solver
    y = mucsc.decode(blob)
    assert np.count_nonzero(y != y[np.argmin(np.abs(x))]) >= 1
