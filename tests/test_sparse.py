"""Position-set coding (mucsc.codec.wire.sparse): round trips, sizes, bounds, malformed input."""

import math

import numpy as np
import pytest

from mucsc.codec.wire import sparse
from mucsc.errors import FormatError, ParameterError

METHODS = ["fixed", "int32", "rice", "ef", "bitmap", "auto"]


def _random_positions(d, k, seed=0):
    return np.sort(np.random.default_rng(seed).choice(d, k, replace=False)).astype(np.int64)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("d,k", [(1, 0), (1, 1), (2, 1), (7, 7), (100, 3), (1000, 999), (5000, 50), (4096, 4096)])
def test_round_trip(method, d, k):
    p = _random_positions(d, k, seed=d + k)
    c = sparse.encode(p, d, method)
    assert np.array_equal(sparse.decode(c.data, d, k, c.method, c.arg), p)
    if c.method != "rice":
        assert len(c.data) == sparse.nbytes(c.method, d, k)
    else:
        assert len(c.data) == sparse.nbytes("rice", d, k, c.arg, p)


def test_edge_positions_and_clusters():
    d = 1 << 20
    for p in ([0], [d - 1], [0, d - 1], list(range(100)), list(range(d - 100, d))):
        p = np.array(p, np.int64)
        for m in METHODS:
            c = sparse.encode(p, d, m)
            assert np.array_equal(sparse.decode(c.data, d, p.size, c.method, c.arg), p)


def test_paper_scale_bits_per_position():
    # issue 3: d = 1.3e6, k = 1.3e4 uniform positions; entropy bound log2 C(d, k) / k = 8.08 bits
    d, k = 1_300_000, 13_000
    p = _random_positions(d, k)
    bound = (math.lgamma(d + 1) - math.lgamma(k + 1) - math.lgamma(d - k + 1)) / math.log(2) / k
    c = sparse.encode(p, d)
    bits = 8 * len(c.data) / k
    assert c.method == "rice"
    assert bound <= bits < bound + 0.05  # measured 8.11 vs 8.08
    assert 8 * len(sparse.encode(p, d, "fixed").data) / k == 21.0  # ceil(log2 1.3e6)
    assert 8.5 < 8 * len(sparse.encode(p, d, "ef").data) / k < 8.6


def test_rice_parameter_is_exact_optimum():
    d, k = 200_000, 777
    p = _random_positions(d, k, 3)
    b = sparse.best_rice_parameter(p, d)
    sizes = [sparse.nbytes("rice", d, k, bb, p) for bb in range(0, 19)]
    assert sparse.nbytes("rice", d, k, b, p) == min(sizes)


def test_expected_rice_close_to_measured():
    d, k = 1_300_000, 13_000
    p = _random_positions(d, k, 5)
    assert abs(sparse.expected_rice_bytes(d, k) - sparse.compact_sizes(p, d)["rice"]) < 0.01 * k


def test_choose_bitmap_when_dense():
    d = 10_000
    assert sparse.choose(d, 9000) == "bitmap"
    assert sparse.choose(d, 9000, _random_positions(d, 9000)) == "bitmap"
    assert sparse.choose(d, 10) == "rice"


def test_stc_golomb_parameter():
    # Sattler et al. 2019: b* = 1 + floor(log2(ln(phi - 1) / ln(1 - p)))
    assert sparse.stc_golomb_parameter(0.03) == 4
    assert sparse.stc_golomb_parameter(0.01) == 6
    assert sparse.stc_golomb_parameter(0.001) == 9


def test_encoder_rejects_bad_positions():
    with pytest.raises(ParameterError):
        sparse.encode(np.array([3, 2]), 10)
    with pytest.raises(ParameterError):
        sparse.encode(np.array([1, 1]), 10)
    with pytest.raises(ParameterError):
        sparse.encode(np.array([10]), 10)
    with pytest.raises(ParameterError):
        sparse.encode(np.array([1]), 10, "nope")


@pytest.mark.parametrize("method", ["fixed", "int32", "rice", "ef", "bitmap"])
def test_decoder_rejects_every_truncation_and_extension(method):
    d, k = 3000, 40
    p = _random_positions(d, k, 11)
    c = sparse.encode(p, d, method)
    for cut in range(len(c.data)):
        with pytest.raises(FormatError):
            sparse.decode(c.data[:cut], d, k, method, c.arg)
    with pytest.raises(FormatError):
        sparse.decode(c.data + b"\0", d, k, method, c.arg)


@pytest.mark.parametrize("method", ["fixed", "int32", "rice", "ef", "bitmap"])
def test_decoder_byte_flips_raise_format_error_or_stay_valid(method):
    d, k = 3000, 40
    p = _random_positions(d, k, 12)
    c = sparse.encode(p, d, method)
    rng = np.random.default_rng(0)
    for i in range(len(c.data)):
        bad = bytearray(c.data)
        bad[i] ^= int(rng.integers(1, 256))
        try:
            q = sparse.decode(bytes(bad), d, k, method, c.arg)
        except FormatError:
            continue
        assert q.size == k and np.all(np.diff(q) > 0) and q[0] >= 0 and q[-1] < d


def test_decoder_rejects_bad_header_values():
    d, k = 1000, 10
    p = _random_positions(d, k)
    c = sparse.encode(p, d, "rice")
    for dd, kk, m, a in [(d, k + 1, "rice", c.arg), (d, -1, "rice", c.arg), (d, d + 1, "rice", c.arg),
                         (d, k, "rice", 99), (d, k, "rice", -1), (d, k, "bogus", 0), (d, k, "ef", 1),
                         (1 << 60, k, "rice", c.arg)]:
        with pytest.raises(FormatError):
            sparse.decode(c.data, dd, kk, m, a)
    # padding bits set, whole stray byte
    with pytest.raises(FormatError):
        sparse.decode(b"\xff", 16, 0, "bitmap")
    fx = sparse.encode(np.array([1, 2, 3]), 100, "fixed")  # 3 * 7 = 21 bits: 3 spare bits
    bad = bytearray(fx.data)
    bad[-1] |= 0x80
    with pytest.raises(FormatError):
        sparse.decode(bytes(bad), 100, 3, "fixed")


def test_decoder_rejects_non_increasing_and_out_of_range():
    d = 100
    raw = np.array([5, 5], "<i4").tobytes()
    with pytest.raises(FormatError):
        sparse.decode(raw, d, 2, "int32")
    with pytest.raises(FormatError):
        sparse.decode(np.array([5, 100], "<i4").tobytes(), d, 2, "int32")
    with pytest.raises(FormatError):
        sparse.decode(np.array([-1, 3], "<i4").tobytes(), d, 2, "int32")
    # fixed width 7 bits: value 127 >= d
    with pytest.raises(FormatError):
        sparse.decode(bytes([127]), d, 1, "fixed")


def test_rice_huge_gap_claim_is_bounded():
    # a forged stream of all-zero quotients then ones cannot make a gap beyond d nor allocate by it
    d, k = 1000, 2
    data = bytes([0] * 200 + [0xFF])
    with pytest.raises(FormatError):
        sparse.decode(data, d, k, "rice", 0)
