"""mucsc's ``rounding`` parameter: "nearest" (FORMAT.md 4.3.1) next to the default "stochastic"."""

import numpy as np
import pytest

import mucsc
from mucsc.codec.wire import container as fmt
from mucsc.codec.numerics import dither, nearest
from mucsc.errors import ParameterError

pytestmark = pytest.mark.backends  # .ci/run's torch and numpy passes run it too


def gauss(n, seed=0):
    return np.random.default_rng(seed).normal(size=n).astype(np.float32)


def heavy(n, seed=0):
    return np.random.default_rng(seed).standard_t(3, n).astype(np.float32)


def near_zero(n, seed):
    r = np.random.default_rng(seed)
    return np.where(r.random(n) < 0.8, r.normal(size=n) * 0.01, r.normal(size=n)).astype(np.float32)


def group_params(blob):
    return fmt.read_message(blob).header.groups[0].params


def test_rounding_is_validated():
    with pytest.raises(ParameterError, match="rounding must be one of stochastic, nearest, dithered"):
        mucsc.encode(gauss(10), "mucsc", rounding="floor")


def test_nearest_sends_each_element_to_its_nearest_level_and_reports_the_squared_error():
    x = heavy(5000, 1)
    blob, stats = mucsc.encode_with_stats(x, "mucsc", z=8, rounding="nearest")
    c = np.frombuffer(bytes(fmt.read_message(blob).payload(
        next(s for s in fmt.read_message(blob).sections if s.tag == "CENT"))), "<f4")
    y = mucsc.decode(blob)
    best = c[np.argmin(np.abs(x[:, None].astype(np.float64) - c[None, :]), axis=1)]
    assert np.array_equal(y, best)
    assert stats.J == pytest.approx(float(np.sum((y.astype(np.float64) - x) ** 2)), rel=1e-9)
    p = group_params(blob)
    assert p["rounding"] == "nearest" and p["solver"] == "lloyd-max" and p["centroids"] == 8
    assert fmt.read_message(blob).minor == 0  # packed IDs: the key is informative, still a 1.0 message
    assert mucsc.encode(x, "mucsc", z=8, rounding="nearest", seed=5) == blob  # draws nothing


def test_ties_go_to_the_lower_level():
    ids, err = nearest.assign(np.array([0.5, 1.5, 0.25], np.float32), np.array([0.0, 1.0, 2.0], np.float32))
    assert ids.tolist() == [0, 1, 0] and err == pytest.approx(0.25 + 0.25 + 0.0625)


def test_lloyd_max_levels_reach_the_known_gaussian_optimum():
    # Max (1960): the 4-level quantizer of N(0, 1) has mean squared error 0.1175
    x = np.random.default_rng(2).normal(size=400_000)
    c = nearest.lloyd_max(x, 4)
    assert nearest.assign(x, c)[1] / x.size == pytest.approx(0.1175, rel=0.01)


@pytest.mark.parametrize("data", [gauss, heavy])
def test_nearest_halves_the_error_of_stochastic_rounding_at_equal_z(data):
    x = data(20_000, 3)
    j = {r: mucsc.encode_with_stats(x, "mucsc", z=16, rounding=r)[1].J for r in ("stochastic", "nearest")}
    assert j["nearest"] < 0.7 * j["stochastic"]


def test_nearest_goals():
    x = heavy(20_000, 4)
    blob, stats = mucsc.encode_with_stats(x, "mucsc", bits=2, rounding="nearest")
    assert 8 * len(blob) <= 2 * x.size and group_params(blob)["rounding"] == "nearest"
    stoch = mucsc.encode_with_stats(x, "mucsc", bits=2)[1].J
    assert stats.J < stoch
    blob, stats = mucsc.encode_with_stats(x, "mucsc", max_error=0.02, rounding="nearest")
    y = mucsc.decode(blob)
    assert np.linalg.norm(y - x) <= 0.02 * np.linalg.norm(x)


def test_nearest_is_biased_so_it_gets_error_feedback():
    assert mucsc.get_codec("mucsc", rounding="nearest").biased
    assert not mucsc.get_codec("mucsc").biased


def test_nearest_same_bytes_from_a_torch_tensor():
    torch = pytest.importorskip("torch")
    x = gauss(3000, 5)
    assert (mucsc.encode(torch.from_numpy(x), "mucsc", z=8, rounding="nearest")
            == mucsc.encode(x, "mucsc", z=8, rounding="nearest"))


# ---- rounding="dithered" (FORMAT.md 4.5) ----------------------------------------------------------

def dithered(x, **kw):
    return mucsc.encode_with_stats(x, "mucsc", rounding="dithered", **kw)


@pytest.mark.parametrize("data", [gauss, heavy])
@pytest.mark.parametrize("bits", [1, 2, 3, 4])
def test_dithered_halves_stochastic_J_within_the_same_bits(data, bits):
    # issue 24: J <= 0.6x stochastic bits=b (0.65x at b = 1); benchmarks/bench_dither.py checks d = 2e5
    x = data(20_000, 10 + bits)
    blob, st = dithered(x, bits=bits)
    assert 8 * len(blob) <= bits * x.size
    assert st.J <= (0.65 if bits == 1 else 0.6) * mucsc.encode_with_stats(x, "mucsc", bits=bits)[1].J


@pytest.mark.parametrize("data", [gauss, heavy])
def test_dithered_measured_error_matches_J_over_seeds(data):
    x = data(20_000, 20)
    errs, Js = [], []
    for seed in range(20):
        blob, st = dithered(x, z=32, seed=seed)
        errs.append(float(np.sum((mucsc.decode(blob).astype(np.float64) - x) ** 2)))
        Js.append(st.J)
    assert np.mean(errs) == pytest.approx(np.mean(Js), rel=0.05)


def grid_of(blob):
    """(step, offset, share) of the first group's GRID section."""
    m = fmt.read_message(blob)
    return tuple(np.frombuffer(bytes(m.payload(next(s for s in m.sections if s.tag == "GRID")))[:24], "<f8"))


def test_dithered_J_is_exact_for_the_share_it_subtracts():
    # element i's variance is step^2 (f_i (1 - f_i) (1 - share) + share^2 / 12); the share minimises the sum
    x = gauss(1000, 21)
    blob, st = dithered(x, z=16)
    step, offset, share = grid_of(blob)
    assert step == pytest.approx((x.max() - x.min()) / 15) and offset == 0
    a = x.astype(np.float64) / step
    S = float(np.sum((a - np.floor(a)) * (1 - a + np.floor(a))))
    assert abs(share - min(1.0, 6 * S / x.size)) <= 2.0**-17 and (share * 2**16).is_integer()
    assert st.J == pytest.approx(step**2 * (S * (1 - share) + x.size * share**2 / 12), rel=1e-12)
    m = fmt.read_message(blob)
    assert m.minor == 2 and group_params(blob) == {"escape": False, "rounding": "dithered", "symbols": 16}
    whole = dithered(x, grid=(step, 0.0, 1.0))[1]  # the whole dither subtracted: n step^2 / 12
    assert whole.J == pytest.approx(x.size * step**2 / 12, rel=1e-12) and whole.J >= st.J


def test_dithered_bytes_do_not_depend_on_how_the_straddle_was_summed(monkeypatch):
    """GRID's share comes from sum f (1 - f), whose last bits depend on the summation order (BLAS
    threads, backends): the share is rounded, so a sum a few ulps off writes the same message."""
    x = gauss(40000, 54)
    blob = mucsc.encode(x, "mucsc", rounding="dithered", z=8)
    assert 0 < grid_of(blob)[2] < 1  # a share chosen from the sum, not pinned at 1
    exact = dither.straddle
    for ulps in (-4, -1, 1, 4):
        monkeypatch.setattr(dither, "straddle", lambda *a, u=ulps: exact(*a) * (1 + u * 2.0**-52))
        assert mucsc.encode(x, "mucsc", rounding="dithered", z=8) == blob


def test_dithered_subtracts_less_of_the_dither_on_a_near_zero_heavy_input():
    # the 80% near-zero elements sit next to the grid point 0: stochastic rounding's variance
    # step^2 f (1 - f) is far below step^2 / 12 for them, so part of the dither is kept
    x = near_zero(20_000, 30)
    blob, st = dithered(x, bits=1)
    step, offset, share = grid_of(blob)
    assert 0.1 < share < 0.5
    whole_blob, whole = dithered(x, grid=(step, offset, 1.0))
    assert st.J < 0.6 * whole.J
    part = fmt.read_message(blob)
    assert [bytes(part.payload(s)) for s in part.sections if s.tag != "GRID"] == \
        [bytes(fmt.read_message(whole_blob).payload(s)) for s in fmt.read_message(whole_blob).sections
         if s.tag != "GRID"]  # the indices do not depend on the share
    errs = [float(np.sum((mucsc.decode(dithered(x, bits=1, seed=s)[0]).astype(np.float64) - x) ** 2))
            for s in range(10)]
    assert np.mean(errs) == pytest.approx(st.J, rel=0.05)


def test_dithered_share_zero_is_stochastic_rounding_to_the_grid():
    x = np.repeat(np.array([0.05, 0.5], np.float32), 20_000)
    blob, st = dithered(x, grid=(1.0, 0.0, 0.0))
    y = mucsc.decode(blob).reshape(2, -1)
    assert set(np.unique(y)) <= {0.0, 1.0}
    assert np.mean(y[0]) == pytest.approx(0.05, abs=0.005) and np.mean(y[1]) == pytest.approx(0.5, abs=0.02)
    assert st.J == pytest.approx(20_000 * (0.05 * 0.95 + 0.25), rel=1e-6)


@pytest.mark.parametrize("grid", [(1.0, 0.0, 1.5), (1.0, 0.0, -0.1), (1.0, 0.0, float("nan")), (1.0,), (1, 2, 3, 4)])
def test_dithered_grid_is_validated(grid):
    with pytest.raises(ParameterError, match="grid"):
        mucsc.encode(gauss(10), "mucsc", rounding="dithered", grid=grid)


@pytest.mark.parametrize("data", [gauss, heavy])
def test_dithered_is_unbiased(data):
    # the mean of K decodes differs from x by independent noise of variance J / K per message
    x = data(5_000, 22)
    K = 200
    total = np.zeros(x.size)
    Js = []
    for seed in range(K):
        blob, st = dithered(x, z=64, seed=seed)
        total += mucsc.decode(blob)
        Js.append(st.J)
    err = float(np.sum((total / K - x) ** 2))
    assert err == pytest.approx(np.mean(Js) / K, rel=0.3)


def test_dithered_error_is_uniform_and_independent_of_x():
    x = np.repeat(np.array([0.0, 0.3, 0.5], np.float32), 20_000)
    blob, st = dithered(x, grid=(0.25, 0.0, 1.0))  # the whole dither subtracted
    e = (mucsc.decode(blob).astype(np.float64) - x).reshape(3, -1)
    step = 0.25
    for row in e:  # each value's error: uniform on (-step/2, step/2], variance step^2 / 12
        assert np.all(np.abs(row) <= step / 2 + 1e-6)
        assert np.var(row) == pytest.approx(step**2 / 12, rel=0.05) and abs(row.mean()) < 0.003


@pytest.mark.parametrize("data", [heavy, near_zero])
def test_dithered_goals(data):
    x = data(20_000, 23)
    blob, st = dithered(x, max_error=0.05)
    assert np.sqrt(st.J) <= 0.05 * np.linalg.norm(x) and np.sqrt(st.J) > 0.045 * np.linalg.norm(x)
    blob, st = dithered(x, size=6000)
    assert len(blob) <= 6000 and len(blob) > 5900
    for b in (0.5, 1.5):
        blob, st = dithered(x, bits=b)
        assert 0.97 * b * x.size <= 8 * len(blob) <= b * x.size
    tensors = {"a": gauss(8000, 24), "b": heavy(3000, 25) * 10, "c": gauss(500, 26) * 0.01}
    blob, st = mucsc.encode_with_stats(tensors, "mucsc", rounding="dithered", bits=2, shared=False)
    assert 8 * len(blob) <= 2 * 11_500
    out = mucsc.decode(blob)
    assert float(sum(np.sum((out[k].astype(np.float64) - v) ** 2) for k, v in tensors.items())) < 2 * st.J


@pytest.mark.parametrize("x", [np.zeros(0, np.float32), np.array([2.5], np.float32), np.full(9, -0.25, np.float32),
                               np.zeros(7, np.float32)])
def test_dithered_edge_inputs(x):
    blob, st = dithered(x, z=16)
    y = mucsc.decode(blob)
    assert y.shape == x.shape and np.allclose(y, x, atol=1e-6, rtol=1e-6)


def test_dithered_id_coding_packed_is_refused():
    with pytest.raises(ParameterError, match="always rANS-codes"):
        mucsc.encode(gauss(10), "mucsc", rounding="dithered", id_coding="packed")


def _reference_alphabet(q, t):
    """choose_alphabet as first written (per-element splits, one histogram per candidate and context)."""
    values, counts = np.unique(q, return_counts=True)

    def cost(alpha, c):
        sym, esc = alpha.split(q.copy())
        hist = np.bincount(dither.contexts(t, c) * alpha.symbols + sym, minlength=c * alpha.symbols)
        size = dither._coded_bytes(hist.reshape(c, alpha.symbols))
        if alpha.escape:
            size += 32 + float(dither._varint_len(dither.zigzag(esc - alpha.q_lo).astype(np.int64)).sum())
        return size

    best = min(((cost(a, 1), i, a) for i, a in enumerate(dither._candidate_ranges(values, counts))),
               key=lambda r: (r[0], r[1]))
    size, _, alpha = best
    c = 1
    for k in dither.CONTEXT_CHOICES[1:]:
        if cost(alpha, k) < size:
            size, c = cost(alpha, k), k
    return (alpha.q_lo, alpha.inner, alpha.escape), c, size


@pytest.mark.parametrize("data", [gauss, heavy, near_zero])
@pytest.mark.parametrize("rel", [4.0, 0.7, 0.05, 1e-4])
def test_dithered_alphabet_choice_matches_the_per_element_reference(data, rel):
    # the encoder's choice (one joint histogram of finest context and index) is what decides the bytes
    x = data(20_000, 31)
    t = dither.stream(77, x.size)
    q = dither.quantize(x, rel * float(np.std(x)), 0.0, dither.uniforms(t))
    alpha, c, size = dither.choose_alphabet(q, t)
    assert ((alpha.q_lo, alpha.inner, alpha.escape), c, size) == _reference_alphabet(q, t)


@pytest.mark.parametrize("data", [gauss, heavy])
@pytest.mark.parametrize("rel", [6.0, 1.0, 0.2, 0.05])
def test_dithered_expected_sizes_match_the_realised_ones(data, rel):
    # the summary search's model: the indices' expected histogram per context, without a dither draw
    x = data(50_000, 32)
    step = rel * float(np.std(x))
    t = dither.stream(78, x.size)
    alpha, c, size = dither.choose_alphabet(dither.quantize(x, step, 0.0, dither.uniforms(t)), t)
    e_alpha, e_c, e_size, straddled = dither.expected_choice(np.sort(x).astype(np.float64), None, step)
    assert e_size == pytest.approx(size, rel=0.006, abs=64)  # tables: a few bytes either way
    assert straddled == pytest.approx(dither.straddle(x, step, 0.0), rel=1e-9)


@pytest.mark.parametrize("data", [gauss, heavy])
@pytest.mark.parametrize("bits", [0.5, 1, 3])
def test_dithered_summary_search_is_as_good_as_trial_encodes(data, bits, monkeypatch):
    # groups of >= 2^15 elements choose the step from their summary, then encode once (or twice)
    x = data(1 << 16, 33)
    blob, st = dithered(x, bits=bits)
    from mucsc.codec.ratecontrol import dither_search
    monkeypatch.setattr(dither_search, "summarised", lambda trials: False)
    trial_blob, trial = dithered(x, bits=bits)
    assert 8 * len(blob) <= bits * x.size and st.J <= 1.01 * trial.J


@pytest.mark.parametrize("n", [30_000, 70_000])  # a trial-encode search and a summary search
def test_dithered_same_bytes_and_values_on_the_torch_backend(monkeypatch, n):
    torch = pytest.importorskip("torch")
    x = heavy(n, 27)
    host = mucsc.encode(x, "mucsc", rounding="dithered", bits=2, seed=3)
    assert mucsc.encode(torch.from_numpy(x), "mucsc", rounding="dithered", bits=2, seed=3) == host
    from mucsc.codec import kernels
    monkeypatch.setattr(kernels, "TORCH", True)
    assert mucsc.encode(x, "mucsc", rounding="dithered", bits=2, seed=3) == host
    y = mucsc.decode(host, as_torch=True, device="cpu")
    assert torch.is_tensor(y) and np.array_equal(y.numpy(), mucsc.decode(host))


def test_fedsim_codecs_take_parameters():
    from mucsc.fedsim.config import SimConfig, split_experiment, split_list
    from mucsc.fedsim.transport import check_codec

    assert split_list("none, mucsc(rounding=dithered,bits=1),qsgd") == ["none", "mucsc(rounding=dithered,bits=1)",
                                                                        "qsgd"]
    assert split_experiment("mucsc(rounding=dithered, bits=1)") == ("mucsc", {"rounding": "dithered", "bits": "1"})
    cfg = SimConfig(codecs=("mucsc(bits=1)", "mucsc(rounding=dithered,bits=1)"))
    ups, down = cfg.links("mucsc(rounding=dithered,bits=1)", 3, [0, 1, 2])
    for link in (*ups, down):
        check_codec(link)
        assert link.codec_object().params.rounding == "dithered" and link.codec_object().params.bits == 1
    with pytest.raises(mucsc.MucscError, match="not KEY=VALUE"):
        split_experiment("mucsc(bits)")
