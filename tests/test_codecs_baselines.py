"""Defining properties of the paper's baselines: QSGD and TernGrad are unbiased; top-k/DGC keep
exactly the k largest; STC sends mu * sign; signSGD sends scaled signs; fp16/none round as stated."""

import math

import numpy as np
import pytest

import mucsc
from mucsc.codec.wire import sparse
from mucsc.codec.codecs.base import codec_class, get_codec
from mucsc.codec.codecs.signsgd import majority_vote
from mucsc.codec.codecs.terngrad import clip_sigma

pytestmark = pytest.mark.backends  # .ci/run's torch and numpy passes run it too


def _x(n=64, seed=0, dtype=np.float32):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(n) * rng.uniform(0.1, 3, n)).astype(dtype)


def _decoded_samples(codec, x, reps, **params):
    c = get_codec(codec, **params)
    cls = codec_class(codec)
    out = np.empty((reps, x.size))
    for s in range(reps):
        enc = c.encode_array(x, np.random.default_rng(s))
        secs = {t.tag: memoryview(bytes(t.tobytes())) for t in enc.sections}
        out[s] = cls.decode_array(x.size, enc.params, secs, np.dtype(np.float64))
    return out


def _assert_unbiased(samples, target, var=None):
    """Every element's mean within 5 standard errors (the exact variance when known, else sampled)."""
    mean = samples.mean(axis=0)
    v = samples.var(axis=0, ddof=1) if var is None else var
    se = np.sqrt(v / samples.shape[0])
    exact = se == 0
    assert np.allclose(mean[exact], target[exact], rtol=1e-6, atol=1e-12)
    z = np.abs(mean[~exact] - target[~exact]) / se[~exact]
    assert z.max() < 5, f"max |mean - x| / SE = {z.max():.2f}"


@pytest.mark.parametrize("params", [{"s": 1, "bucket": 16}, {"s": 4, "bucket": 64, "coding": "elias"},
                                    {"s": 15, "bucket": 7}, {"s": 255, "bucket": 512}])
def test_qsgd_unbiased(params):
    x = _x(64, 1).astype(np.float64)
    _assert_unbiased(_decoded_samples("qsgd", x, 1500, **params), x)


def test_qsgd_fixed_and_elias_decode_identically():
    x = _x(1000, 2)
    for s in (1, 7, 255):
        a = mucsc.decode(mucsc.encode(x, "qsgd", s=s, seed=3))
        b = mucsc.decode(mucsc.encode(x, "qsgd", s=s, coding="elias", seed=3))
        assert np.array_equal(a, b)


def test_qsgd_levels_are_multiples_of_norm_over_s():
    x = _x(512, 3)
    y = mucsc.decode(mucsc.encode(x, "qsgd", s=3, bucket=512))
    norm = np.float32(np.linalg.norm(x.astype(np.float64)))
    lev = np.abs(y.astype(np.float64)) * 3 / float(norm)
    assert np.allclose(lev, np.round(lev), atol=1e-5) and lev.max() <= 3 + 1e-6
    assert np.all((np.sign(y) == np.sign(x)) | (y == 0))


def test_qsgd_elias_is_smaller_when_sparse():
    x = _x(20000, 4)
    fixed = len(mucsc.encode(x, "qsgd", s=1, compress="off"))
    elias = len(mucsc.encode(x, "qsgd", s=1, coding="elias", compress="off"))
    assert elias < fixed


@pytest.mark.parametrize("params", [{"clip": 0}, {"clip": 0, "packing": "base3"}, {}])
def test_terngrad_unbiased_for_the_clipped_vector(params):
    x = _x(64, 5).astype(np.float64)
    x[7] = 40.0  # an outlier that 2.5-sigma clipping cuts
    target = clip_sigma(x, params.get("clip", 2.5))
    if params.get("clip", 2.5):
        assert target[7] < 40.0
    s = float(np.float32(np.abs(target).max()))
    var = np.maximum(np.abs(target) * s - target ** 2, 0)  # Bernoulli(|g| / s) scaled by s
    _assert_unbiased(_decoded_samples("terngrad", x, 1500, **params), target, var)


def test_terngrad_values_are_ternary_and_packings_agree():
    x = _x(1001, 6)
    a = mucsc.decode(mucsc.encode(x, "terngrad", seed=2))
    b = mucsc.decode(mucsc.encode(x, "terngrad", packing="base3", seed=2))
    assert np.array_equal(a, b)
    assert len(np.unique(np.abs(a))) <= 2
    assert len(mucsc.encode(x, "terngrad", packing="base3", compress="off")) < \
        len(mucsc.encode(x, "terngrad", compress="off"))


@pytest.mark.parametrize("codec", ["topk", "dgc"])
@pytest.mark.parametrize("keep", [0.001, 0.01, 0.3, 1.0])
def test_topk_keeps_exactly_the_k_largest(codec, keep):
    x = _x(5000, 7)
    y = mucsc.decode(mucsc.encode(x, codec, keep=keep))
    k = math.ceil(keep * x.size)
    kept = np.flatnonzero(y)
    assert kept.size == k
    assert np.array_equal(y[kept], x[kept])  # float32 values exact
    if k < x.size:
        assert np.abs(x[kept]).min() >= np.abs(np.delete(x, kept)).max()


def test_dgc_paper_positions_are_int32():
    x = _x(100_000, 8)
    info = mucsc.inspect(mucsc.encode(x, "dgc", positions="paper", compress="off"))
    sec = {s.tag: s.raw_bytes for s in info.sections}
    assert sec["INDX"] == 4 * 1000 and sec["VALS"] == 4 * 1000


def test_stc_sends_mean_magnitude_times_sign():
    x = _x(10_000, 9)
    y = mucsc.decode(mucsc.encode(x, "stc"))
    k = math.ceil(0.03 * x.size)
    top = sparse.top_k(x, k)
    mu = np.float32(np.abs(x[top].astype(np.float64)).mean())
    assert np.array_equal(np.flatnonzero(y), top)
    assert np.array_equal(y[top], np.where(x[top] < 0, -mu, mu))


def test_stc_golomb_positions_match_the_stc_cost_formula():
    # Sattler et al.: b* + 1 / (1 - (1 - p)^(2^b*)) bits per position on average
    n, p = 400_000, 0.03
    x = _x(n, 10)
    info = mucsc.inspect(mucsc.encode(x, "stc", keep=p, compress="off"))
    indx = next(s for s in info.sections if s.tag == "INDX").raw_bytes
    b = sparse.stc_golomb_parameter(p)
    predicted = b + 1 / (1 - (1 - p) ** (2 ** b))
    assert abs(8 * indx / math.ceil(p * n) - predicted) < 0.1


def test_signsgd_scaled_and_pure_signs():
    x = _x(999, 11)
    x[5] = 0.0
    y = mucsc.decode(mucsc.encode(x, "signsgd"))
    scale = np.float32(np.abs(x.astype(np.float64)).sum() / x.size)
    assert np.array_equal(y, np.where(x < 0, -scale, scale))
    z = mucsc.decode(mucsc.encode(x, "signsgd", scale="none"))
    assert np.array_equal(z, np.where(x < 0, -1.0, 1.0).astype(np.float32))
    assert len(mucsc.encode(x, "signsgd", compress="off")) - len(mucsc.encode(x, "signsgd", scale="none",
                                                                               compress="off")) >= 4


def test_majority_vote():
    a = np.array([1.0, -2.0, 3.0, 0.5])
    b = np.array([-1.0, -1.0, 2.0, -0.5])
    c = np.array([0.3, 4.0, 1.0, -0.1])
    assert np.array_equal(majority_vote([a, b, c]), [1, -1, 1, -1])
    assert np.array_equal(majority_vote([a, b]), [0, -1, 1, 0])
    with pytest.raises(ValueError):
        majority_vote([])


def test_fp16_and_none():
    x = _x(1000, 12, np.float64)
    x[0] = 1e6
    h = mucsc.decode(mucsc.encode(x, "fp16"))
    assert h.dtype == np.float64 and h[0] == 65504.0
    assert np.array_equal(h[1:], x[1:].astype(np.float16).astype(np.float64))
    v = mucsc.decode(mucsc.encode(x, "none"))
    assert np.array_equal(v, x.astype(np.float32).astype(np.float64))  # NC sends float32
    x32 = _x(1000, 13)
    assert np.array_equal(mucsc.decode(mucsc.encode(x32, "none")), x32)


def test_biased_flags():
    assert codec_class("qsgd").unbiased and codec_class("terngrad").unbiased
    assert codec_class("none").unbiased and not codec_class("none").lossless  # exact for float32 input
    for name in ("signsgd", "stc", "dgc", "topk", "bmucsc", "fp16"):
        assert not codec_class(name).unbiased and not codec_class(name).lossless


def test_qsgd_huge_bucket_does_not_allocate_buckets_times_size():
    import tracemalloc
    x = _x(5, 14)
    tracemalloc.start()
    y = mucsc.decode(mucsc.encode(x, "qsgd", bucket=1 << 30))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert y.shape == (5,) and peak < 1 << 20
