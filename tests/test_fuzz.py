"""Decoder robustness: random edits to valid messages (with the CRC recomputed, so they reach the
parsers behind it) must give a clean MucscError or a well-formed result, never another exception."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mucsc
from mucsc.codec.codecs.base import available_codecs
from msgtools import recrc

CODECS = [c for c in available_codecs()]


def _message(codec: str, seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    data = {"w": rng.standard_t(3, size=(17, 9)).astype(np.float32), "b": rng.normal(size=5).astype(np.float32),
            "n": np.arange(4, dtype=np.int32)}
    params = {"keep": 0.2} if codec in ("bmucsc", "stc", "dgc", "topk") else {}
    return mucsc.encode(data, codec, seed=seed, **params)


MESSAGES = {c: _message(c, 1) for c in CODECS}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(codec=st.sampled_from(CODECS), edits=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)),
                                                     min_size=1, max_size=4))
def test_edited_messages_fail_cleanly(codec, edits):
    blob = bytearray(MESSAGES[codec])
    for pos, val in edits:
        blob[pos % (len(blob) - 4)] = val
    try:
        out = mucsc.decode(recrc(blob), max_elements=10**6)
    except mucsc.MucscError:
        return
    assert isinstance(out, dict)
    for v in out.values():
        assert isinstance(v, np.ndarray)


@settings(max_examples=60, deadline=None)
@given(codec=st.sampled_from([c for c in CODECS if c != "raw"]),
       shape=st.lists(st.integers(0, 9), min_size=0, max_size=3),
       scale=st.sampled_from([1e-6, 1.0, 1e3]), seed=st.integers(0, 2**32 - 1))
def test_round_trip_any_shape(codec, shape, scale, seed):
    x = (np.random.default_rng(seed).normal(size=shape) * scale).astype(np.float32)
    y = mucsc.decode(mucsc.encode(x, codec, seed=seed))
    assert y.shape == x.shape and y.dtype == x.dtype and np.all(np.isfinite(y))


@pytest.mark.parametrize("codec", CODECS)
def test_every_truncation_of_every_codec(codec):
    blob = MESSAGES[codec]
    for cut in range(0, len(blob), max(1, len(blob) // 97)):
        with pytest.raises(mucsc.MucscError):
            mucsc.decode(blob[:cut])


JSON_VALUES = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=False, allow_infinity=False),
                        st.text(max_size=8), st.lists(st.integers(), max_size=3))


@settings(max_examples=300, deadline=None)
@given(codec=st.sampled_from(CODECS), data=st.data())
def test_forged_header_params_fail_cleanly(codec, data):
    """Every codec parameter in the header replaced by an arbitrary JSON value."""
    import json

    from mucsc.codec.wire import container as fmt
    from msgtools import build

    msg = fmt.read_message(MESSAGES[codec])
    head = json.loads(bytes(msg.payload(msg.sections[0])))
    group = head["groups"][0]
    if group["params"]:
        key = data.draw(st.sampled_from(sorted(group["params"])))
        group["params"][key] = data.draw(JSON_VALUES)
    else:
        group["params"][data.draw(st.text(max_size=5))] = data.draw(JSON_VALUES)
    secs = [(s.group, s.tag, bytes(msg.payload(s))) for s in msg.sections[1:]]
    try:
        out = mucsc.decode(build(fmt.canonical_json(head), secs), max_elements=10**6)
    except mucsc.MucscError:
        return
    # accepted (e.g. an informative parameter, or a value equal to the original): the records are
    # the original ones, so every tensor comes back with its name and shape
    expect = mucsc.decode(MESSAGES[codec])
    assert list(out) == list(expect) and all(out[k].shape == expect[k].shape for k in expect)
