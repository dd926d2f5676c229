"""Careless input to the encoder (issue 9, items 6-9): it must never write a message its own decoder
rejects, never silently change the values, and refuse with a MucscError that names the problem."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import mucsc
from mucsc.codec.wire import container as fmt
from mucsc.codec.numerics import quantize
from mucsc.errors import InputError, LimitError

F32_MAX = float(np.finfo(np.float32).max)
LOSSY = [c for c in mucsc.available_codecs() if c != "raw"]


def encode_quietly(*a, **k):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no overflow warnings either: the limit is checked up front
        return mucsc.encode(*a, **k)


# ---- 6. float64 beyond what a codec's wire carries ---------------------------------------------------

@pytest.mark.parametrize("codec", LOSSY)
@pytest.mark.parametrize("big", [3.5e38, -3.5e38, 1e300])
def test_float64_beyond_the_wire_is_refused_or_decodes(codec, big):
    x = {"layer.w": np.array([1.0, big, -2.0, 0.5])}
    try:
        blob = encode_quietly(x, codec)
    except InputError as exc:
        assert "'layer.w'" in str(exc) and f"{big:.9g}" in str(exc) and codec in str(exc)
        return
    y = mucsc.decode(blob)["layer.w"]  # whatever was written must decode
    assert np.all(np.isfinite(y))


@pytest.mark.parametrize("codec", LOSSY)
def test_float32_extremes_encode_and_decode(codec):
    """Finite float32 data as large as float32 allows: every codec either refuses it with
    InputError (qsgd's bucket norms would overflow) or writes a message that decodes."""
    x = np.array([F32_MAX, -F32_MAX, 1.0, 0.0, 3e38, -1e38], np.float32)
    try:
        blob = encode_quietly(x, codec)
    except InputError as exc:
        assert codec == "qsgd" and "beyond the largest magnitude" in str(exc)
        return
    assert np.all(np.isfinite(mucsc.decode(blob)))


def test_qsgd_limit_depends_on_the_bucket():
    x = np.full(4, 1e38)  # bucket 4: norm 2e38 fits float32; bucket 512 refuses 1e38 > 3.4e38/sqrt(512)
    assert np.allclose(mucsc.decode(encode_quietly(x, "qsgd", bucket=4)).mean(), 1e38, rtol=0.5)
    with pytest.raises(InputError, match="qsgd"):
        encode_quietly(x, "qsgd")


def test_mucsc_float64_centroids_carry_float64_range():
    x = np.array([1e300, -1e300, 0.0, 5e299])
    y = mucsc.decode(encode_quietly(x, "mucsc", z=4, centroid_dtype="float64"))
    assert np.all(np.isfinite(y))
    with pytest.raises(InputError, match="float64|carry"):
        encode_quietly(np.array([1e308, -1e308]), "mucsc", centroid_dtype="float64")


def test_cli_refuses_big_float64_with_none(tmp_path):
    from click.testing import CliRunner

    from mucsc.cli.main import main

    x = np.random.default_rng(0).normal(size=100_000)  # large enough to be encoded, not carried raw
    x[5] = 3.5e38
    np.save(tmp_path / "big.npy", x)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        r = CliRunner().invoke(main, ["compress", "--codec", "none", str(tmp_path / "big.npy")])
    assert r.exit_code == 1 and "3.5e+38" in r.stderr and "Traceback" not in r.stderr
    assert not caught, [str(w.message) for w in caught]  # refused before any cast (no overflow warning)
    assert not (tmp_path / "big.npy.mucsc").exists()


# ---- 7. meta and names validated at encode -----------------------------------------------------------

@pytest.mark.parametrize("meta", [{"a": 1}, {"a": None}, {1: "a"}, {"a": b"x"}, ["a"], "a=b", {"k": "\ud800"},
                                  {"\udfff": "v"}])
def test_bad_meta_is_refused_at_encode(meta):
    with pytest.raises(InputError, match="meta"):
        mucsc.encode(np.ones(3, np.float32), meta=meta)


def test_meta_over_the_header_limit_is_refused_before_encoding():
    with pytest.raises(LimitError, match="header is limited"):
        mucsc.encode(np.ones(3, np.float32), meta={"k": "x" * (17 << 20)})


def test_header_over_the_limit_is_refused():
    # meta alone fits, the header with the record table does not: caught before writing
    meta = {"k": "x" * ((16 << 20) - 100)}
    data = {f"t{i:04d}": np.ones(1, np.float32) for i in range(20)}
    with pytest.raises(LimitError, match="header"):
        mucsc.encode(data, meta=meta)


def test_good_meta_round_trips():
    meta = {"round": "7", "ünï": "ç☃", "": ""}
    assert mucsc.inspect(mucsc.encode(np.ones(3, np.float32), meta=meta)).meta == meta


def test_lone_surrogate_in_a_tensor_name():
    with pytest.raises(InputError, match="tensor name"):
        mucsc.encode({"a\udc80b": np.ones(2, np.float32)})


# ---- 8. the rounding step when c[k+1] - c[k] overflows float32 ----------------------------------------

def test_range_beyond_flt_max_rounds_both_ways():
    x = np.array([-1.8e38, 1.8e38] * 50, np.float32)
    for seed in range(4):
        y = mucsc.decode(mucsc.encode(x, seed=seed))
        assert np.array_equal(y, x)  # two distinct values, two centroids: exact


def test_rounding_is_unbiased_across_an_overflowing_step():
    c = np.array([-1.8e38, 1.8e38], np.float32)
    x = np.full(200_000, 9e37, np.float32)  # 3/4 of the way up: P(up) = 0.75
    ids = quantize.stochastic_round(x, c, np.random.default_rng(0))
    assert abs(ids.mean() - 0.75) < 0.01
    assert quantize._work_dtype(x, c) == np.float64  # the FORMAT.md 4.3 rule


def test_overflow_rule_is_the_same_in_both_backends(monkeypatch):
    from mucsc.codec import kernels

    if kernels.c_module() is None:
        pytest.skip("compiled kernel not built")
    rng = np.random.default_rng(1)
    x = rng.uniform(-1.7e38, 1.7e38, 70_001).astype(np.float32)
    c = np.sort(np.concatenate([[-1.7e38, 1.7e38], rng.uniform(-1.6e38, 1.6e38, 30)])).astype(np.float32)
    out = []
    for backend in ("c", "numpy"):
        monkeypatch.setattr(kernels, "BACKEND", backend)
        out.append(quantize.stochastic_round(x, c, np.random.default_rng(5)))
    assert np.array_equal(*out)


def test_existing_float32_rule_unchanged():
    x = np.linspace(-1, 1, 1000, dtype=np.float32)
    assert quantize._work_dtype(x, np.array([-1, 0, 1], np.float32)) == np.float32


def test_work_dtype_span_shortcut_is_the_step_rule():
    """Sorted float32 levels: float32 work exactly when every float32 step c[k+1] - c[k] is finite,
    also for spans within a few ulps of FLT_MAX (where the shortcut on the span hands over)."""
    x = np.zeros(4, np.float32)
    rng = np.random.default_rng(11)
    top = np.float32(F32_MAX)
    ends = [np.float32(F32_MAX / 2), np.nextafter(np.float32(F32_MAX / 2), top), np.float32(1.7e38), top]
    for a in ends:
        for b in ends:
            for mids in (0, 1, 5):
                c = np.sort(np.concatenate([[-a, b], rng.uniform(-float(a), float(b), mids)]).astype(np.float32))
                c = np.unique(c)
                with np.errstate(over="ignore"):
                    want = np.float32 if np.all(np.isfinite(np.diff(c))) else np.float64
                assert quantize._work_dtype(x, c) == want, (a, b, c)


# ---- 9. everything else the API is handed -------------------------------------------------------------

@pytest.mark.parametrize("data", [[[1.0, 2.0], [3.0]], [1.0, "a"], {"w": [[1], [2, 3]]}, object(),
                                  {"w": np.array(["a", "b"])}, np.array([1 + 2j]), 2**70])
def test_unencodable_python_values(data):
    with pytest.raises(mucsc.MucscError):
        mucsc.encode(data)


@pytest.mark.filterwarnings("ignore::UserWarning")  # torch: sparse CSR is beta, quantize_per_tensor deprecated
def test_torch_oddities():
    torch = pytest.importorskip("torch")
    for t, match in [(torch.empty(3, device="meta"), "meta device"),
                     (torch.ones(3).to_sparse(), "to_dense"),
                     (torch.ones(2, 2).to_sparse_csr(), "to_dense"),
                     (torch.quantize_per_tensor(torch.ones(3), 0.1, 0, torch.qint8), "quantized"),
                     (torch.ones(2, dtype=torch.complex64), "cannot be encoded")]:
        with pytest.raises(InputError, match=match):
            mucsc.encode({"t": t})
    neg = torch.arange(4, dtype=torch.float32)._neg_view()
    assert np.array_equal(mucsc.decode(mucsc.encode(neg, "none")), -np.arange(4, dtype=np.float32))
    conj = torch.tensor([1.0, 2.0]).conj()  # a no-op conj on real data
    assert np.array_equal(mucsc.decode(mucsc.encode(conj, "none")), [1.0, 2.0])


def test_reader_and_writer_agree_on_the_header():
    """The writer's final check is the reader's parse_header itself."""
    blob = mucsc.encode({"a": np.ones(2, np.float32)}, meta={"x": "y"})
    msg = fmt.read_message(blob)
    assert fmt.parse_header(bytes(msg.payload(msg.sections[0]))) == msg.header


def test_device_path_checks_the_codec_limit(monkeypatch):
    """Tensors kept as torch (GPU, or MUCSC_BACKEND=torch) go through the same input_limit."""
    torch = pytest.importorskip("torch")
    from mucsc.codec import kernels

    monkeypatch.setattr(kernels, "TORCH", True)
    with pytest.raises(InputError, match=r"'w' holds a magnitude of 3.5e\+38.*'none'"):
        mucsc.encode({"w": torch.tensor([1.0, 3.5e38], dtype=torch.float64)}, "none")
