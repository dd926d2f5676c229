"""Properties every codec of issue 3 shares: round trips, determinism, exact message size (the
documented formula, mucsc.codec.api.rates / spec/codecs.md), J statistics, and decoders that reject
malformed parameters and sections with FormatError."""

import math

import numpy as np
import pytest

import mucsc
from mucsc.codec.api import rates
from mucsc.codec.wire import sparse
from mucsc.codec.codecs.base import codec_class, get_codec
from mucsc.errors import FormatError, ParameterError

pytestmark = pytest.mark.backends  # .ci/run's torch and numpy passes run it too

CASES = [
    ("none", {}), ("fp16", {}),
    ("signsgd", {}), ("signsgd", {"scale": "none"}),
    ("qsgd", {}), ("qsgd", {"s": 1, "bucket": 7}), ("qsgd", {"s": 255, "coding": "elias"}),
    ("qsgd", {"coding": "elias", "bucket": 100}),
    ("terngrad", {}), ("terngrad", {"packing": "base3", "clip": 0}),
    ("topk", {}), ("topk", {"keep": 0.2, "positions": "ef"}), ("topk", {"keep": 1.0, "positions": "bitmap"}),
    ("dgc", {}), ("dgc", {"positions": "paper"}),
    ("stc", {}), ("stc", {"keep": 0.5, "positions": "auto"}), ("stc", {"positions": "fixed"}),
    ("bmucsc", {}), ("bmucsc", {"positions": "paper", "z": 16}), ("bmucsc", {"keep": 0.3, "z": 4, "positions": "ef"}),
    ("bmucsc", {"keep": 1.0, "z": 2, "solver": "uniform"}),
]
IDS = [f"{c}-{'-'.join(f'{k}={v}' for k, v in p.items()) or 'default'}" for c, p in CASES]


def _x(n=3000, seed=0, dtype=np.float32):
    return np.random.default_rng(seed).standard_normal(n).astype(dtype)


@pytest.mark.parametrize("codec,params", CASES, ids=IDS)
@pytest.mark.parametrize("n", [0, 1, 2, 9, 3000])
def test_round_trip_shapes_and_dtypes(codec, params, n):
    for dtype in (np.float32, np.float64):
        x = _x(n, seed=n, dtype=dtype)
        y = mucsc.decode(mucsc.encode(x, codec, **params))
        assert y.dtype == dtype and y.shape == x.shape and np.all(np.isfinite(y))


@pytest.mark.parametrize("codec,params", CASES, ids=IDS)
def test_deterministic_given_seed(codec, params):
    x = _x()
    a = mucsc.encode(x, codec, seed=5, **params)
    assert a == mucsc.encode(x, codec, seed=5, **params)
    p = get_codec(codec, **params).params
    if (codec_class(codec).unbiased and codec != "none") or (codec == "bmucsc" and p.keep_fraction * x.size > p.fixed_z):
        # stochastic rounding: the seed matters (B-MUCSC with no more kept values than Z is exact;
        # none is exact and uses no randomness)
        assert a != mucsc.encode(x, codec, seed=6, **params)


@pytest.mark.parametrize("codec,params", CASES, ids=IDS)
def test_state_dict_round_trip(codec, params):
    sd = {"w": _x(600, 1).reshape(20, 30), "b": _x(30, 2), "step": np.array([3], np.int64)}
    for shared in (True, False):
        out = mucsc.decode(mucsc.encode(sd, codec, shared=shared, **params))
        assert list(out) == ["w", "b", "step"] and out["w"].shape == (20, 30) and out["step"][0] == 3


def _data_dependent_positions(codec, params, x):
    """Position bytes of the codecs whose position code depends on the data (Rice), computed here."""
    p = get_codec(codec, **params).params
    mode = getattr(p, "positions", None)
    if mode not in ("auto", "golomb", "rice"):
        return None
    k = sparse.keep_count(getattr(p, "keep_fraction", p.keep), x.size)  # bmucsc: keep None = 1%
    pos = sparse.top_k(x, k)
    if mode == "golomb":
        return sparse.nbytes("rice", x.size, k, sparse.stc_golomb_parameter(p.keep), pos)
    return min(sparse.compact_sizes(pos, x.size).values())


@pytest.mark.parametrize("codec,params", [c for c in CASES if c[1].get("coding") != "elias"],
                         ids=[i for c, i in zip(CASES, IDS) if c[1].get("coding") != "elias"])
@pytest.mark.parametrize("n", [1, 1000, 4097])
def test_message_size_is_the_documented_formula(codec, params, n):
    x = _x(n, 3)
    blob = mucsc.encode(x, codec, compress="off", **params)
    info = mucsc.inspect(blob)
    head = info.sections[0]
    assert head.tag == "HEAD" and head.encoding == "raw"
    sizes = rates.section_sizes(codec, n, params, positions_bytes=_data_dependent_positions(codec, params, x))
    assert {s.tag: s.raw_bytes for s in info.sections[1:]} == sizes
    assert len(blob) == rates.message_bytes(head.raw_bytes, sizes.values())


@pytest.mark.parametrize("codec,params", CASES, ids=IDS)
def test_reported_J(codec, params):
    """Deterministic codecs: J == ||decode - x||^2; stochastic ones: the mean over seeds is close."""
    x = _x(400, 4).astype(np.float64)
    cls = codec_class(codec)
    stochastic = cls.unbiased or codec == "bmucsc"
    seeds = range(200) if stochastic else range(1)
    errs, Js = [], []
    for s in seeds:
        blob, st = mucsc.encode_with_stats(x, codec, seed=s, **params)
        errs.append(float(np.sum((mucsc.decode(blob) - x) ** 2)))
        Js.append(st.J)
    assert np.ptp(Js) <= 1e-9 * max(1.0, Js[0])
    if stochastic:
        se = np.std(errs) / math.sqrt(len(errs))
        assert abs(np.mean(errs) - Js[0]) <= 5 * se + 1e-9
    else:
        assert errs[0] == pytest.approx(Js[0], rel=1e-6, abs=1e-9)


def _encoded(codec, params, n=500):
    enc = get_codec(codec, **params).encode_array(_x(n, 7), np.random.default_rng(0))
    secs = {s.tag: bytes(s.tobytes()) for s in enc.sections}
    return enc.params, secs


def _decode(codec, n, params, secs):
    return codec_class(codec).decode_array(n, params, {t: memoryview(b) for t, b in secs.items()},
                                           np.dtype(np.float32))


BAD_VALUES = [None, -1, 1 << 62, 1.5, "x", True, [1], float("nan")]


@pytest.mark.parametrize("codec,params", CASES, ids=IDS)
def test_decoder_rejects_malformed_params(codec, params):
    n = 500
    p, secs = _encoded(codec, params, n)
    _decode(codec, n, p, secs)  # the valid one decodes
    for key in p:
        q = dict(p)
        del q[key]
        with pytest.raises(FormatError):
            _decode(codec, n, q, secs)
        for bad in BAD_VALUES:
            q = dict(p, **{key: bad})
            try:
                y = _decode(codec, n, q, secs)
            except FormatError:
                continue
            # a few substitutions can be valid (e.g. another Rice parameter that happens to parse):
            assert y.shape == (n,) and np.all(np.isfinite(y))


@pytest.mark.parametrize("codec,params", CASES, ids=IDS)
def test_decoder_rejects_malformed_sections(codec, params):
    n = 500
    p, secs = _encoded(codec, params, n)
    for tag, data in secs.items():
        for bad in (data[:-1], data + b"\0", b""):
            if bad == data:
                continue
            try:
                y = _decode(codec, n, p, {**secs, tag: bad})
            except FormatError:
                continue
            raise AssertionError(f"{codec} accepted a {len(bad)}-byte {tag} (valid: {len(data)}): {y[:4]}")
        missing = {t: b for t, b in secs.items() if t != tag}
        with pytest.raises(FormatError):
            _decode(codec, n, p, missing)


@pytest.mark.parametrize("codec,params", CASES, ids=IDS)
def test_byte_flips_only_raise_format_error(codec, params):
    n = 300
    p, secs = _encoded(codec, params, n)
    rng = np.random.default_rng(1)
    for tag, data in secs.items():
        for i in rng.choice(len(data), min(len(data), 24), replace=False) if data else []:
            bad = bytearray(data)
            bad[i] ^= 1 << int(rng.integers(8))
            try:
                y = _decode(codec, n, p, {**secs, tag: bytes(bad)})
            except FormatError:
                continue
            assert y.shape == (n,)


def test_unknown_and_invalid_params_raise_parameter_error():
    for codec, bad in [("qsgd", {"s": 0}), ("qsgd", {"coding": "huffman"}), ("qsgd", {"bucket": 0}),
                       ("signsgd", {"scale": "l2"}), ("stc", {"keep": 0}), ("stc", {"positions": "x"}),
                       ("dgc", {"keep": 1.5}), ("topk", {"keep": -0.1}), ("terngrad", {"clip": -1}),
                       ("terngrad", {"packing": "3bit"}), ("bmucsc", {"z": 1}), ("bmucsc", {"z": 70000}),
                       ("bmucsc", {"solver": "kmeans"}), ("bmucsc", {"positions": "huff"}),
                       ("fp16", {"z": 3}), ("none", {"keep": 0.1})]:
        with pytest.raises(ParameterError):
            get_codec(codec, **bad)
