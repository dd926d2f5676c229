"""Centroid solvers: invariants, edge cases, the exact DP against brute force, and solver quality (eq. 8-9)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from mucsc.codec.numerics import centroids
from mucsc.codec.numerics.centroids import solve, variance_J, variance_J_sorted
from mucsc.errors import InputError, ParameterError

pytestmark = pytest.mark.backends  # .ci/run's torch and numpy passes run it too

DISTS = ("gauss", "laplace", "t3", "zero80")


def make(name: str, d: int, seed: int = 0, scale: float = 1.0, dtype=np.float64) -> np.ndarray:
    """Test data: Gaussian, Laplace, Student-t(3), and 80% near zero (sd 1e-3) + 20% N(0, 1)."""
    rng = np.random.default_rng(seed)
    if name == "gauss":
        x = rng.standard_normal(d)
    elif name == "laplace":
        x = rng.laplace(size=d)
    elif name == "t3":
        x = rng.standard_t(3, size=d)
    elif name == "zero80":
        x = np.where(rng.random(d) < 0.8, 1e-3 * rng.standard_normal(d), rng.standard_normal(d))
    else:
        raise ValueError(name)
    return (scale * x).astype(dtype)


def J_brute(x: np.ndarray, c: np.ndarray) -> float:
    """J by the definition: each element against its bracketing pair (eq. 8)."""
    x = np.asarray(x, dtype=np.float64)
    c = np.asarray(c, dtype=np.float64)
    k = np.clip(np.searchsorted(c, x, side="right") - 1, 0, len(c) - 2)
    return float(np.sum((c[k + 1] - x) * (x - c[k])))


def check_levels(c: np.ndarray, x: np.ndarray, z: int) -> None:
    assert c.dtype == np.float64 and c.ndim == 1
    assert 1 <= c.size <= z
    assert c[0] == float(x.min()) and c[-1] == float(x.max())
    assert np.all(np.diff(c) > 0)


# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("solver", list(centroids.SOLVERS))
@pytest.mark.parametrize("name", DISTS)
def test_invariants(solver, name):
    x = make(name, 3000, seed=1)
    for z in (2, 3, 5, 16, 64):
        c = solve(x, z, solver, rng=np.random.default_rng(3))
        check_levels(c, x, z)
        if solver != "paper":  # 3000 distinct values: z levels (paper's steps may merge two)
            assert c.size == z


def test_objective_forms_agree():
    x = make("t3", 500, seed=2)
    c = solve(x, 7)
    jb = J_brute(x, c)
    assert variance_J(x, c) == pytest.approx(jb, rel=1e-12)
    assert variance_J_sorted(np.sort(x), c) == pytest.approx(jb, rel=1e-9)
    # arbitrary (not data-valued) levels, float32 data
    x32 = x.astype(np.float32)
    c2 = np.linspace(float(x32.min()), float(x32.max()), 9)
    assert variance_J(x32, c2) == pytest.approx(J_brute(x32, c2), rel=1e-12)
    assert variance_J(x32, np.array([1.0])) == 0.0


@pytest.mark.parametrize("solver", list(centroids.SOLVERS))
def test_edge_cases(solver):
    s = lambda x, z: solve(np.asarray(x), z, solver, rng=np.random.default_rng(0))  # noqa: E731
    np.testing.assert_array_equal(s([2.5], 4), [2.5])
    np.testing.assert_array_equal(s(np.full(10, -3.0, np.float32), 16), [-3.0])
    np.testing.assert_array_equal(s([3.0, 1.0, 2.0, 1.0], 3), [1.0, 2.0, 3.0])  # z == distinct
    np.testing.assert_array_equal(s([3.0, 1.0, 2.0, 1.0], 50), [1.0, 2.0, 3.0])  # z > distinct
    x = make("gauss", 1000)
    np.testing.assert_array_equal(s(x, 2), [x.min(), x.max()])
    y = np.unique(x)[:10]
    np.testing.assert_array_equal(s(y, 10), y)
    assert variance_J(y, s(y, 10)) == 0.0
    with pytest.raises(ParameterError):
        s(x, 1)
    with pytest.raises(InputError):
        s(np.array([], np.float32), 4)
    with pytest.raises(InputError):
        s(np.array([1.0, np.nan]), 4)
    with pytest.raises(InputError):
        s(np.array([1.0, np.inf]), 4)
    with pytest.raises(InputError):
        s(np.arange(5), 4)  # integers


def test_bad_parameters():
    x = make("gauss", 100)
    with pytest.raises(ParameterError, match="unknown centroid solver"):
        solve(x, 4, "kmeans")
    for z in (0, -3, 2.5, True):
        with pytest.raises(ParameterError):
            solve(x, z)


def test_few_distinct_values_large_input():
    """More than FULL_SORT_MAX elements with fewer distinct values than z: J = 0 levels."""
    vals = np.array([-1.5, 0.0, 0.25, 7.0], np.float32)
    x = np.random.default_rng(0).choice(vals, centroids.FULL_SORT_MAX + 10)
    np.testing.assert_array_equal(solve(x, 4), vals)
    np.testing.assert_array_equal(solve(x, 16), vals)
    c = solve(x, 3)
    check_levels(c, x, 3)
    assert c.size == 3


def test_exact_matches_brute_force():
    """The DP optimum equals exhaustive search over data-valued levels (optimal levels sit on data)."""
    rng = np.random.default_rng(7)
    for trial in range(4):
        x = np.round(rng.standard_t(2, size=24), 2)
        u = np.unique(x)
        for z in (3, 4, 5):
            best = min(
                J_brute(x, np.array((u[0], *mid, u[-1])))
                for mid in itertools.combinations(u[1:-1], z - 2)
            )
            c = solve(x, z, "exact")
            assert variance_J(x, c) == pytest.approx(best, rel=1e-9, abs=1e-12)
            # a non-data level never beats the optimum
            assert variance_J(x, np.sort(np.r_[u[0], rng.uniform(u[0], u[-1], z - 2), u[-1]])) >= best


def test_determinism():
    x = make("laplace", 5000, seed=4)
    for solver in centroids.SOLVERS:
        a = solve(x, 16, solver, rng=np.random.default_rng(11))
        b = solve(x.copy(), 16, solver, rng=np.random.default_rng(11))
        np.testing.assert_array_equal(a, b)
    big = make("gauss", centroids.FULL_SORT_MAX * 2, seed=5, dtype=np.float32)
    np.testing.assert_array_equal(solve(big, 16), solve(big.copy(), 16))


@pytest.mark.parametrize("scale", [1e-6, 1e2])
@pytest.mark.parametrize("name", DISTS)
def test_optimal_beats_paper_and_uniform(name, scale):
    x = make(name, 20000, seed=8, scale=scale)
    for z in (4, 8, 16):
        jo = variance_J(x, solve(x, z))
        jp = variance_J(x, solve(x, z, "paper", rng=np.random.default_rng(0)))
        ju = variance_J(x, solve(x, z, "uniform"))
        assert jo <= jp and jo <= ju


@pytest.mark.parametrize("name", DISTS)
def test_optimal_near_exact_small(name):
    x = make(name, 1500, seed=9)
    for z in (3, 4, 8, 16, 32):
        jo = variance_J(x, solve(x, z))
        je = variance_J(x, solve(x, z, "exact"))
        assert je <= jo * (1 + 1e-12)  # exact is the minimum
        assert jo <= 1.01 * je


def test_optimal_near_exact_large_z():
    """Sanity at larger Z (the DP over all distinct values is feasible at this size)."""
    x = make("zero80", 4000, seed=10)
    for z in (128, 256):
        jo = variance_J(x, solve(x, z))
        je = variance_J(x, solve(x, z, "exact"))
        assert je <= jo * (1 + 1e-12) and jo <= 1.01 * je


def test_gap_neighbours_stay_candidates():
    """From NEIGHBOUR_MIN_N elements a snapped point's lower neighbour is a DP candidate only across a
    gap wider than a density bin: the top of each cluster below a gap stays one (and the solve stays
    near the exact optimum), while dense data no longer carries ~2 k near-duplicates."""
    rng = np.random.default_rng(4)
    n = 2 * centroids.NEIGHBOUR_MIN_N
    x = np.concatenate([c + 0.01 * rng.standard_normal(n // 4) for c in (-3.0, -1.0, 2.0, 5.0)])
    xs = np.sort(x)
    cand = centroids._candidates(xs, np.arange(n + 1, dtype=np.float64), 192)
    assert all(xs[i * n // 4 - 1] in cand for i in (1, 2, 3))  # the clusters' tops
    for z in (6, 12):
        assert variance_J(x, solve(x, z)) <= 1.01 * variance_J(x, solve(x, z, "exact"))
    dense = np.sort(rng.standard_normal(10_000))
    assert centroids._candidates(dense, np.arange(dense.size + 1, dtype=np.float64), 192).size < 4 * (192 // 3 + 2)


@pytest.mark.slow
@pytest.mark.parametrize("name", DISTS)
def test_optimal_near_exact_1e5(name):
    x = make(name, 100_000, seed=12, dtype=np.float32)
    for z in (4, 16):
        jo = variance_J(x, solve(x, z))
        je = variance_J(x, solve(x, z, "exact"))
        assert je <= jo * (1 + 1e-9)
        assert jo <= 1.01 * je, (name, z, jo / je)


def test_scale_invariance():
    """Levels scale with the data: J(s x) = s^2 J(x) for the deterministic solvers (to rounding)."""
    x = make("t3", 3000, seed=13)
    for solver in ("optimal", "exact", "uniform"):
        j1 = variance_J(x, solve(x, 8, solver))
        for s in (1e-6, 1e2):
            js = variance_J(s * x, solve(s * x, 8, solver))
            assert js == pytest.approx(s * s * j1, rel=1e-6)


def test_paper_solver_follows_algorithm_1():
    """Two levels of gradient: with Z = 3 and the data symmetric, one step of eq. 10 from r_2 moves it
    by -alpha * (sum_{L_1}(U - r_1) - sum_{L_2}(r_3 - U))."""
    x = np.array([-1.0, -0.5, 0.2, 0.4, 1.0])
    rng = np.random.default_rng(1)
    r2 = np.sort(np.random.default_rng(1).uniform(-1.0, 1.0, 1))[0]
    c = solve(x, 3, "paper", rng=rng)
    # replay 5 accepted steps by hand
    r = r2
    for _ in range(5):
        left = x[(x >= -1.0) & (x < r)]
        right = x[(x >= r) & (x <= 1.0)]
        r = r - 1e-3 * ((left + 1.0).sum() - (1.0 - right).sum())
    assert c[1] == pytest.approx(r, rel=1e-12)


# --- Z > DP_MAX_Z: greedy insertion from the DP solution, DP refinement, polishing ---------------------


@pytest.mark.parametrize("name", DISTS)
def test_J_non_increasing_in_z_across_dp_max_z(name):
    """One more level never makes J worse, also across the switch at DP_MAX_Z = 256."""
    x = make(name, 20_000, seed=14, dtype=np.float32)
    zs = (250, 255, 256, 257, 300, 512, 1024)
    cs = [solve(x, z) for z in zs]
    assert [c.size for c in cs] == list(zs)  # 20000 distinct values: every level is used
    js = [variance_J(x, c) for c in cs]
    for (z0, j0), (z1, j1) in itertools.pairwise(zip(zs, js)):
        assert j1 <= j0 * (1 + 1e-9), (name, z0, j0, z1, j1)
    assert js[-1] < 0.1 * js[2]  # 4x the levels: J falls ~ 1/Z^2, not just "no worse"


def test_large_z_starts_from_dp_solution():
    """By construction J(z) <= J(DP_MAX_Z), and J(z) <= J(DP_REFINE_MAX_Z) above it, on the data the
    solver sees (here: all of it)."""
    x = make("t3", 20_000, seed=15, dtype=np.float32)
    j256 = variance_J(x, solve(x, centroids.DP_MAX_Z))
    jr = variance_J(x, solve(x, centroids.DP_REFINE_MAX_Z))
    assert jr <= j256 * (1 + 1e-12)
    for z in (centroids.DP_REFINE_MAX_Z + 1, 4096):
        assert variance_J(x, solve(x, z)) <= jr * (1 + 1e-12)


@pytest.mark.parametrize("name", DISTS)
def test_optimal_near_exact_z512(name):
    """Above DP_MAX_Z the solver stays within 2% of the global optimum (d = 3000: ~6 points per level)."""
    x = make(name, 3000, seed=16)
    jo = variance_J(x, solve(x, 512))
    je = variance_J(x, solve(x, 512, "exact"))
    assert je <= jo * (1 + 1e-12)
    assert jo <= 1.02 * je, (name, jo / je)


def test_large_z_stops_early_when_sample_runs_out():
    """More distinct values than z in x but fewer in the subsample: fewer levels, still valid."""
    rng = np.random.default_rng(17)
    d = centroids.FULL_SORT_MAX * 2
    x = rng.choice(np.arange(2000, dtype=np.float32) / 7, d)
    rare = rng.choice(d, 300, replace=False)
    # 300 values seen once, inside the bulk (the tails beyond the subsample's extremes are kept
    # exactly): most are not sampled
    x[rare] = 100.01 + np.arange(300, dtype=np.float32) / 1024
    z = 2100
    c = solve(x, z)
    check_levels(c, x, z)
    assert c.size < z
    assert variance_J(x, c) <= variance_J(x, solve(x, centroids.DP_MAX_Z))


def test_z65536_smoke():
    """The spec's largest Z on d = 2e5: valid levels and a message that round-trips."""
    import mucsc

    x = make("t3", 200_000, seed=18, dtype=np.float32)
    c = solve(x, 65536)
    check_levels(c, x, 65536)
    assert variance_J(x, c) < 1e-3 * variance_J(x, solve(x, centroids.DP_MAX_Z))
    blob, st = mucsc.encode_with_stats(x, z=65536, seed=1)
    y = mucsc.decode(blob)
    assert y.shape == x.shape and y.dtype == x.dtype
    cw = np.unique(y)
    assert cw.size <= 65536 and cw[0] <= x.min() and cw[-1] >= x.max()
    err = float(np.sum((y.astype(np.float64) - x) ** 2))
    assert st.J > 0 and err < 5 * st.J  # one draw of a sum of 2e5 independent terms with mean J


# --- large inputs: weighted subsample + exact tails ---------------------------------------------------


@pytest.fixture
def small_subsample(monkeypatch):
    """The subsample path at test sizes: 4096-element subsample above 8192 elements."""
    monkeypatch.setattr(centroids, "SUBSAMPLE", 1 << 12)
    monkeypatch.setattr(centroids, "FULL_SORT_MAX", 1 << 13)


def test_weighted_sample_keeps_tails_exactly(small_subsample):
    """Every element beyond the subsample's TAIL_RANK-th extremes is in the sample with weight 1, the
    bulk weights add up to the bulk's size, and the ends are the true min and max."""
    x = make("t3", 50_000, seed=20, dtype=np.float32)
    xs, w = centroids._sample_sorted(x, float(x.min()), float(x.max()))
    assert np.all(np.diff(xs) >= 0) and xs[0] == x.min() and xs[-1] == x.max()
    assert w.sum() == pytest.approx(x.size, rel=1e-12)
    tail = w == 1.0
    lo_t, hi_t = xs[~tail].min(), xs[~tail].max()
    want = np.sort(x[(x < lo_t) | (x > hi_t)]).astype(np.float64)
    np.testing.assert_array_equal(xs[tail], want)
    assert want.size > 2 * centroids.TAIL_RANK  # ~ d * TAIL_RANK / SUBSAMPLE per side


@pytest.mark.parametrize("name", ["t3", "zero80"])
def test_optimal_near_exact_subsampled(small_subsample, name):
    """Inputs solved on a subsample stay within 2% of the optimum on the full data.  Before the tails
    were kept exactly, t3 was 18.6x the optimum here (the subsample's extremes are far from min/max)
    and zero80 +32%; measured now: +0.26% and +1.6% (d = 5e4 on a 4096-element subsample; at the real
    2^17-element subsample, d = 1.3e6: docs/centroids.md)."""
    x = make(name, 50_000, seed=19, dtype=np.float32)
    jo = variance_J(x, solve(x, 64))
    je = variance_J(x, solve(x, 64, "exact"))
    assert je <= jo * (1 + 1e-12)
    assert jo <= 1.02 * je, (name, jo / je)


def test_finish_shortcut_is_np_unique():
    """_finish returns what sort / clip / np.unique with pinned ends gives, bit for bit, also when
    the levels already run from min to max (the shortcut) and around signed zeros."""
    from mucsc.codec.numerics import centroids

    def reference(c, lo, hi):
        c = np.clip(np.asarray(c, dtype=np.float64), lo, hi)
        return np.unique(np.concatenate(([lo], c, [hi])))

    rng = np.random.default_rng(5)
    cases = [([-1.0, 0.0, 1.0], -1.0, 1.0), ([-0.0, 1.0], 0.0, 1.0), ([0.0, 1.0], -0.0, 1.0),
             ([-1.0, -0.0], -1.0, 0.0), ([-2.0, 0.5, 3.0], -1.0, 1.0), ([1.0], 1.0, 1.0), ([0.5, 0.5], 0.0, 1.0)]
    for _ in range(200):
        v = np.sort(rng.standard_normal(rng.integers(1, 20)))
        cases.append((v, float(v[0]) - rng.integers(0, 2) * 0.5, float(v[-1]) + rng.integers(0, 2) * 0.5))
    for c, lo, hi in cases:
        assert np.array_equal(centroids._finish(np.array(c), lo, hi).view(np.int64),
                              reference(c, lo, hi).view(np.int64)), (c, lo, hi)


def test_levels_on_sorted_are_about_the_solvers():
    # rate control's J-optimal levels of a sorted summary: the DP over 3 z candidates (z <= 256): J
    # within 2% of the default solver's (measured 0-1.9%); above, greedy insertion without the
    # solver's refining DP: within 12% (measured 4-11% for 300-1000 levels, -2% to +1% beyond)
    from mucsc.codec.numerics.summary import Summary
    x = np.random.default_rng(3).standard_t(3, 6000).astype(np.float32)
    s = Summary(x, float(x.min()), float(x.max()))
    cache = {}
    for z in (3, 64, 256, 700, 1500):
        c = centroids.levels_on_sorted(s.S, z, cache) + s.shift
        assert c.size == z and np.all(np.diff(c) > 0) and c[0] == x.min() and c[-1] == x.max()
        assert centroids.variance_J(x, c) <= (1.02 if z <= 256 else 1.12) * centroids.variance_J(x, solve(x, z))
        assert np.array_equal(c - s.shift, centroids.levels_on_sorted(s.S, z))  # the cache changes nothing
    with pytest.raises(ParameterError):
        centroids.levels_on_sorted(s.S, 1)
