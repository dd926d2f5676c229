"""Stateful compression: error feedback (residual + sent == input), DGC's momentum correction,
factor masking, clipping and warm-up as its memory (checked against a direct numpy implementation),
and the state_dict round trip that persists a sender's memory between rounds."""

import math

import numpy as np
import pytest

import mucsc
from mucsc import Compressor
from mucsc.codec.codecs.dgc import DGC_WARMUP
from mucsc.errors import InputError, ParameterError, UnknownCodecError

pytestmark = pytest.mark.backends  # .ci/run's torch and numpy passes run it too


def _g(n=2000, seed=0, dtype=np.float32):
    return np.random.default_rng(seed).standard_normal(n).astype(dtype)


def test_error_feedback_default_follows_bias():
    for codec in ("stc", "topk", "dgc", "signsgd", "bmucsc", "fp16"):
        assert Compressor(codec).error_feedback
    for codec in ("mucsc", "qsgd", "terngrad", "none", "raw"):  # unbiased, exact or lossless
        assert not Compressor(codec).error_feedback
    assert not Compressor("stc", error_feedback=False).error_feedback
    assert Compressor("qsgd", error_feedback=True).error_feedback


def test_constructor_validates():
    with pytest.raises(UnknownCodecError):
        Compressor("nope")
    with pytest.raises(ParameterError):
        Compressor("stc", keep=2.0)


@pytest.mark.parametrize("codec,params", [("stc", {}), ("topk", {"keep": 0.05}), ("signsgd", {}),
                                          ("bmucsc", {"keep": 0.05, "z": 8}), ("qsgd", {"s": 1})])
def test_residual_plus_sent_equals_input(codec, params):
    c = Compressor(codec, error_feedback=True, seed=3, **params)
    total_in = np.zeros(2000, np.float64)
    total_sent = np.zeros(2000, np.float64)
    for r in range(6):
        g = _g(seed=r)
        before = c.residual.get("", np.zeros_like(g)).copy()
        sent = mucsc.decode(c.compress(g))
        # one round: (input + old residual) == sent + new residual, up to float32 rounding
        scale = float(np.abs(g + before).max())
        assert np.allclose(g + before, sent + c.residual[""], rtol=0, atol=1e-6 * scale)
        total_in += g
        total_sent += sent
    # telescoping over rounds: everything not yet sent is in the residual
    assert np.allclose(total_in, total_sent + c.residual[""], atol=1e-5 * float(np.abs(total_sent).max()))


def test_error_feedback_with_a_state_dict():
    c = Compressor("topk", keep=0.1, seed=1)
    sd = {"w": _g(300, 1).reshape(10, 30), "b": _g(10, 2), "steps": np.array([7], np.int64)}
    out = mucsc.decode(c.compress(sd))
    assert set(c.residual) == {"w", "b"}  # only float tensors carry a residual
    for k in ("w", "b"):
        assert np.allclose(sd[k], out[k] + c.residual[k], atol=1e-6)
    assert out["steps"][0] == 7
    out2 = mucsc.decode(c.compress(sd))
    assert np.allclose(sd["w"] + sd["w"] - out["w"], out2["w"] + c.residual["w"], atol=1e-5)
    with pytest.raises(InputError):
        c.compress({"w": _g(10), "b": _g(10, 2)})
    c.reset()
    assert c.residual == {}


def test_no_error_feedback_is_plain_encode_and_rounds_are_seeded():
    g = _g()
    c = Compressor("qsgd", seed=9)
    a, b = c.compress(g), c.compress(g)
    assert a != b  # a fresh seed each round
    c2 = Compressor("qsgd", seed=9)
    assert c2.compress(g) == a and c2.compress(g) == b  # reproducible
    assert Compressor("qsgd").compress(g, seed=4) == mucsc.encode(g, "qsgd", seed=4)
    assert c.residual == {}


def test_compress_decoded_is_compress_and_its_decode():
    """compress_decoded: the same messages and state as compress, and bit for bit what decode gives
    (one test over the cases: the backend passes run it, and each case is fast)."""
    cases = [("mucsc", {"z": 16, "id_coding": "packed"}, _g(3000)),      # the encoder's lookup, 8-bit IDs
             ("mucsc", {"z": 300}, _g(3000, dtype=np.float64)),           # 16-bit IDs, float64
             ("mucsc", {"z": 4, "centroid_dtype": "float16"}, _g(500).reshape(20, 25)),
             ("mucsc", {"rounding": "dithered"}, _g(3000)),               # no lookup: decoded
             ("topk", {"keep": 0.05}, _g(3000)),                          # error feedback
             ("mucsc", {"z": 8}, {"w": _g(600).reshape(20, 30), "b": _g(30, 1)})]  # two tensors: decoded
    for codec, params, data in cases:
        a, b = Compressor(codec, seed=3, **params), Compressor(codec, seed=3, **params)
        for _ in range(2):
            blob, decoded = a.compress_decoded(data)
            assert blob == b.compress(data), (codec, params)
            want = mucsc.decode(blob)
            pairs = [(decoded[k], want[k]) for k in want] if isinstance(want, dict) else [(decoded, want)]
            for got, ref in pairs:
                assert got.dtype == ref.dtype and got.shape == ref.shape, (codec, params)
                assert got.tobytes() == ref.tobytes(), (codec, params)
        for name, r in a.residual.items():
            assert np.array_equal(r, b.residual[name]), (codec, params)


def test_compress_decoded_reads_a_clusterings_lookup(monkeypatch):
    """A one-array mucsc message's own decode comes from the encoder's levels and IDs, not the bytes."""
    from mucsc.codec.api import messages

    if mucsc.codec.kernels.TORCH:  # the torch backend keeps its IDs as a tensor: the message is decoded
        pytest.skip("MUCSC_BACKEND=torch encodes on torch tensors (no host lookup)")
    g = _g(5000)
    want = mucsc.decode(mucsc.encode(g, "mucsc", seed=1, z=16))
    monkeypatch.setattr(messages, "decode", lambda *a, **k: pytest.fail("decoded the message"))
    blob, got = Compressor("mucsc", z=16).compress_decoded(g, seed=1)
    assert got.tobytes() == want.tobytes()


def _dgc_reference(grads, keep_per_round, momentum, clip_norm):
    """Direct implementation of DGC's algorithm 1 (one tensor, float64)."""
    u = v = None
    sent_all = []
    for g, keep in zip(grads, keep_per_round):
        g = g.astype(np.float64)
        if clip_norm is not None and np.linalg.norm(g) > clip_norm:
            g = g * clip_norm / np.linalg.norm(g)
        u = g if u is None else momentum * u + g
        v = u.copy() if v is None else v + u
        k = math.ceil(keep * g.size)
        idx = np.argsort(-np.abs(v), kind="stable")[:k]
        sent = np.zeros_like(v)
        sent[idx] = v[idx]
        u[idx] = 0
        v[idx] = 0
        sent_all.append(sent)
    return sent_all


@pytest.mark.parametrize("clip_norm", [None, 5.0])
def test_dgc_matches_reference(clip_norm):
    grads = [_g(4000, s, np.float64) for s in range(8)]
    c = Compressor("dgc", keep=0.01, momentum=0.9, clip_norm=clip_norm)
    assert c.error_feedback
    keeps = [c.memory.keep_at(r) for r in range(8)]
    assert keeps == [0.25, 0.0625, 0.015625, 0.01, 0.01, 0.01, 0.01, 0.01]
    ref = _dgc_reference(grads, keeps, 0.9, clip_norm)
    for g, expect in zip(grads, ref):
        got = mucsc.decode(c.compress(g))
        assert np.count_nonzero(got) == np.count_nonzero(expect)
        assert np.allclose(got, expect, rtol=1e-6, atol=1e-6)  # values go through float32


def test_dgc_masking_and_warmup_by_epoch():
    c = Compressor("dgc", keep=0.001, warmup_period=2, shared=False)
    assert [c.memory.keep_at(s) for s in range(6)] == list(DGC_WARMUP) + [0.001]
    sd = {"a": _g(1000, 1), "b": _g(3000, 2)}
    out = mucsc.decode(c.compress(sd, epoch=0))
    for name in sd:  # per tensor (shared=False): 25% of each
        assert np.count_nonzero(out[name]) == math.ceil(0.25 * sd[name].size)
        assert np.all(c.memory.u[name][out[name] != 0] == 0) and np.all(c.memory.v[name][out[name] != 0] == 0)
    out = mucsc.decode(c.compress(sd, epoch=9))
    assert np.count_nonzero(out["b"]) == 3


def test_dgc_validates():
    for bad in ({"momentum": 1.0}, {"clip_norm": 0}, {"warmup": (0.0,)}, {"warmup_period": 0}, {"keep": 0}):
        with pytest.raises(ParameterError):
            Compressor("dgc", **bad)
    with pytest.raises(ParameterError, match="momentum"):  # a memory option of another codec
        Compressor("topk", momentum=0.9)
    with pytest.raises(ParameterError, match="'keep'"):  # a codec object carries its own parameters
        Compressor(mucsc.get_codec("topk"), keep=0.1)


@pytest.mark.parametrize("codec,params", [("topk", {"keep": 0.05}), ("dgc", {"keep": 0.02, "momentum": 0.5})])
def test_state_dict_resumes_the_same_messages(codec, params):
    """A sender restored from state_dict continues exactly as the one that kept running."""
    grads = [{"w": _g(600, s).reshape(20, 30), "b": _g(30, 100 + s)} for s in range(5)]
    a = Compressor(codec, seed=2, **params)
    for g in grads[:2]:
        a.compress(g)
    saved = a.state_dict()
    assert saved["rounds"] == 2 and saved["memory"]  # arrays, plain data
    b = Compressor(codec, seed=2, **params)
    b.load_state_dict(saved)
    for g in grads[2:]:
        assert a.compress(g) == b.compress(g)
    with pytest.raises(ParameterError):
        b.load_state_dict({"rounds": -1, "memory": {}})
    with pytest.raises(ParameterError):
        b.load_state_dict({"rounds": 1, "memory": {"nonsense": {}}})
