"""The compiled kernels and the numpy path give bit-identical results (ids, centroids, messages).

Both paths run in one process by switching ``kernels.BACKEND`` (read at call time); a subprocess with
MUCSC_PURE_NUMPY=1 checks the import-time switch.  Without the compiled module only the numpy-path
tests run (the comparison tests are skipped, never silently passed).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys

import numpy as np
import pytest

import mucsc
from mucsc.codec import kernels
from mucsc.codec.numerics import centroids, quantize

from test_centroids import make

pytestmark = pytest.mark.backends  # .ci/run's torch and numpy passes run it too

HAVE_C = kernels.c_module() is not None
needs_c = pytest.mark.skipif(not HAVE_C, reason="compiled kernels not built")


def both(monkeypatch, fn):
    """fn() with the C backend and with the numpy backend."""
    out = []
    for backend in ("c", "numpy"):
        with monkeypatch.context() as mp:
            mp.setattr(kernels, "BACKEND", backend)
            out.append(fn())
    return out


def cases():
    """(data name, size, dtype, z, wire dtype) covering sizes 0..2e5, Z 2..256, both float dtypes."""
    rng = np.random.default_rng(2024)
    sizes = (0, 1, 2, 3, 7, 64, 1000, 4097, 32769, 65536 + 3, 200_000)
    out = []
    for i, n in enumerate(sizes):
        for name in ("gauss", "t3", "zero80"):
            dtype = (np.float32, np.float64)[(i + len(name)) % 2]
            z = int(rng.choice((2, 3, 4, 5, 16, 64, 256)))
            wire = (np.float32, np.float64, np.float16)[i % 3]
            out.append((name, n, dtype, z, wire))
    return out


@needs_c
@pytest.mark.parametrize("name,n,dtype,z,wire", cases())
def test_backends_identical(monkeypatch, name, n, dtype, z, wire):
    x = make(name, n, seed=n + z, dtype=dtype)
    if n > 8:
        x[:4] = [0.0, -0.0, x[5], x[6]]  # signed zeros and duplicated values
    if n == 0:
        c_c = c_np = np.zeros(0)
    else:
        c_c, c_np = both(monkeypatch, lambda: centroids.solve(x, z))
        np.testing.assert_array_equal(c_c, c_np)
    if n == 0:
        w = np.array([0.0, 1.0], wire)
    else:
        w = quantize.wire_centroids(c_c, x, wire)
        x[7 % n] = w[min(1, w.size - 1)]  # an element exactly on a level
    (ids_c, J_c), (ids_np, J_np) = both(
        monkeypatch, lambda: quantize.stochastic_round(x, w, np.random.default_rng(n), return_J=True))
    assert ids_c.dtype == ids_np.dtype
    np.testing.assert_array_equal(ids_c, ids_np)
    assert J_c == pytest.approx(J_np, rel=1e-9, abs=1e-300)


@needs_c
@pytest.mark.parametrize("z", [2, 3, 17, 256, 300, 1000])
def test_messages_identical(monkeypatch, z):
    """Whole messages (solve + wire + rounding + packing) are byte-identical across backends."""
    x = make("t3", 5000, seed=z, dtype=np.float32)
    a, b = both(monkeypatch, lambda: mucsc.encode(x, z=z, seed=7))
    assert a == b
    a, b = both(monkeypatch, lambda: mucsc.encode(x, codec="bmucsc", keep=0.1, seed=3))
    assert a == b


@needs_c
def test_dp_identical_exact_solver(monkeypatch):
    """The DP over all distinct values (solver="exact") at sizes where D&C recursion is deep."""
    for name in ("gauss", "zero80"):
        x = make(name, 3000, seed=5)
        for z in (3, 16, 128):
            a, b = both(monkeypatch, lambda: centroids.solve(x, z, "exact"))
            np.testing.assert_array_equal(a, b)


@needs_c
def test_dp_ties_leftmost(monkeypatch):
    """Equal costs (repeated candidates' sums): both backends pick the same (leftmost) argmin."""
    v = np.repeat(np.arange(40, dtype=np.float64), 1)
    n = np.arange(40, dtype=np.float64)
    s1 = np.zeros(40)
    s2 = np.zeros(40)
    for z in (2, 3, 10, 39):
        a, b = both(monkeypatch, lambda: centroids.dp_levels(v, n, s1, s2, z))
        np.testing.assert_array_equal(a, b)


def test_uniform_stream_is_splitmix64():
    """The numpy stream equals scalar SplitMix64 (FORMAT.md 4.3), chunk by chunk."""
    mask = (1 << 64) - 1
    key = 0x0123456789ABCDEF

    def scalar(j):
        s = (key + (j + 1) * kernels.GAMMA) & mask
        s = ((s ^ (s >> 30)) * 0xBF58476D1CE4E5B9) & mask
        s = ((s ^ (s >> 27)) * 0x94D049BB133111EB) & mask
        return s ^ (s >> 31)

    got = kernels.splitmix64(key, 1000, 5)
    assert [int(g) for g in got] == [scalar(j) for j in range(1000, 1005)]
    # published first output of SplitMix64 seeded with 1234567
    assert int(kernels.splitmix64(1234567, 0, 1)[0]) == 6457827717110365317


def test_uniforms_float32_layout(monkeypatch):
    """float32 uniforms: element 2j uses bits 8..31 and element 2j + 1 bits 40..63 of word j."""
    monkeypatch.setattr(kernels, "BACKEND", "numpy")
    key = 99
    u = np.empty(6, np.float32)
    quantize._Uniforms(key, np.dtype(np.float32), 6).fill(u, 0)
    words = [int(w) for w in kernels.splitmix64(key, 0, 3)]
    want = []
    for w in words:
        want += [((w & 0xFFFFFFFF) >> 8) * 2.0**-24, (w >> 40) * 2.0**-24]
    np.testing.assert_array_equal(u, np.array(want, np.float32))
    u64 = np.empty(3)
    quantize._Uniforms(key, np.dtype(np.float64), 3).fill(u64, 0)
    np.testing.assert_array_equal(u64, [(w >> 11) * 2.0**-53 for w in words])


@needs_c
def test_c_validates_buffers():
    m = kernels.c_module()
    x = np.zeros(4, np.float32)
    c = np.array([0.0, 1.0], np.float32)
    ids = np.zeros(4, np.uint8)
    with pytest.raises(ValueError):
        m.sround(x, c, 1, np.zeros(3, np.uint8), False)  # wrong length
    with pytest.raises(ValueError):
        m.sround(x, c, 1, np.zeros(4, np.int32), False)  # wrong id type
    with pytest.raises(ValueError):
        m.sround(x.astype(np.float64), c, 1, ids, False)  # float32 work, float64 data
    with pytest.raises(ValueError):
        m.sround(x, c[:1], 1, ids, False)  # one level
    with pytest.raises(ValueError):
        m.sround(x, np.zeros(300, np.float32), 1, ids, False)  # uint8 ids for 300 levels
    with pytest.raises(ValueError):
        m.sround(x[::2], c, 1, ids[:2], False)  # not contiguous
    ro = np.zeros(4, np.uint8)
    ro.flags.writeable = False
    with pytest.raises(ValueError):
        m.sround(x, c, 1, ro, False)  # read-only output
    v = np.arange(10.0)
    idx = np.zeros(3, np.int64)
    with pytest.raises(ValueError):
        m.dp_levels(v, v, v, v[:9], 3, idx)  # unequal lengths
    with pytest.raises(ValueError):
        m.dp_levels(v, v, v, v, 4, idx)  # idx length != z
    with pytest.raises(ValueError):
        m.dp_levels(v, v, v, v.astype(np.float32), 3, idx)
    with pytest.raises(ValueError):
        m.dp_levels(v[:3], v[:3], v[:3], v[:3], 3, idx)  # z >= m
    with pytest.raises(ValueError):
        m.dp_levels(v, v, v, v, 3, np.zeros(3, np.int32))
    w = np.arange(11.0)
    with pytest.raises(ValueError):
        m.polish(v, w[:10], w, np.zeros(3), True, 5)  # W not n + 1 long
    with pytest.raises(ValueError):
        m.polish(v, w, w, np.zeros(3, np.float32), True, 5)  # float32 levels
    ro = np.zeros(3)
    ro.flags.writeable = False
    with pytest.raises(ValueError):
        m.polish(v, w, w, ro, True, 5)  # read-only levels
    with pytest.raises(ValueError):
        m.prefix(v, 0.0, np.empty(10), np.empty((3, 10)))  # buf not 3 x (n + 1)
    with pytest.raises(ValueError):
        m.prefix(v, 0.0, np.empty(9), np.empty((3, 11)))  # xc not n long
    with pytest.raises(ValueError):
        m.cand_counts(v, w[:10], np.empty(8))  # W not n + 1 long
    with pytest.raises(ValueError):
        m.candidates(v, w, np.ones(8), 4, np.empty(19))  # out shorter than 5 k
    with pytest.raises(ValueError):
        m.candidates(v, w, np.ones(8, np.float32), 4, np.empty(20))  # float32 densities
    with pytest.raises(ValueError):
        m.dp_polish(v, w, w, w, v[:5], 3, True, 5, np.empty(2))  # out shorter than min(z, m)
    with pytest.raises(ValueError):
        m.dp_polish(v, w, w[:10], w, v[:5], 3, True, 5, np.empty(3))  # P1 not n + 1 long


@needs_c
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("n", [5, 4100, 100_000])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_prefix_kernel_is_numpys_cumsum(n, weighted, dtype):
    """The one-pass prefix sums equal the numpy path's bit for bit, from float32 or float64 data,
    with unit weights and with the subsample's weights: the solver's DP costs and polishing read
    them, so the levels stay identical across backends.  Those are numpy's sequential cumsum, or
    without weights from PREFIX_BLOCK_MIN elements on the blocked sums (a tree per block of 16, the
    blocks' sums in sequence): checked against a direct transcription of that definition and within
    1e-13 (relative to the sum of |x|) of the sequential cumsum."""
    rng = np.random.default_rng(n)
    xs = np.sort(rng.standard_t(3, n)).astype(dtype)
    w = np.where(rng.random(n) < 0.2, 1.0, 7.63) if weighted else None  # exact tails, a bulk weight
    shift = 0.5 * (float(xs[0]) + float(xs[-1]))
    a = centroids._Sorted.centred(xs, shift, w)
    b = centroids._Sorted(xs.astype(np.float64) - shift, w)
    assert a.unit == b.unit == (w is None)
    for u, v in ((a.xc, b.xc), (a.W, b.W), (a.P1, b.P1), (a.P2, b.P2)):
        np.testing.assert_array_equal(u.view(np.int64), v.view(np.int64))
    if w is None and n >= centroids.PREFIX_BLOCK_MIN:
        for vals, got in ((b.xc, b.P1), (b.xc * b.xc, b.P2)):
            ref = [0.0]
            for b0 in range(0, n, 16):
                blk = vals[b0: b0 + 16].tolist()
                s = ref[-1]
                for v in blk[:-1] if len(blk) == 16 else blk:
                    s += v
                    ref.append(s)
                if len(blk) == 16:
                    u = [blk[i] + blk[i + 8] for i in range(8)]
                    t = [u[i] + u[i + 4] for i in range(4)]
                    tree = (t[0] + t[2]) + (t[1] + t[3])
                    ref.append(tree if b0 == 0 else ref[b0] + tree)
            np.testing.assert_array_equal(np.array(ref).view(np.int64), got.view(np.int64))
            seq = np.concatenate(([0.0], np.cumsum(vals)))
            assert np.max(np.abs(got - seq)) <= 1e-13 * np.sum(np.abs(vals))


@needs_c
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_prefix_kernel_reads_the_subsample_steps(dtype):
    """The subsample's weights as steps (1, wb, 1) give the sums of the same weights as an array, and
    the solver's large-input sample is the one _sample_sorted returns (values and weights)."""
    rng = np.random.default_rng(3)
    x = rng.standard_t(3, 400_000).astype(dtype)
    lo, hi = float(x.min()), float(x.max())
    xs, steps = centroids._sample_steps(x, lo, hi)
    assert xs.dtype == dtype and 0 < steps.a < steps.b < steps.n == xs.size
    xs64, w = centroids._sample_sorted(x, lo, hi)
    np.testing.assert_array_equal(xs64, xs.astype(np.float64))
    np.testing.assert_array_equal(w, steps.weights())
    shift = 0.5 * (lo + hi)
    a = centroids._Sorted.centred(xs, shift, steps)
    b = centroids._Sorted(xs64 - shift, w)
    for u, v in ((a.xc, b.xc), (a.W, b.W), (a.P1, b.P1), (a.P2, b.P2)):
        np.testing.assert_array_equal(u.view(np.int64), v.view(np.int64))
    with pytest.raises(ValueError):  # a step past the end
        kernels.c_module().prefix(xs, shift, np.empty(xs.size), np.empty((3, xs.size + 1)), (0, xs.size + 1, 2.0))


def _candidate_inputs():
    """(sorted float64 data, prefix weights W, m): unit and non-unit weights, heavy tails, ties,
    many zeros, tiny scales, both signs of zero, sizes 3..3e4 and m from 3 to 3072."""
    rng = np.random.default_rng(21)
    out = []
    for i in range(60):
        d = int(rng.integers(3, 30_000))
        x = [rng.standard_normal(d), rng.standard_t(2, d), rng.integers(-5, 6, d).astype(float),
             np.where(rng.random(d) < 0.7, 0.0, rng.standard_normal(d)), 1e-30 * rng.standard_normal(d),
             np.concatenate((g := rng.standard_normal(d), -g, [-0.0, 0.0] * 3)), rng.exponential(1.0, d) ** 3][i % 7]
        xs = np.sort(x.astype((np.float32, np.float64)[i % 2])).astype(np.float64)
        if xs[0] == xs[-1]:
            continue
        w = np.concatenate(([0.0], np.cumsum(rng.random(xs.size) + 0.5))) if i % 3 == 0 else None
        W = np.arange(xs.size + 1, dtype=np.float64) if w is None else w
        for m in (3, 40, 384, 3072):
            out.append((xs, W, min(m, xs.size)))
    return out


@needs_c
def test_candidate_kernels_are_numpys(monkeypatch):
    """The compiled _candidates (numpy's linspace, searchsorted, interp, unique in C around numpy's
    cbrt) gives numpy's candidates bit for bit, signs of zero included; with both signs of zero
    among them it declines (None) and the numpy path runs."""
    declined = 0
    for xs, W, m in _candidate_inputs():
        c, n = both(monkeypatch, lambda: centroids._candidates(xs, W, m))
        np.testing.assert_array_equal(c.view(np.int64), n.view(np.int64))
        declined += centroids._candidates_c(xs, W, m) is None
    assert declined > 0  # the signed-zero rule was exercised


@needs_c
def test_solve_sorted_kernel_is_the_python_path(monkeypatch):
    """solve_sorted (prefix sums, candidates, DP and polish in one call on x's own sort) gives the
    levels of the step-by-step path (a caller's cache takes it) and of the numpy backend, on
    float32 and float64 inputs with ties, heavy tails and signed zeros, z from 3 to 256."""
    rng = np.random.default_rng(37)
    used = 0
    for i in range(60):
        d = int(rng.integers(4, 40_000))
        x = [rng.standard_normal(d), rng.standard_t(2, d), rng.integers(-40, 41, d) / 7.0,
             np.where(rng.random(d) < 0.7, 0.0, rng.standard_normal(d)),
             np.concatenate((g := rng.standard_normal(d), -g, [-0.0, 0.0] * 3)), 1e-30 * rng.laplace(size=d)][i % 6]
        x = x.astype((np.float32, np.float64)[i % 2])
        z = int(rng.choice((3, 4, 7, 16, 33, 256)))
        fused, numpy_path = both(monkeypatch, lambda: centroids.solve(x, z))
        steps = centroids.solve(x, z, cache={})
        np.testing.assert_array_equal(fused.view(np.int64), steps.view(np.int64))
        np.testing.assert_array_equal(fused.view(np.int64), numpy_path.view(np.int64))
        used += centroids._solve_sorted(x, z, {}) is not None
    assert used > 30 if kernels.compiled("solve_sorted") is not None else used == 0  # MUCSC_PURE_NUMPY: never


@needs_c
def test_solve_sorted_block_prefix_edges():
    """solve_sorted keeps the prefix sums at every 16th rank only and rebuilds the others by adding
    from their block's start: the same levels as the full prefix arrays (the step-by-step path) at
    sizes around block boundaries, both float dtypes."""
    rng = np.random.default_rng(8)
    for d in (20, 31, 32, 33, 47, 48, 49, 4096, 4097, 4111):
        for dtype in (np.float32, np.float64):
            x = rng.standard_t(3, d).astype(dtype)
            for z in (3, 16):
                fused_path = centroids._solve_sorted(x, z, {}) is not None  # the compiled one-call path
                assert fused_path == (kernels.compiled("solve_sorted") is not None)  # not with MUCSC_PURE_NUMPY
                fused, steps = centroids.solve(x, z), centroids.solve(x, z, cache={})
                np.testing.assert_array_equal(fused.view(np.int64), steps.view(np.int64))


@needs_c
def test_solve_sorted_validates_buffers():
    m = kernels.c_module()
    s = np.sort(np.random.default_rng(0).standard_normal(100))
    tab = centroids.cbrt_table()
    for args in ((s[:1], 16, 192, tab, 5, np.empty(16)),  # n < 2
                 (s, 2, 192, tab, 5, np.empty(16)),  # z < 3
                 (s, 16, 8, tab, 5, np.empty(16)),  # m < z
                 (s, 16, 192, tab, 5, np.empty(15)),  # out shorter than z
                 (s.astype(np.int64), 16, 192, tab, 5, np.empty(16)),  # not a float
                 (s, 16, 192, tab.astype(np.float32), 5, np.empty(16))):  # float32 table
        with pytest.raises(ValueError):
            m.solve_sorted(*args)


@needs_c
def test_dp_polish_kernel_is_dp_then_polish(monkeypatch):
    """dp_polish (the DP and the polishing in one compiled call) gives the numpy path's levels for
    unit and weighted data and for z below, at and above the number of candidates."""
    for i, (xs, W, m) in enumerate(_candidate_inputs()[::3]):
        shift = 0.5 * (xs[0] + xs[-1])
        S = centroids._Sorted(xs - shift, np.diff(W) if i % 2 else None)
        cand = centroids._candidates(xs, S.W, m) - shift
        for z in (3, 16, cand.size, cand.size + 5):
            c, n = both(monkeypatch, lambda: centroids._dp_polish(S, cand, z))
            np.testing.assert_array_equal(c.view(np.int64), n.view(np.int64))


@needs_c
def test_lookup_bytes_is_a_byte_gather():
    """The decoder's compiled lookup equals numpy's take for every row size it accepts."""
    m = kernels.c_module()
    rng = np.random.default_rng(4)
    packed = rng.integers(0, 256, 1001).astype(np.uint8)
    for size in (1, 2, 4, 8, 16, 32, 64):
        rows = rng.integers(0, 256, (256, size)).astype(np.uint8)
        out = np.empty((packed.size, size), np.uint8)
        m.lookup_bytes(packed, rows, out)
        np.testing.assert_array_equal(out, rows[packed])
        m.lookup_bytes(packed[:0], rows, out[:0])  # nothing to do
    rows = np.zeros((256, 8), np.uint8)
    for bad in [(packed.astype(np.int8), rows, np.empty((1001, 8), np.uint8)),  # signed indices
                (packed, rows[:255], np.empty((1001, 8), np.uint8)),  # 255 rows
                (packed, np.zeros((256, 3), np.uint8), np.empty((1001, 3), np.uint8)),  # 3-byte rows
                (packed, rows, np.empty((1000, 8), np.uint8)),  # out one row short
                (packed[::2], rows, np.empty((501, 8), np.uint8))]:  # not contiguous
        with pytest.raises(ValueError):
            m.lookup_bytes(*bad)
    ro = np.empty((1001, 8), np.uint8)
    ro.flags.writeable = False
    with pytest.raises(ValueError):
        m.lookup_bytes(packed, rows, ro)


def test_pure_numpy_env_switch():
    """MUCSC_PURE_NUMPY=1 selects the numpy path at import; the message bytes do not change."""
    code = ("import hashlib, numpy as np, mucsc; from mucsc.codec import kernels; "
            "x = np.random.default_rng(1).standard_t(3, 70000).astype(np.float32); "
            "print(kernels.BACKEND, hashlib.sha256(mucsc.encode(x, z=256, seed=4)).hexdigest())")
    env = dict(os.environ, MUCSC_PURE_NUMPY="1")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    backend, digest = out.stdout.split()
    assert backend == "numpy"
    x = np.random.default_rng(1).standard_t(3, 70000).astype(np.float32)
    assert digest == hashlib.sha256(mucsc.encode(x, z=256, seed=4)).hexdigest()


@pytest.mark.parametrize("z", [4, 16, 256])
def test_encode_stats_J_from_rounding_pass(monkeypatch, z):
    """The codec's J stat (now a by-product of the rounding pass) equals variance_J of the wire
    centroids, with either backend."""
    x = make("t3", 70_000, seed=z, dtype=np.float32)
    x[::11] = 0.0
    wire = quantize.wire_centroids(centroids.solve(x, z), x, np.float32).astype(np.float64)
    want = centroids.variance_J(x, wire)
    backends = ("c", "numpy") if HAVE_C else ("numpy",)
    for backend in backends:
        with monkeypatch.context() as mp:
            mp.setattr(kernels, "BACKEND", backend)
            _, st = mucsc.encode_with_stats(x, z=z, seed=2)
        assert st.J == pytest.approx(want, rel=1e-12), backend


@needs_c
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_subsample_path_identical(monkeypatch, dtype):
    """Inputs above FULL_SORT_MAX (weighted subsample + exact tails via the ``outside`` kernel): same
    levels and message bytes on both backends."""
    x = make("t3", centroids.FULL_SORT_MAX + 12345, seed=31, dtype=dtype)
    x[:50] = x.max()  # repeated extreme values
    for z in (16, 64):
        a, b = both(monkeypatch, lambda: centroids.solve(x, z))
        np.testing.assert_array_equal(a, b)
    a, b = both(monkeypatch, lambda: mucsc.encode(x, z=16, seed=5))
    assert a == b


@needs_c
def test_outside_kernel(monkeypatch):
    """``centroids._outside`` with the C kernel equals the numpy path, also when a side overflows the
    first buffer (many values equal beyond a threshold), with signed zeros, for both float dtypes."""
    rng = np.random.default_rng(6)
    for dtype in (np.float32, np.float64):
        x = rng.standard_normal(300_000).astype(dtype)
        x[::3] = -2.5  # a third of the data below the low threshold: more than the buffer holds
        x[1::97] = -0.0
        x[2::89] = 0.0
        for lo, hi in ((x.dtype.type(-2.0), x.dtype.type(1.0)), (x.dtype.type(0.5), x.dtype.type(0.5)),
                       (x.dtype.type(-3.0), x.dtype.type(-0.0))):
            (l_c, h_c), (l_np, h_np) = both(monkeypatch, lambda: centroids._outside(x, lo, hi))
            np.testing.assert_array_equal(l_c, l_np)
            np.testing.assert_array_equal(h_c, h_np)
            assert np.array_equal(np.signbit(h_c), np.signbit(h_np))
            np.testing.assert_array_equal(l_c, np.sort(x[x < lo]))
            np.testing.assert_array_equal(h_c, np.sort(x[x > hi]))
    with pytest.raises(ValueError):
        kernels.c_module().outside(x, 0.0, 1.0, np.zeros(3, np.float32), np.zeros(3))


@needs_c
def test_varints_kernel_matches_numpy(monkeypatch):
    """The compiled LEB128 writer gives the loop's bytes, at every byte count up to 64-bit values."""
    from mucsc.codec.wire import rans

    rng = np.random.default_rng(7)
    cases = [np.zeros(0, np.int64), np.array([0, 127, 128, 16383, 16384, 1 << 22]),
             np.array([(1 << 64) - 1, 1 << 63], np.uint64)]
    cases += [rng.integers(0, 1 << int(b), 300, dtype=np.uint64) for b in range(1, 64, 5)]
    for v in cases:
        a, b = both(monkeypatch, lambda: rans._varints(v))
        assert a == b


def test_cbrt_table_is_numpy_cbrt():
    """Whole bin weights take np.cbrt's own values from the table; others np.cbrt itself."""
    rng = np.random.default_rng(3)
    for counts in (rng.integers(0, centroids.CBRT_TABLE, 5000).astype(np.float64),
                   rng.integers(0, 10 * centroids.CBRT_TABLE, 500).astype(np.float64), rng.random(700) * 50):
        assert np.array_equal(centroids._cbrt(counts.copy()).view(np.int64), np.cbrt(counts).view(np.int64))


@needs_c
def test_splitmix64_kernel_is_numpys(monkeypatch):
    """The compiled SplitMix64 gives the numpy stream's words (keys and starts across 2^64, wrapping),
    and the dither's 53-bit stream is those words shifted."""
    from mucsc.codec.numerics import dither

    mask = (1 << 64) - 1
    for key, start, count in ((0, 0, 0), (1234567, 0, 1), (mask, mask - 3, 9), (0x0123456789ABCDEF, 1000, 4097),
                              (-5, 7, 33), (1 << 70, 2, 17)):
        a, b = both(monkeypatch, lambda: kernels.splitmix64(key, start, count).copy())
        np.testing.assert_array_equal(a, b)
        if start == 0:
            s, t = both(monkeypatch, lambda: dither.stream(key & mask, count))
            np.testing.assert_array_equal(s, t)
            np.testing.assert_array_equal(s, b >> np.uint64(11))
    assert int(kernels.splitmix64(1234567, 0, 1)[0]) == 6457827717110365317


def _nearest_cases():
    """(x, levels): Lloyd-Max and evenly spaced levels (Z 2..8092), ties on boundaries, +-inf and
    values beyond the outer levels, float32 and float64 data."""
    from mucsc.codec.numerics import nearest
    rng = np.random.default_rng(35)
    t3 = (rng.standard_t(3, 20_000) * 0.02).astype(np.float32)
    out = []
    for z in (2, 3, 16, 255, 256, 257, 1024, 8092):
        lloyd = nearest.wire_levels(nearest.lloyd_max(t3, z), "float32")
        grid = nearest.wire_levels(np.linspace(t3.min(), t3.max(), z), "float16")
        for c in (lloyd, grid):
            mid = ((c[:-1].astype(np.float64) + c[1:]) * 0.5).astype(np.float32)  # float32 where exact
            x = np.concatenate([t3, mid, c, np.float32([np.inf, -np.inf, 1e30, -1e30, 0.0, -0.0])])
            out += [(x, c), (x.astype(np.float64) * (1 + 1e-9), c)]
    out.append((np.full(1000, 0.25, np.float32), np.float32([0.0, 0.5])))  # every element on the one boundary
    return out


@needs_c
@pytest.mark.parametrize("chunk", [1, 7, 1000, 1 << 16])
def test_nearest_kernel_is_numpys(monkeypatch, chunk):
    """The compiled nearest-level kernel gives the binary search's ids (ties to the lower level) in
    the id dtype and the numpy twin's error to the bit, for any chunk (the order of the chunk sums)."""
    from mucsc.codec.numerics.quantize import id_dtype
    for x, c in _nearest_cases():
        c64 = c.astype(np.float64)
        t = (c64[:-1] + c64[1:]) * 0.5
        dt = id_dtype(c.size)
        for ids_dtype in {dt, np.dtype(np.uint32)}:
            got = both(monkeypatch, lambda: (lambda ids: (ids, kernels.nearest(x, t, c64, ids, chunk)))(
                np.zeros(x.size, ids_dtype)))
            (ic, ec), (inp, en) = got
            assert ic.dtype == ids_dtype
            np.testing.assert_array_equal(ic, np.searchsorted(t, x.astype(np.float64), side="left"))
            np.testing.assert_array_equal(ic, inp)
            assert ec == en or (np.isinf(ec) and np.isinf(en))


@needs_c
@pytest.mark.parametrize("n", [0, 5, 8, 1000, 70_003])
def test_lookup_error_kernel_is_numpys(monkeypatch, n):
    """The realised error of a lookup decode: the compiled pass and the numpy twin add the same float64
    terms in the same order (dot's 8 columns, carried across calls), and equal the sums of the decode."""
    rng = np.random.default_rng(n)
    for xdt, idt, k in ((np.float32, np.uint8, 7), (np.float64, np.uint16, 300)):
        x = rng.standard_t(4, n).astype(xdt)
        ids = rng.integers(0, k, n).astype(idt)
        tables = np.sort(rng.normal(size=(2, k)), axis=1).astype(xdt).astype(np.float64)

        def sums():
            acc = np.zeros((3, 8))
            for a, b in ((0, n // 16 * 8), (n // 16 * 8, n)):  # two calls, the first a multiple of 8
                kernels.lookup_error(x[a:b], ids[a:b], tables, acc)
            return [kernels.dot_total(r) for r in acc]

        c, py = both(monkeypatch, sums)
        assert c == py
        xd = x.astype(np.float64)
        want = [float(xd @ xd)] + [float(np.sum((t[ids] - xd) ** 2)) for t in tables]
        assert c == pytest.approx(want, rel=1e-12, abs=1e-300)
    with pytest.raises(ValueError, match="out of range"):
        kernels.lookup_error(np.ones(4, np.float32), np.array([0, 1, 2, 3], np.uint8), np.zeros((1, 3)),
                             np.zeros((2, 8)))


def test_nearest_kernel_validates_buffers():
    m = kernels.c_module()
    x = np.zeros(4, np.float32)
    t, c = np.array([0.5]), np.array([0.0, 1.0])
    m.nearest(x, t, c, np.zeros(4, np.uint8), 2)
    for args in ((x, t, c, np.zeros(3, np.uint8), 2),  # wrong length
                 (x, t, c, np.zeros(4, np.int32), 2),  # wrong id type
                 (x.astype(np.float16), t, c, np.zeros(4, np.uint8), 2),  # not float32/float64 data
                 (x, t, c[:1], np.zeros(4, np.uint8), 2),  # levels and boundaries disagree
                 (x, t.astype(np.float32), c, np.zeros(4, np.uint8), 2),  # float32 boundaries
                 (x, np.arange(299.0), np.arange(300.0), np.zeros(4, np.uint8), 2),  # uint8 ids, 300 levels
                 (x, t, c, np.zeros(4, np.uint8), 0),  # no chunk
                 (x[::2], t, c, np.zeros(2, np.uint8), 2)):  # not contiguous
        with pytest.raises(ValueError):
            m.nearest(*args)


@needs_c
@pytest.mark.parametrize("count", [1, 2, 3, 8, 16, 64])
def test_context_routing_kernels_are_numpys(monkeypatch, count):
    """Context counts and the moves between index and context order (the dither's QIDX, FORMAT.md
    4.5) agree with numpy's stable sort, and one undoes the other."""
    from mucsc.codec.numerics import dither

    rng = np.random.default_rng(count)
    for n in (0, 1, 5, 1000, 70001):
        t = dither.stream(int(rng.integers(1 << 62)), n)
        sym = rng.integers(0, 1 << 32, n, dtype=np.uint64).astype(np.uint32)
        a, b = both(monkeypatch, lambda: dither.context_counts(t, count))
        np.testing.assert_array_equal(a, b)
        assert a.sum() == n
        parts_c, parts_np = both(monkeypatch, lambda: dither.by_context(sym, t, count))
        assert len(parts_c) == len(parts_np) == count
        for p, q in zip(parts_c, parts_np):
            np.testing.assert_array_equal(p, q)
        ordered = np.concatenate(parts_c) if n else np.zeros(0, np.uint32)
        back_c, back_np = both(monkeypatch, lambda: dither.from_contexts(ordered, t, count))
        np.testing.assert_array_equal(back_c, sym)
        np.testing.assert_array_equal(back_np, sym)


@needs_c
def test_context_kernels_refuse_bad_streams():
    """A stream word of 2^53 or more, a context count outside 1..64 or mismatched lengths are errors."""
    c = kernels.c_module()
    t = np.array([0, 1 << 53], np.uint64)
    s = np.zeros(2, np.uint32)
    with pytest.raises(ValueError, match="below 2"):
        c.context_counts(t, 4, np.zeros(4, np.int64))
    with pytest.raises(ValueError, match="below 2"):
        c.context_route(t, 4, s, s.copy(), True)
    with pytest.raises(ValueError, match="count in 1..64"):
        c.context_counts(t[:1], 65, np.zeros(65, np.int64))
    with pytest.raises(ValueError, match="len"):
        c.context_route(t[:1], 4, s, s.copy(), False)
    with pytest.raises(ValueError, match="shift"):
        c.splitmix64(0, 0, 64, np.zeros(2, np.uint64))


@needs_c
def test_dither_kernels_are_numpys(monkeypatch):
    """The dithered rounding's compiled passes give the numpy functions' numbers: the indices, the
    straddle (numpy's pairwise order, sizes around its 8- and 128-element blocks), the histogram
    per finest context, the symbols per context with the escapes, and the summary's cells."""
    from mucsc.codec.numerics import dither
    from mucsc.codec.numerics.centroids import _sample_sorted

    rng = np.random.default_rng(53)
    for n in (1, 7, 8, 129, 1000, 70_001):
        for dt in (np.float32, np.float64):
            x = (rng.standard_t(2, n) * 0.01).astype(dt)
            x[::5] = 0
            t = dither.stream(int(rng.integers(1 << 62)), n)
            for step, off in ((0.002, 0.0), (0.05, 0.001), (3.0, -0.5)):
                bounds = (float(x.min()), float(x.max()))
                (qc, sc, hc), (qn, sn, hn) = both(monkeypatch, lambda: dither.rounded(x, step, off, t, True, bounds))
                assert hn is None and hc is not None and sc == sn == dither.straddle(x, step, off)
                np.testing.assert_array_equal(qc, qn)
                a, b = dither.choose_alphabet(qc, t, hc), dither.choose_alphabet(qn, t)
                assert (vars(a[0]), a[1:]) == (vars(b[0]), b[1:])
                (pc, ec), (pn, en) = both(monkeypatch, lambda: dither.symbols_by_context(a[0], qc, t, a[1]))
                assert len(pc) == len(pn) and all(np.array_equal(u, v) for u, v in zip(pc, pn))
                np.testing.assert_array_equal(ec, en)
                counts = dither.chosen_alphabet(qc, t, hc)[3]  # the counts save the kernel its counting pass
                assert [np.bincount(u, minlength=a[0].symbols).tolist() for u in pc] == counts.tolist()
                pk, ek = dither.symbols_by_context(a[0], qc, t, a[1], counts)
                assert all(np.array_equal(u, v) for u, v in zip(pk, pn)) and np.array_equal(ek, en)
    x = rng.standard_t(3, 300_000).astype(np.float32)
    for xs, w in (_sample_sorted(x, float(x.min()), float(x.max())), (np.sort(x[:5000]).astype(np.float64), None)):
        for step in (1e-3, 0.2, 5.0):
            c, nump = both(monkeypatch, lambda: dither._cells(xs, w, dither.FINE / step))
            for u, v in zip(c, nump):
                np.testing.assert_array_equal(u, v)


@needs_c
def test_dither_split_checks_the_counts_it_is_given():
    """dither_split's counts from the caller (per context, then the escaped) are checked as it
    routes: counts that are not q's are a ValueError, never a write outside a context's part."""
    c = kernels.c_module()
    q = np.array([0, 1, 5, 1, 0, 9], np.int64)
    t = np.arange(6, dtype=np.uint64) << np.uint64(50)  # contexts 0 0 0 0 1 1 of 2
    out = np.empty(6, np.uint32)
    per, esc = c.dither_split(q, t, 2, 0, 2, True, out, np.array([4, 2, 2], np.int64))
    assert per == [4, 2] and out.tolist() == [0, 1, 2, 1, 0, 2] and np.frombuffer(esc, np.int64).tolist() == [5, 9]
    for wrong in ([5, 1, 2], [4, 2, 1], [4, 2, 3], [3, 2, 2], [-1, 7, 2]):
        with pytest.raises(ValueError, match="per"):
            c.dither_split(q, t, 2, 0, 2, True, out, np.array(wrong, np.int64))
    with pytest.raises(ValueError, match="count \\+ 1"):
        c.dither_split(q, t, 2, 0, 2, True, out, np.array([4, 2], np.int64))


@needs_c
def test_thin_kernel_is_numpys(monkeypatch):
    """Summary.thin's compiled rounds keep exactly the levels numpy's rounds keep (grids over
    Gaussian, heavy-tailed, few-valued and subsampled data, at budgets from keeping all to dropping
    many, signed zeros among the data)."""
    from mucsc.codec.numerics.summary import Summary

    rng = np.random.default_rng(11)
    for i in range(60):
        d = int(rng.choice((4, 7, 50, 900, 2400, 30000, 300_000)))
        x = [rng.standard_normal(d), rng.standard_t(3, d), rng.integers(-4, 4, d) * 0.25][i % 3].astype(np.float32)
        x[:2] = [0.0, -0.0]
        lo, hi = float(x.min()), float(x.max())
        S = Summary(x, lo, hi)
        step = (hi - lo) / int(rng.integers(3, 3000))
        k = np.arange(np.floor(lo / step), np.ceil(hi / step) + 1) * step
        k = np.concatenate(([lo], k[(k > lo) & (k < hi)], [hi]))
        J, counts = S.stats(k)
        lam = 16 * np.log(2) * J / d * float(rng.choice((0.0, 0.1, 1.0, 10.0, 1e3)))
        a, b = both(monkeypatch, lambda: S.thin(k, counts, lam, 5.0))
        assert np.array_equal(a.view(np.int64), b.view(np.int64)), (i, d, a.size, b.size)


@needs_c
def test_thin_kernel_validates_buffers():
    c = kernels.c_module()
    f = np.zeros(4)
    with pytest.raises(ValueError):  # prefix sums one short
        c.thin(f, f, f, f, 0.0, np.zeros(5), np.zeros(5), 1.0, 5.0, 8, np.zeros(5), np.zeros(5), lambda q: None)
    with pytest.raises(TypeError):
        c.thin(f, np.zeros(5), np.zeros(5), np.zeros(5), 0.0, f, f, 1.0, 5.0, 8, f, f, None)
    with pytest.raises(ZeroDivisionError):  # an error in the callback propagates
        c.thin(np.arange(4.0), np.arange(5.0), np.arange(5.0), np.arange(5.0), 0.0, np.arange(5.0), np.ones(5),
               1.0, 5.0, 8, np.zeros(5), np.zeros(5), lambda q: 1 / 0)


@needs_c
def test_kmeans_kernel_is_the_least_error_of_k_values():
    """The compiled 1-D k-means DP against a dense DP over every split (tiny data: ties, duplicates)."""
    rng = np.random.default_rng(5)
    for i in range(40):
        n = int(rng.integers(1, 60))
        x = np.sort([rng.standard_normal(n), rng.integers(0, 4, n) * 0.5][i % 2])
        xc = x - x.mean()
        P1, P2 = np.concatenate(([0.0], np.cumsum(xc))), np.concatenate(([0.0], np.cumsum(xc * xc)))
        a, b = np.meshgrid(np.arange(n + 1), np.arange(n + 1), indexing="ij")
        s1 = P1[b] - P1[a]
        cost = np.where(b >= a, np.maximum(P2[b] - P2[a] - s1 * s1 / np.maximum(b - a, 1), 0.0), np.inf)
        D = cost[0].copy()
        for k in range(1, n + 1):
            assert kernels.c_module().kmeans(xc, k) == pytest.approx(D[n], rel=1e-9, abs=1e-12)
            D = np.min(D[:, None] + cost, axis=0)
    with pytest.raises(ValueError):
        kernels.c_module().kmeans(np.zeros(3), 0)


@needs_c
def test_summary_stats_kernel_is_numpys(monkeypatch):
    """Summary.stats' compiled terms and counts: the same J (numpy sums the terms) and counts, for
    level sets inside, at and beyond the data, exact and subsampled summaries."""
    from mucsc.codec.numerics.summary import Summary

    rng = np.random.default_rng(12)
    for i in range(60):
        d = int(rng.choice((3, 50, 2400, 30000, 300_000)))
        x = [rng.standard_normal(d), rng.standard_t(3, d), rng.integers(-4, 4, d) * 0.25][i % 3].astype(np.float32)
        lo, hi = float(x.min()), float(x.max())
        if lo == hi:
            continue
        S = Summary(x, lo, hi)
        lv = np.sort(rng.uniform(lo - (i % 2), hi, int(rng.integers(1, 500))))
        lv = np.unique(np.concatenate((lv, [lo, hi], np.sort(x[:3].astype(np.float64)))))
        (Ja, na), (Jb, nb) = both(monkeypatch, lambda: S.stats(lv))
        assert np.float64(Ja).view(np.int64) == np.float64(Jb).view(np.int64)
        assert np.array_equal(na, nb)


@needs_c
def test_crc32_kernel_is_zlibs():
    """The carry-less-multiplication CRC-32 (the message trailer's check) is zlib.crc32 for every
    length around its 16- and 64-byte steps and the GIL threshold, from any running CRC; a
    non-contiguous buffer is refused as zlib refuses it."""
    import zlib
    c = kernels.c_module()
    if not hasattr(c, "crc32"):
        pytest.skip("not an x86 build: parallel.crc32 runs zlib's")
    data = np.random.default_rng(37).integers(0, 256, (1 << 16) + 300, dtype=np.uint8).tobytes()
    sizes = [*range(0, 200), 255, 256, 257, 1023, 4096 + 17, (1 << 16) - 1, 1 << 16, (1 << 16) + 300]
    for n in sizes:
        for start in (0, 3):
            for crc in (0, 1, 0xFFFFFFFF, 0x89ABCDEF):
                piece = data[start: start + n]
                assert c.crc32(piece, crc) == zlib.crc32(piece, crc), (n, start, crc)
    assert c.crc32(b"\x00" * 1000) == zlib.crc32(b"\x00" * 1000)
    assert c.crc32(memoryview(data)[5:5 + 999]) == zlib.crc32(memoryview(data)[5:5 + 999])
    with pytest.raises(BufferError):
        c.crc32(memoryview(data)[::2])
    with pytest.raises(ValueError):
        c.crc32(data, 1 << 32)


@needs_c
@pytest.mark.parametrize("n", [300, 5000, 70_000])
@pytest.mark.parametrize("end", ["min", "max"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_zero_data_ends_same_bytes_on_both_backends(monkeypatch, n, end, dtype):
    """Data whose min (or max) is a zero, with -0.0 and 0.0 both present: the levels keep the sign
    numpy's reduction gave the end on both backends (last round's one-call kernel did not: a
    70,000-element float32 vector with a zero max came out in different bytes)."""
    rng = np.random.default_rng(n)
    a = np.abs(rng.standard_normal(n)) * (1 if end == "min" else -1)
    a[rng.integers(0, n, 20)] = 0.0
    a[rng.integers(0, n, 20)] = -0.0
    x = a.astype(dtype)
    for params in (dict(z=16), dict(z=4), dict(max_error=0.1)):
        c, py = both(monkeypatch, lambda: mucsc.encode(x, "mucsc", **params))
        assert c == py, params


def _fused_inputs():
    """Vectors for the one-call solve and rounding (as float32 and float64): dense, heavy-tailed, ties,
    signed zeros, at most z values, tiny and huge scales (a span beyond FLT_MAX), sizes 2..2e4."""
    rng = np.random.default_rng(37)
    big = np.float32(3e38)
    return [
        rng.standard_normal(10_000), rng.standard_t(3, 3000), rng.integers(-4, 5, 5000).astype(float),
        np.where(rng.random(4000) < 0.6, 0.0, rng.standard_normal(4000)), 1e-30 * rng.standard_normal(700),
        np.concatenate((rng.standard_normal(600), [-0.0, 0.0] * 4)), rng.exponential(1.0, 20_000) ** 3,
        np.array([1.0, 2.0]), np.linspace(-1, 1, 17), np.array([-big, big, 0.0, 1.0] * 50),
        np.concatenate((rng.standard_normal(300), [1e30, -1e30])), rng.random(250) + 1e7,
        # a zero min, then max, of either sign: the steps' _finish compares it with numpy's min / max
        rng.permutation(np.concatenate((np.abs(rng.standard_normal(500)), [0.0, -0.0, -0.0, 0.0]))),
        rng.permutation(np.concatenate(([0.0, -0.0] * 3, -np.abs(rng.standard_normal(500))))),
    ]


def _fused_inputs_f64():
    """float64-only cases: ends that float32 wire levels round inside the data (stepped outward),
    levels that merge in float32, an end beyond FLT_MAX (refused by the steps)."""
    rng = np.random.default_rng(38)
    return [rng.standard_normal(5000) * (1 + 2 ** -30), np.array([1 + 2 ** -40, 2 - 2 ** -40] * 9 + [1.5]),
            1.0 + 1e-9 * rng.standard_normal(3000), np.concatenate((rng.standard_normal(400), [-3.5e38, 1.0]))]


@needs_c
@pytest.mark.parametrize("z", [3, 7, 16, 64, 256])
def test_solve_round_kernel_is_the_steps(monkeypatch, z):
    """backends.rounding's one compiled call (solve, wire levels, rounding) gives the wire levels,
    IDs and J of the three steps run one by one, and draws the same from the generator; where it
    hands a case back (levels the steps would change, a span beyond FLT_MAX, at most z values), the
    steps finish it with its key."""
    from mucsc.codec.backends import rounding

    monkeypatch.setattr(kernels, "BACKEND", "c")  # also in the MUCSC_PURE_NUMPY pass
    real = kernels.compiled
    calls = []

    def counting(name):  # the kernels, the fused one's counts noted
        k = real(name)
        if name != "solve_round" or k is None:
            return k

        def run(*a):
            r = k(*a)
            calls.append((a[1].dtype, r[0]))
            return r
        return run

    xs = [np.ascontiguousarray(v, dt) for v in _fused_inputs() for dt in (np.float32, np.float64)]
    for x in xs + _fused_inputs_f64():
        out = []
        for fused in (True, False):
            with monkeypatch.context() as mp:
                mp.setattr(rounding.kernels, "compiled", counting if fused else
                           (lambda name: None if name == "solve_round" else real(name)))
                rng = np.random.default_rng(5)
                try:
                    wire, ids, J = rounding.Host.solve_and_round(x, z, "optimal", np.float32, rng)
                except mucsc.InputError as exc:  # the data does not fit float32 levels: both refuse
                    out.append(str(exc))
                    continue
                out.append((wire, np.asarray(ids), J, rng.bit_generator.random_raw()))
        if isinstance(out[0], str):
            assert out[0] == out[1] and "does not fit" in out[0]
            continue
        (w1, i1, J1, r1), (w2, i2, J2, r2) = out
        np.testing.assert_array_equal(w1.view(np.int32), w2.view(np.int32))
        np.testing.assert_array_equal(i1, i2)
        assert J1 == J2 and r1 == r2
    assert any(c > 0 for _, c in calls) and any(c < 0 for _, c in calls), calls  # both paths ran
    assert any(c > 0 for dt, c in calls if dt == np.float64), calls  # float64 data fused too
    x = np.random.default_rng(2).standard_normal(500).astype(np.float32)
    s, z = np.sort(x), 16
    args = (s, x, z, centroids.candidate_count(x.size, z), centroids.cbrt_table(), centroids.POLISH_SWEEPS, 7, True,
            np.empty(z + 2), np.empty(z + 2, np.float32), np.empty(x.size, np.uint8))
    assert real("solve_round")(*args, float(s[0]), float(s[-1]))[0] > 0
    with pytest.raises(ValueError, match="min and max"):  # bounds that are not x's ends are refused
        real("solve_round")(*args, float(s[0]) - 1.0, float(s[-1]))
