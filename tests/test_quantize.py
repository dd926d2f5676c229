"""Stochastic rounding (eq. 7): unbiasedness, variance == J (eq. 8-9), wire centroids, ids, determinism."""

from __future__ import annotations

import numpy as np
import pytest

import mucsc
from mucsc.codec.numerics import quantize
from mucsc.codec.numerics.centroids import solve, variance_J
from mucsc.codec.numerics.quantize import dequantize, expected_sq_error, stochastic_round, wire_centroids
from mucsc.errors import InputError, ParameterError

from test_centroids import DISTS, make

pytestmark = pytest.mark.backends  # .ci/run's torch and numpy passes run it too

R = 1000  # encodings per unbiasedness check


def encodings(x: np.ndarray, c: np.ndarray, reps: int, seed0: int = 0) -> np.ndarray:
    """Decoded values of ``reps`` independently seeded encodings, float64, shape (reps, d)."""
    cw = c.astype(np.float64)
    return np.stack([cw[stochastic_round(x, c, np.random.default_rng(seed0 + r))] for r in range(reps)])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("scale", [1e-6, 1e2])
@pytest.mark.parametrize("name", DISTS)
def test_unbiased(name, scale, dtype):
    """Per element, the mean of R encodings is within 5 standard errors sqrt(J_m / R) of U_m."""
    x = make(name, 200, seed=21, scale=scale, dtype=dtype)
    c = wire_centroids(solve(x, 8), x, dtype)
    dec = encodings(x, c, R)
    xm = x.astype(np.float64)
    jm = expected_sq_error(xm, c)
    bias = (dec - xm).mean(axis=0)  # mean of deviations: no cancellation against |U_m|
    assert np.all(np.abs(bias) <= 5 * np.sqrt(jm / R))
    on_level = jm == 0  # elements equal to a level are transmitted exactly, every time
    assert on_level.any()
    assert np.all(dec[:, on_level] == xm[on_level])
    # only the two bracketing levels are ever used
    k = quantize.interval_index(xm, c)
    lo, hi = c.astype(np.float64)[k], c.astype(np.float64)[k + 1]
    assert np.all((dec == lo) | (dec == hi))


@pytest.mark.parametrize("wire", [np.float16, np.float32, np.float64])
def test_unbiased_uniform_levels_every_wire_dtype(wire):
    """Non-data levels (uniform), rounded to each wire dtype, float32 data: still unbiased."""
    x = make("laplace", 200, seed=22, dtype=np.float32)
    c = wire_centroids(solve(x, 6, "uniform"), x, wire)
    assert c.dtype == wire
    dec = encodings(x, c, R, seed0=5000)
    jm = expected_sq_error(x, c)
    assert np.all(np.abs((dec - x.astype(np.float64)).mean(axis=0)) <= 5 * np.sqrt(jm / R))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", DISTS)
def test_variance_matches_J(name, dtype):
    """The squared error per encoding averages to J; tolerance 5 standard errors of that average."""
    x = make(name, 500, seed=23, dtype=dtype)
    c = wire_centroids(solve(x, 4), x, dtype)
    dec = encodings(x, c, R, seed0=10_000)
    sq = ((dec - x.astype(np.float64)) ** 2).sum(axis=1)  # one total squared error per encoding
    J = variance_J(x, c)
    assert abs(sq.mean() - J) <= 5 * sq.std(ddof=1) / np.sqrt(R)
    ids, J2 = stochastic_round(x, c, np.random.default_rng(0), return_J=True)
    assert J2 == pytest.approx(J, rel=1e-5)


def test_probabilities_binomial():
    """One element repeated: the fraction rounded up is (U - r_z)/(r_{z+1} - r_z) within 5 sigma."""
    c = np.array([0.0, 0.3, 1.0], np.float32)
    for u in (0.1, 0.65, 0.307, 0.999):
        x = np.full(200_000, u, np.float32)
        ids = stochastic_round(x, c, np.random.default_rng(1))
        base = 1 if u > 0.3 else 0
        frac = np.mean(ids == base + 1)
        exp = (float(np.float32(u)) - float(c[base])) / (float(c[base + 1]) - float(c[base]))
        assert abs(frac - exp) <= 5 * np.sqrt(exp * (1 - exp) / x.size)


def test_locator_with_crowded_levels():
    """Many levels inside one grid bin, data on levels and between them: ids always bracket x."""
    rng = np.random.default_rng(3)
    x = np.concatenate([rng.standard_normal(5000), 1e-7 * rng.standard_normal(5000), [0.0]]).astype(np.float32)
    for z in (16, 256, 300):
        c = wire_centroids(solve(x, z), x, np.float32)
        ids = stochastic_round(x, c, np.random.default_rng(0))
        assert ids.dtype == (np.uint8 if c.size <= 256 else np.uint16)
        k = quantize.interval_index(x, c)
        assert np.all((ids == k) | (ids == k + 1))
        on = np.isin(x, c)
        assert np.all(c[ids[on]] == x[on])
        ids2, J = stochastic_round(x, c, np.random.default_rng(0), return_J=True)
        np.testing.assert_array_equal(ids, ids2)
        assert J == pytest.approx(variance_J(x, c), rel=1e-4)


def test_determinism_and_chunking():
    x = make("t3", 3 * quantize.CHUNK + 17, seed=24, dtype=np.float32)
    c = wire_centroids(solve(x, 16), x)
    a = stochastic_round(x, c, np.random.default_rng(42))
    b = stochastic_round(x.copy(), c, np.random.default_rng(42))
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, stochastic_round(x, c, np.random.default_rng(43)))


def test_draw_key_is_the_generators_full_range_draw():
    """draw_key takes PCG64's raw output for FORMAT.md 4.3's ``rng.integers(0, 2**64, dtype=uint64)``:
    the same key and the generator left in the same state, for the API's generators and others."""
    for seed in range(200):
        for make_bits in (lambda s: np.random.PCG64(np.random.SeedSequence([s, 3])), np.random.MT19937):
            a, b = np.random.Generator(make_bits(seed)), np.random.Generator(make_bits(seed))
            b.random()  # a buffered 32-bit half must not matter either
            a.random()
            assert quantize.draw_key(a) == int(b.integers(0, 1 << 64, dtype=np.uint64))
            assert a.integers(0, 1 << 62) == b.integers(0, 1 << 62)


def test_id_dtype_and_single_centroid():
    x = np.full(10, 2.0, np.float32)
    ids = stochastic_round(x, np.array([2.0], np.float32), np.random.default_rng(0))
    assert ids.dtype == np.uint8 and not ids.any()
    assert quantize.id_dtype(256) == np.uint8 and quantize.id_dtype(257) == np.uint16
    assert quantize.id_dtype(65536) == np.uint16
    assert stochastic_round(np.empty(0, np.float32), np.array([0.0, 1.0]), np.random.default_rng(0)).size == 0


def test_input_errors():
    x = np.array([0.0, 0.5, 1.0], np.float32)
    rng = np.random.default_rng(0)
    with pytest.raises(InputError):
        stochastic_round(x, np.array([0.1, 1.0], np.float32), rng)  # does not bracket
    with pytest.raises(ParameterError):
        stochastic_round(x, np.array([0.0, 0.0, 1.0], np.float32), rng)  # not strictly increasing
    with pytest.raises(InputError):
        stochastic_round(x.astype(np.int32), np.array([0.0, 1.0]), rng)


@pytest.mark.parametrize("wire", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("name", DISTS)
def test_wire_centroids_bracket(wire, name):
    x = make(name, 2000, seed=25, scale=3.7)
    c = solve(x, 32)
    w = wire_centroids(c, x, wire)
    assert w.dtype == wire
    assert np.all(np.diff(w.astype(np.float64)) > 0)
    assert float(w[0]) <= x.min() and float(w[-1]) >= x.max()
    assert w.size <= c.size
    # ends are the nearest wire values at or beyond the data range
    assert float(np.nextafter(w[0], wire(np.inf))) > x.min()
    assert float(np.nextafter(w[-1], wire(-np.inf))) < x.max()


def test_wire_centroids_merge_and_overflow():
    x = np.array([1.0, 1.0001, 1.0002, 1.0003, 2.0])
    c = solve(x, 5)
    w = wire_centroids(c, x, np.float16)  # float16 resolution near 1 is ~1e-3: levels merge
    assert w.size < c.size and np.all(np.diff(w) > 0)
    assert float(w[0]) <= 1.0 and float(w[-1]) >= 2.0
    with pytest.raises(InputError):
        wire_centroids(np.array([0.0, 1e6]), np.array([0.0, 1e6]), np.float16)
    with pytest.raises(ParameterError):
        wire_centroids(np.array([0.0, 1.0]), np.array([0.5]), np.int32)


def test_dequantize():
    c = np.array([-1.0, 0.5, 2.0], np.float32)
    ids = np.array([0, 2, 1, 1], np.uint8)
    out = dequantize(ids, c, np.float64)
    assert out.dtype == np.float64
    np.testing.assert_array_equal(out, [-1.0, 2.0, 0.5, 0.5])
    with pytest.raises(InputError):
        dequantize(np.array([3], np.uint8), c)


@pytest.mark.parametrize("name", ["t3", "zero80"])
def test_bit_grid_matches_uniform_grid(name, monkeypatch):
    """Long float32 input (bit-pattern grid) gives the same ids and J as the uniform-grid path, with
    signed zeros and values sitting exactly on levels; the grid J equals the binary-search J."""
    x = make(name, quantize.BITGRID_MIN_N + 1001, seed=26, dtype=np.float32)
    x[:3] = [0.0, -0.0, 1e-30]
    for z in (16, 300):
        c = wire_centroids(solve(x, z), x, np.float32)
        x[3:3 + c.size] = c  # elements exactly on every level
        a, ja = stochastic_round(x, c, np.random.default_rng(5), return_J=True)
        with monkeypatch.context() as mp:
            mp.setattr(quantize, "BITGRID_MIN_N", 1 << 62)
            b, jb = stochastic_round(x, c, np.random.default_rng(5), return_J=True)
        np.testing.assert_array_equal(a, b)
        assert ja == pytest.approx(jb, rel=1e-9)
        k = quantize.interval_index(x, c)
        J_search = float(np.dot(c.astype(np.float64)[k + 1] - x, x - c.astype(np.float64)[k]))
        assert variance_J(x, c) == pytest.approx(J_search, rel=1e-12)


@pytest.mark.parametrize("backend", ["c", "numpy"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_round_J_is_exact(backend, dtype, monkeypatch):
    """J from the rounding pass (what the codec reports) equals the float64 definition, on both
    backends, with zeros at a zero level and elements on every level (the bit grid's fix-up cases)."""
    from mucsc.codec import kernels

    if backend == "c" and kernels.c_module() is None:
        pytest.skip("compiled kernels not built")
    monkeypatch.setattr(kernels, "BACKEND", backend)
    for n in (1000, quantize.BITGRID_MIN_N + 5):
        x = make("zero80", n, seed=27, dtype=dtype)
        c = np.unique(np.r_[wire_centroids(solve(x, 16), x, np.float32), np.float32(0)])
        x[::5] = 0.0
        x[1:1 + c.size] = c
        _, J = stochastic_round(x, c, np.random.default_rng(1), return_J=True)
        c64 = c.astype(np.float64)
        k = quantize.interval_index(x, c64)
        want = float(np.sum((c64[k + 1] - x) * (x.astype(np.float64) - c64[k])))
        assert J == pytest.approx(want, rel=1e-10)
        assert J == pytest.approx(variance_J(x, c64), rel=1e-10)


def test_bit_grid_levels_at_bin_start_are_exact():
    """A level equal to its bit-grid bin's lowest value (+0.0, bfloat16-valued levels) gives the right
    interval straight from the table, so elements equal to it skip the exact fix-up."""
    c = np.array([-3.0, -1.0, 0.0, 0.5, 1.0, 1.5, 2.0], np.float32)  # low 16 bits of each are 0
    g = quantize._BitGrid(c)
    on = c[2:-1]  # +0.0 and the positive interior levels (negative ones end their bin instead)
    b = g.bins(on)
    np.testing.assert_array_equal(g.kb[b], np.arange(2, c.size - 1))
    assert np.all(on - g.cb[b] < g.wb[b])  # not flagged for the fix-up


def test_wire_centroids_of_levels_far_inside_the_data_end_at_once():
    """Given levels well inside the data (an encode with ``levels=``): the ends move outward to the
    wire values bracketing the data at once, not one representable value at a time (a hang)."""
    x = np.random.default_rng(0).standard_normal(1000).astype(np.float32)
    lo, hi = float(x.min()), float(x.max())
    for dt in (np.float16, np.float32, np.float64):
        w = wire_centroids(np.array([-0.5, 0.5]), x, dt)
        assert w.dtype == dt and float(w[0]) <= lo and float(w[-1]) >= hi
        assert float(np.nextafter(w[0], dt(np.inf))) > lo and float(np.nextafter(w[-1], dt(-np.inf))) < hi
    assert mucsc.decode(mucsc.encode(x, levels=[-0.5, 0.5])).min() == lo
