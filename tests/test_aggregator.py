"""mucsc.Aggregator: the weighted mean of many messages in one float64 sum, against the weighted mean of
their decodes (every codec, every mucsc ID coding), deterministic, arrays and dicts (any grouping),
authenticated like decode, and a bad message refused whole (the sum unchanged)."""

import numpy as np
import pytest

import mucsc
from mucsc import Aggregator
from mucsc.codec.wire import container as fmt
from tests.msgtools import peak_bytes, recrc, section_offsets

pytestmark = pytest.mark.backends

WEIGHTS = [1.0, 2.5, 3.0, 0.5, 7.0]


def _vectors(d=20_003, count=len(WEIGHTS), seed=0):
    rng = np.random.default_rng(seed)
    return [rng.normal(size=d).astype(np.float32) for _ in range(count)]


def _mean_of_decodes(blobs, weights, **kw):
    total = np.float64(0.0)
    acc = None
    for b, w in zip(blobs, weights):
        x = mucsc.decode(b, **kw)
        term = {k: np.float64(w) * np.asarray(v, np.float64) for k, v in x.items()} if isinstance(x, dict) \
            else np.float64(w) * x.astype(np.float64)
        acc = term if acc is None else ({k: acc[k] + term[k] for k in acc} if isinstance(acc, dict) else acc + term)
        total += w
    return {k: v / total for k, v in acc.items()} if isinstance(acc, dict) else acc / total


CASES = [("mucsc", {}), ("mucsc", {"id_coding": "packed"}), ("mucsc", {"id_coding": "rans"}),
         ("mucsc", {"z": 5, "id_coding": "packed"}), ("mucsc", {"z": 3, "id_coding": "packed", "compress": "off"}),
         ("mucsc", {"z": 300}), ("mucsc", {"z": 300, "id_coding": "packed"}),
         ("mucsc", {"rounding": "dithered", "bits": 1}), ("bmucsc", {}), ("qsgd", {}), ("topk", {}),
         ("raw", {}), ("fp16", {})]


@pytest.mark.parametrize("codec,kw", CASES, ids=[f"{c}-{k}" for c, k in CASES])
def test_mean_equals_the_weighted_mean_of_the_decodes(codec, kw):
    blobs = [mucsc.encode(x, codec, seed=i, **kw) for i, x in enumerate(_vectors())]
    agg = Aggregator()
    for b, w in zip(blobs, WEIGHTS):
        agg.add(b, weight=w)
    ref = _mean_of_decodes(blobs, WEIGHTS)
    got = agg.result()
    assert got.dtype == np.float32 and got.shape == ref.shape
    assert np.max(np.abs(got - ref)) <= 1e-6
    assert np.array_equal(got, ref.astype(np.float32))  # the same float64 sums, then one rounding
    assert agg.count == 5 and agg.total_weight == sum(WEIGHTS)


def test_deterministic_whatever_the_threads():
    blobs = [mucsc.encode(x, seed=i) for i, x in enumerate(_vectors(d=300_001))]
    results = []
    for threads in (1, 4, 1):
        agg = Aggregator()
        for b, w in zip(blobs, WEIGHTS):
            agg.add(b, weight=w, threads=threads)
        results.append(agg.result().tobytes())
    assert results[0] == results[1] == results[2]


def test_dict_keeps_the_first_messages_structure_and_dtypes_any_grouping():
    rng = np.random.default_rng(3)

    def update(i):
        return {"w": rng.normal(size=(40, 30)).astype(np.float32), "steps": np.array([10 * i, 3], np.int64),
                "h": rng.normal(size=17).astype(np.float16), "b": rng.normal(size=5).astype(np.float64)}

    ups = [update(i) for i in range(4)]
    # one shared group, then a group per tensor, then the policy's: the sum is laid out once
    blobs = [mucsc.encode(ups[0]), mucsc.encode(ups[1], shared=False), mucsc.encode(ups[2], z=7),
             mucsc.encode(ups[3], policy=mucsc.Policy())]
    weights = [3.0, 1.0, 2.0, 4.0]
    agg = Aggregator()
    for b, w in zip(blobs, weights):
        agg.add(b, weight=w)
    got = agg.result()
    ref = _mean_of_decodes(blobs, weights)
    assert list(got) == ["w", "steps", "h", "b"]
    assert {k: v.dtype for k, v in got.items()} == {"w": np.float32, "steps": np.int64, "h": np.float16,
                                                     "b": np.float64}
    assert got["w"].shape == (40, 30) and got["steps"].tolist() == [np.rint(ref["steps"][0]), 3]
    for k in ("w", "h", "b"):
        assert np.allclose(got[k], ref[k], rtol=0, atol=1e-3 if k == "h" else 1e-6)


def test_bfloat16_tensors_average_as_float32():
    torch = pytest.importorskip("torch")
    xs = [torch.randn(64, generator=torch.Generator().manual_seed(i)).to(torch.bfloat16) for i in range(3)]
    for codec in ("raw", "mucsc"):
        blobs = [mucsc.encode({"t": x}, codec) for x in xs]
        agg = Aggregator()
        for b in blobs:
            agg.add(b)
        got = agg.result()["t"]
        assert got.dtype == np.float32
        assert np.allclose(got, _mean_of_decodes(blobs, [1, 1, 1])["t"], atol=1e-6)


def test_authentication_as_in_decode():
    key = mucsc.generate_key()
    keys = {"client-1": key}
    x = _vectors(count=1)[0]
    signed = mucsc.encode(x, key=key, key_id="client-1", context="round-3")
    agg = Aggregator()
    agg.add(signed, weight=2.0, keys=keys, context="round-3")
    with pytest.raises(mucsc.AuthError):
        agg.add(signed, keys=keys, context="round-4")        # a replay into another round
    with pytest.raises(mucsc.AuthError):
        agg.add(mucsc.encode(x), keys=keys, context="round-3")  # unsigned, but keys were given
    assert agg.count == 1 and agg.total_weight == 2.0
    assert np.array_equal(agg.result(), mucsc.decode(signed))


def _state(agg):
    return agg.count, agg.total_weight, agg.result().tobytes()


def test_bad_input_is_refused_whole_and_leaves_the_sum_as_it_was():
    xs = _vectors(d=200_000, count=2)
    agg = Aggregator()
    with pytest.raises(mucsc.InputError, match="no message"):
        agg.result()
    agg.add(mucsc.encode(xs[0]), weight=1.5)
    before = _state(agg)
    with pytest.raises(mucsc.InputError, match="first message added holds one float32 array of shape"):
        agg.add(mucsc.encode(xs[1][:1000]))
    with pytest.raises(mucsc.InputError, match="2 tensors"):
        agg.add(mucsc.encode({"a": xs[1][:10], "b": xs[1][10:20]}))
    for w in (-1.0, float("nan"), float("inf"), True, "2"):
        with pytest.raises(mucsc.ParameterError, match="weight"):
            agg.add(mucsc.encode(xs[1]), weight=w)
    with pytest.raises(mucsc.ParameterError, match="bytes"):
        agg.add("not a message")
    with pytest.raises(mucsc.LimitError):
        agg.add(mucsc.encode(xs[1]), max_elements=1000)
    # IDs beyond the centroids in the middle of the vector (z = 5: 3-bit IDs can say 7): refused before
    # anything is added, although the first chunks are fine
    blob = bytearray(mucsc.encode(xs[1], z=5, id_coding="packed", id_packing="tight", compress="off"))
    (pos, _tag, stored, _raw), = [s for s in section_offsets(bytes(blob)) if s[1] == "IDS_"]
    start = pos + fmt.SECTION.size + stored // 2
    blob[start: start + 3] = b"\xff\xff\xff"
    with pytest.raises(mucsc.FormatError, match="out of range"):
        agg.add(recrc(blob))
    with pytest.raises(mucsc.FormatError):
        mucsc.decode(recrc(blob))
    corrupt = bytearray(mucsc.encode(xs[1]))
    corrupt[len(corrupt) // 2] ^= 0xFF
    with pytest.raises(mucsc.FormatError):
        agg.add(bytes(corrupt))
    assert _state(agg) == before
    zero = Aggregator()
    zero.add(mucsc.encode(xs[0]), weight=0)
    with pytest.raises(mucsc.InputError, match="add up to 0"):
        zero.result()


def test_an_add_holds_no_decoded_float_vector():
    """The default codec adds from its IDs: an add() of d = 1e6 traces far less than one float32
    decode (4 MB) or the float64 sum (8 MB); the fallback of a codec without its own accumulator holds
    one decode (and its chunk buffer) at most."""
    d = 1_000_000
    x = np.random.default_rng(1).normal(size=d).astype(np.float32)
    agg = Aggregator()
    agg.add(mucsc.encode(x, seed=9))
    for kw in ({}, {"id_coding": "packed"}, {"id_coding": "rans"}):
        blob = mucsc.encode(x, **kw)
        peak, exc = peak_bytes(agg.add, blob)
        decode_peak, _ = peak_bytes(mucsc.decode, blob)
        assert exc is None
        assert peak <= decode_peak + (1 << 20), (kw, peak, decode_peak)  # + the chunk buffer at most
        if kw.get("id_coding") != "rans":  # (the rANS decoder's own state is a few MB, in decode too)
            assert peak < 2_000_000 and decode_peak > 4 * d, (kw, peak, decode_peak)  # no float32 vector
    blob = mucsc.encode(x, "qsgd")
    peak, exc = peak_bytes(agg.add, blob)
    assert exc is None and peak < peak_bytes(mucsc.decode, blob)[0] + 1_000_000
