"""Codec fixes of issue 10: qsgd/terngrad/signsgd in chunks (peak memory a small multiple of the
input, bytes unchanged), top-k over mostly-zero updates, SignSGD's sign bits zstd-compressible."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

import mucsc
from mucsc.codec.backends import packing
from mucsc.codec.wire import sparse
from mucsc.codec.codecs import qsgd, terngrad

pytestmark = pytest.mark.backends  # .ci/run's torch and numpy passes run it too


def gauss(n, seed=0):
    return np.random.default_rng(seed).normal(size=n).astype(np.float32)


def sparse_update(n=200_000, nnz=300, seed=1):
    x = np.zeros(n, np.float32)
    rng = np.random.default_rng(seed)
    x[rng.choice(n, nnz, replace=False)] = rng.normal(size=nnz)
    return x


@pytest.mark.parametrize("codec,params", [("qsgd", {}), ("qsgd", {"bucket": 16}), ("qsgd", {"coding": "elias"}),
                                          ("terngrad", {"clip": 0.0}), ("terngrad", {"packing": "base3", "clip": 0.0}),
                                          ("signsgd", {})])
def test_chunked_codecs_give_the_same_bytes_for_any_chunk_size(monkeypatch, codec, params):
    x = gauss(5000, 2)
    whole = mucsc.encode(x, codec, seed=3, **params)
    # signsgd's decoder expands its sign bits with the packing step's chunks
    mod, attr = {"qsgd": (qsgd, "CHUNK"), "terngrad": (terngrad, "CHUNK"), "signsgd": (packing, "SIGN_CHUNK")}[codec]
    monkeypatch.setattr(mod, attr, 40)  # a multiple of 8 and of 5
    assert mucsc.encode(x, codec, seed=3, **params) == whole
    np.testing.assert_array_equal(mucsc.decode(whole), mucsc.decode(mucsc.encode(x, codec, seed=3, **params)))


def test_qsgd_buckets_longer_than_a_chunk(monkeypatch):
    monkeypatch.setattr(qsgd, "CHUNK", 64)
    x = gauss(3000, 4)
    y = np.mean([mucsc.decode(mucsc.encode(x, "qsgd", bucket=1000, seed=s)) for s in range(200)], axis=0)
    assert np.abs(y - x).max() < 0.5  # unbiased: the mean of 200 decodings approaches x
    norms = qsgd._bucket_squares(x, 1000)
    np.testing.assert_allclose(norms, [np.sum(x[i:i + 1000].astype(np.float64) ** 2) for i in range(0, 3000, 1000)])


@pytest.mark.parametrize("codec", ["qsgd", "terngrad", "signsgd", "topk"])
def test_encode_and_decode_peak_memory_is_a_small_multiple_of_the_input(codec):
    x = gauss(1 << 21, 5)  # 8 MiB
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        blob = mucsc.encode(x, codec)
        enc = tracemalloc.get_traced_memory()[1] - base
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        mucsc.decode(blob)
        dec = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    assert enc <= 3 * x.nbytes and dec <= 3 * x.nbytes, (enc / x.nbytes, dec / x.nbytes)


def test_top_k_keeps_only_non_zeros_and_handles_tied_zeros():
    x = sparse_update()
    pos = sparse.top_k(x, 2000)  # more than the 300 non-zeros
    np.testing.assert_array_equal(pos, np.flatnonzero(x))
    pos = sparse.top_k(x, 100)
    assert pos.size == 100 and np.all(x[pos] != 0)
    assert np.abs(x[pos]).min() >= np.sort(np.abs(x[x != 0]))[-100]
    for codec in ("topk", "dgc", "stc", "bmucsc"):
        blob = mucsc.encode(x, codec, keep=0.05)
        assert mucsc.inspect(blob).groups[0].params["k"] == 300
        y = mucsc.decode(blob)
        assert np.count_nonzero(y) <= 300
    np.testing.assert_array_equal(mucsc.decode(mucsc.encode(x, "topk", keep=0.05)), x)


def test_top_k_with_ties_at_the_threshold_is_exactly_k():
    x = np.array([3, -1, 1, 1, -3, 2, 1, 0.5] * 10, np.float32)  # |x|: twenty 3s, ten 2s, forty 1s
    pos = sparse.top_k(x, 25)
    assert pos.size == 25 and np.all(np.diff(pos) > 0)
    assert sorted(np.abs(x[pos]).tolist()) == [2.0] * 5 + [3.0] * 20
    pos = sparse.top_k(x, 31)  # all 3s and 2s, then one of the tied 1s
    assert sorted(np.abs(x[pos]).tolist()) == [1.0] + [2.0] * 10 + [3.0] * 20


def test_signsgd_sign_section_of_a_sparse_update_is_compressed():
    x = sparse_update()
    info = mucsc.inspect(mucsc.encode(x, "signsgd"))
    sign = [s for s in info.sections if s.tag == "SIGN"][0]
    assert sign.encoding == "zstd" and sign.stored_bytes < sign.raw_bytes / 20
    dense = mucsc.inspect(mucsc.encode(gauss(20000), "signsgd"))
    assert [s.encoding for s in dense.sections if s.tag == "SIGN"] == ["raw"]  # random signs: kept raw
