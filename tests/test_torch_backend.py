"""The torch backend (the Torch forms of mucsc/codec/backends/) writes the same bytes as the compiled / numpy
reference: the rounding stream and decision rule of FORMAT.md 4.3, the IDS_ packing, the solver's
device summary, and the API path that keeps tensors on their device.  Runs on CPU tensors (the same
torch ops as on a GPU); the CUDA cases run only where a GPU is present."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from msgtools import recrc, section_offsets

import mucsc
from mucsc.codec import kernels
from mucsc.codec.numerics import centroids, quantize
from mucsc.codec.wire import bitpack
from mucsc.codec.wire import container as fmt

torch = pytest.importorskip("torch")
from mucsc.codec.backends.tensors import is_torch_tensor  # noqa: E402
from mucsc.codec.backends import device_rounding  # noqa: E402  (after the skip)
from mucsc.codec.backends import (crc, elementwise, ordered_sum, random_stream, torch_packing,  # noqa: E402
                                  torch_rounding, torch_selection, torch_transfer)  # (torch lazily; after the skip)

CUDA = torch.cuda.is_available()


@pytest.fixture
def torch_backend_on(monkeypatch):
    monkeypatch.setattr(kernels, "TORCH", True)


def _host_encode(monkeypatch, *args, **kwargs) -> bytes:
    """``mucsc.encode`` on the host path (compiled kernels or numpy), the torch backend selected again after."""
    monkeypatch.setattr(kernels, "TORCH", False)
    try:
        return mucsc.encode(*args, **kwargs)
    finally:
        monkeypatch.setattr(kernels, "TORCH", True)


def _data(kind: str, n: int, dtype, seed: int = 0) -> np.ndarray:
    g = np.random.default_rng(seed)
    x = {"t3": lambda: g.standard_t(3, n), "gauss": lambda: g.normal(size=n),
         "zeros": lambda: np.where(g.random(n) < 0.9, 0.0, g.normal(size=n)),
         "few": lambda: g.choice([-2.0, 0.0, 1.5], n)}[kind]()
    return x.astype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("z", [2, 3, 5, 16, 256, 300])
@pytest.mark.parametrize("n", [1, 7, 1001, 4099])
def test_rounding_ids_and_J_equal_the_reference(dtype, z, n):
    x = _data("t3", n, dtype, seed=z + n)
    c = quantize.wire_centroids(centroids.solve(x, z), x, np.float32)
    ref_ids, ref_J = quantize.stochastic_round(x, c, np.random.default_rng([3, 1]), return_J=True)
    key = quantize.draw_key(np.random.default_rng([3, 1]))
    ids, J = torch_rounding.stochastic_round(torch.from_numpy(x), c, key, return_J=True)
    assert np.array_equal(ids.numpy(), ref_ids.astype(np.int64))
    assert J == pytest.approx(ref_J, rel=1e-9, abs=1e-12)
    # the lazy pass
    assert torch_rounding.variance_J(torch.from_numpy(x), c) == pytest.approx(ref_J, rel=1e-9, abs=1e-12)


@pytest.mark.parametrize("dtype,f64", [(np.float32, False), (np.float32, True), (np.float64, False)])
def test_a_rounding_samples_its_ids_without_rounding_everything(dtype, f64):
    x = _data("t3", 5003, dtype, seed=1)
    c = quantize.wire_centroids(centroids.solve(x, 7), x, np.float32)
    if f64:  # off the float32 grid (still bracketing x): float64 work
        c = c + np.linspace(0.0, 1e-9, c.size)
    ids = torch_rounding.stochastic_round(torch.from_numpy(x), c, 77)[0].numpy().astype(np.int64)
    for step in (1, 3, 8):
        assert np.array_equal(device_rounding.Rounding(torch.from_numpy(x), c, 77).sample(step).numpy(), ids[::step])
    assert torch_rounding.work_float32(torch.from_numpy(x), c) == (dtype == np.float32 and not f64)


def test_float64_work_for_float32_data_with_float64_levels():
    x = _data("gauss", 999, np.float32)
    c = centroids.solve(x, 16) + 1e-9  # not exact in float32: the reference works in float64
    c[0], c[-1] = float(x.min()) - 1e-6, float(x.max()) + 1e-6
    ref = quantize.stochastic_round(x, c, np.random.default_rng(5))
    ids, _ = torch_rounding.stochastic_round(torch.from_numpy(x), c, quantize.draw_key(np.random.default_rng(5)))
    assert not torch_rounding.work_float32(torch.from_numpy(x), c)
    assert np.array_equal(ids.numpy(), ref.astype(np.int64))


@pytest.mark.parametrize("width", range(0, 17))
@pytest.mark.parametrize("n", [0, 1, 5, 8, 13, 1027])
def test_pack_and_unpack_equal_bitpack(width, n):
    hi = 1 << width if width else 1
    ids = np.random.default_rng(width * 100 + n).integers(0, hi, n)
    packed = torch_packing.pack(torch.from_numpy(ids), width).tobytes()  # a payload left on the device: its bytes
    assert packed == bitpack.pack(ids, width)
    assert np.array_equal(torch_packing.unpack(packed, width, n, "cpu").numpy(), ids)


def test_splitmix64_equals_the_numpy_stream():
    ref = kernels.splitmix64(0xDEADBEEFCAFEF00D, 17, 1000)
    got = random_stream.splitmix64(0xDEADBEEFCAFEF00D, 17, 1000, "cpu").numpy().view(np.uint64)
    assert np.array_equal(got, ref)


@pytest.mark.parametrize("kind", ["t3", "zeros", "few"])
@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_messages_byte_identical(torch_backend_on, monkeypatch, kind, dtype):
    # sizes above centroids.FULL_SORT_MAX take the subsample + exact-tails summary from the device
    n = centroids.FULL_SORT_MAX + 4099
    x = _data(kind, n, dtype, seed=7)
    for z in (2, 16, 300):
        got = mucsc.encode(torch.from_numpy(x), "mucsc", z=z, seed=11)
        want = _host_encode(monkeypatch, x, "mucsc", z=z, seed=11)
        assert got == want, (kind, dtype, z)


@pytest.mark.parametrize("codec,params", [("mucsc", {"z": 8}), ("mucsc", {"z": 256, "centroid_dtype": "float64"}),
                                          ("mucsc", {"z": 4, "id_packing": "tight"}),
                                          ("bmucsc", {"keep": 0.05}), ("qsgd", {}), ("topk", {}),
                                          ("signsgd", {}), ("fp16", {}), ("none", {}), ("stc", {}),
                                          ("dgc", {"positions": "paper"})])
@pytest.mark.parametrize("shared", [True, False])
def test_state_dicts_byte_identical(torch_backend_on, monkeypatch, codec, params, shared):
    g = torch.Generator().manual_seed(0)
    sd = {"w": torch.randn(123, 45, generator=g), "b": torch.zeros(7), "h": torch.randn(51, generator=g).half(),
          "bf": torch.randn(33, generator=g).bfloat16(), "d": torch.randn(17, generator=g).double(),
          "step": torch.arange(3)}
    got = mucsc.encode(sd, codec, seed=2, shared=shared, **params)
    monkeypatch.setattr(kernels, "TORCH", False)
    assert got == mucsc.encode(sd, codec, seed=2, shared=shared, **params)


@pytest.mark.parametrize("kind", ["few", "zeros"])
def test_bmucsc_ties_at_the_kth_magnitude_give_the_host_selection(torch_backend_on, monkeypatch, kind):
    """Ties at a non-zero k-th magnitude: the host chooses (None); ~10% non-zero with keep 20% ties
    at 0, where the selection is all the non-zeros, on the device as on the host."""
    from mucsc.codec.wire import sparse

    x = _data(kind, 20_000, np.float32, seed=3)
    got = torch_selection.top_k_positions(torch.from_numpy(x), 4000)
    assert got is None if kind == "few" else np.array_equal(got, sparse.top_k(x, 4000))
    got = mucsc.encode(torch.from_numpy(x), "bmucsc", keep=0.2, seed=1)
    monkeypatch.setattr(kernels, "TORCH", False)
    assert got == mucsc.encode(x, "bmucsc", keep=0.2, seed=1)


def test_bmucsc_device_reductions_give_the_same_bytes(torch_backend_on, monkeypatch):
    """On a GPU the rest's float64 sum is taken on the device in numpy's pairwise order
    (``pairwise_sum64``): run that branch here and check the message is the host's, byte for byte."""
    x = _data("t3", 100_003, np.float32, seed=5)
    monkeypatch.setattr(ordered_sum, "host_sums", lambda t: False)
    dev = mucsc.encode(torch.from_numpy(x), "bmucsc", seed=2, compress="off")
    monkeypatch.setattr(kernels, "TORCH", False)
    assert dev == mucsc.encode(x, "bmucsc", seed=2, compress="off")


def test_level_gap_beyond_float32_falls_back_to_the_reference(torch_backend_on, monkeypatch):
    x = np.array([-1.8e38, 1.8e38, 0.0, 1e37] * 3, np.float32)
    c = quantize.wire_centroids(np.array([-1.8e38, 1.8e38]), x, np.float32)
    assert not torch_rounding.round_supported(torch.from_numpy(x), c)
    got = mucsc.encode(torch.from_numpy(x), "mucsc", z=2, seed=0)
    monkeypatch.setattr(kernels, "TORCH", False)
    assert got == mucsc.encode(x, "mucsc", z=2, seed=0)


def test_decode_on_a_device_equals_the_host_decode():
    sd = {"w": torch.randn(64, 33), "bf": torch.randn(9).bfloat16(), "i": torch.arange(4)}
    for codec in ("mucsc", "bmucsc", "fp16"):
        blob = mucsc.encode(sd, codec, seed=1, shared=False)
        host = mucsc.decode(blob, as_torch=True)
        dev = mucsc.decode(blob, as_torch=True, device="cpu")
        for k in host:
            assert host[k].dtype == dev[k].dtype and torch.equal(host[k], dev[k]), (codec, k)


@pytest.mark.parametrize("tamper", ["padding", "id_range", "length"])
def test_device_decode_validates_like_the_host_decode(tamper):
    # 10 elements, 3 centroids, 2-bit ids: 20 bits in 3 bytes, the last 4 bits padding
    blob = bytearray(mucsc.encode(np.linspace(-1, 1, 10, dtype="f4"), "mucsc", z=3, compress="off"))
    pos, tag, stored, _ = next(s for s in section_offsets(bytes(blob)) if s[1] == "IDS_")
    data = pos + fmt.SECTION.size
    if tamper == "padding":
        blob[data + stored - 1] |= 0x80
    elif tamper == "id_range":
        blob[data] |= 0x03  # id 3 with 3 centroids
    else:
        struct.pack_into("<QQ", blob, pos + 16, stored - 1, stored - 1)
    bad = recrc(blob)
    with pytest.raises(mucsc.MucscError) as host:
        mucsc.decode(bad, as_torch=True)
    with pytest.raises(type(host.value)):
        mucsc.decode(bad, as_torch=True, device="cpu")


def test_device_argument_errors():
    blob = mucsc.encode(np.ones(3, "f4"))
    with pytest.raises(mucsc.ParameterError, match="as_torch"):
        mucsc.decode(blob, device="cpu")
    with pytest.raises(mucsc.ParameterError, match="not a torch device"):
        mucsc.decode(blob, as_torch=True, device="no-such-device")
    if not CUDA:
        with pytest.raises(mucsc.ParameterError, match="CUDA is not available"):
            mucsc.decode(blob, as_torch=True, device="cuda")


@pytest.mark.skipif(not CUDA, reason="no CUDA device on this machine")
def test_cuda_tensor_encodes_to_the_same_bytes_and_decodes_on_the_gpu():
    x = torch.randn(1_000_003, generator=torch.Generator().manual_seed(0))
    want = mucsc.encode(x, "mucsc", z=16, seed=4)
    assert mucsc.encode(x.cuda(), "mucsc", z=16, seed=4) == want
    back = mucsc.decode(want, as_torch=True, device="cuda")
    assert back.is_cuda and torch.equal(back.cpu(), mucsc.decode(want, as_torch=True))


@pytest.mark.parametrize("codec,params", [("signsgd", {}), ("topk", {"keep": 0.05}), ("stc", {}),
                                          ("dgc", {"momentum": 0.9, "clip_norm": 5.0}), ("bmucsc", {}),
                                          ("fp16", {})])
def test_compressor_state_stays_on_the_device_with_the_same_bytes(torch_backend_on, monkeypatch, codec, params):
    g = torch.Generator().manual_seed(0)
    updates = [{"w": torch.randn(120, 30, generator=g), "b": torch.randn(30, generator=g)} for _ in range(3)]
    dev = mucsc.Compressor(codec, seed=3, **params)
    got = [dev.compress(u) for u in updates]
    state = dev.memory.tables
    assert all(torch_backend_is_tensor(v) for t in state.values() for v in t.values())
    saved = dev.state_dict()  # plain numpy, loadable anywhere
    assert all(isinstance(v, np.ndarray) for t in saved["memory"].values() for v in t.values())
    monkeypatch.setattr(kernels, "TORCH", False)
    hostc = mucsc.Compressor(codec, seed=3, **params)
    assert got == [hostc.compress(u) for u in updates]
    monkeypatch.setattr(kernels, "TORCH", True)
    restored = mucsc.Compressor(codec, seed=3, **params)
    restored.load_state_dict(saved)
    assert restored.compress(updates[0]) == dev.compress(updates[0])


def torch_backend_is_tensor(v) -> bool:
    return is_torch_tensor(v)


# ---- the other encoders' device paths: fp16 / none, signsgd, the top-k family ------------------------

SUM_SIZES = [0, 1, 7, 8, 9, 127, 128, 129, 135, 1000, 8191, 8192, 8193, 20_001, 100_003]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", SUM_SIZES)
def test_pairwise_sum64_is_numpys_sum_bit_for_bit(dtype, n):
    # magnitudes spread over ~20 decades: any other summation order gives another float64
    g = np.random.default_rng(n)
    x = (g.standard_t(1, n) * np.exp(g.normal(0, 8, n))).astype(dtype)
    for a in (x, np.abs(x)):
        want = a.sum(dtype=np.float64)
        got = ordered_sum.pairwise_sum64(torch.from_numpy(a))
        assert got == want and np.signbit(got) == np.signbit(want), (n, dtype)


def test_pairwise_sum64_follows_the_buffer_size_and_signed_zeros():
    x = (np.random.default_rng(1).standard_t(1, 30_001) * 1e6).astype(np.float32)
    old = np.getbufsize()
    try:
        for size in (4096, 5008):  # numpy sums float32 data a buffer at a time; 5008: an uneven tree
            np.setbufsize(size)
            assert ordered_sum.pairwise_sum64(torch.from_numpy(x)) == x.sum(dtype=np.float64), size
    finally:
        np.setbufsize(old)
    for n in (3, 9, 200, 9000):
        for dtype in (np.float32, np.float64):
            a = np.full(n, -0.0, dtype)
            assert np.signbit(ordered_sum.pairwise_sum64(torch.from_numpy(a))) == np.signbit(a.sum(dtype=np.float64))


def test_to_float16_rounds_once_like_numpy():
    g = np.random.default_rng(2)
    tie = 1 + 2.0**-11  # halfway between two float16 values: double rounding via float32 would hit it
    special = [tie + 2.0**-40, tie - 2.0**-40, -(tie + 2.0**-40), tie, 1 + 3 * 2.0**-11, 65504.0, -65504.0,
               0.0, -0.0, 2.0**-25, 2.0**-25 + 1e-30, -(2.0**-25 + 1e-30), 3 * 2.0**-26, 1e-300, 6.1e-5]
    x = np.concatenate([g.normal(size=20_000) * 10.0 ** g.integers(-9, 5, 20_000), special])
    for dtype in (np.float32, np.float64):
        xx = x.astype(dtype)
        got = elementwise.to_float16(torch.from_numpy(xx)).numpy()
        assert np.array_equal(got.view(np.uint16), xx.astype(np.float16).view(np.uint16)), dtype


OTHER_CODECS = [("fp16", {}), ("none", {}), ("signsgd", {}), ("signsgd", {"scale": "none"}),
                ("topk", {"keep": 0.05}), ("topk", {"keep": 1.0}), ("dgc", {"positions": "paper"}),
                ("stc", {}), ("stc", {"positions": "bitmap", "keep": 0.3})]


def _with_zeros(kind: str, n: int, dtype, seed: int) -> np.ndarray:
    x = _data(kind, n, dtype, seed)
    x[::7] = 0  # exact zeros: signSGD sends them as +, the top-k family never selects them
    if n > 3:
        x[3] = -0.0
    return x


@pytest.mark.parametrize("device_sums", [False, True])
@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
@pytest.mark.parametrize("codec,params", OTHER_CODECS)
def test_other_codecs_byte_identical(torch_backend_on, monkeypatch, codec, params, dtype, device_sums):
    """The device paths give the host's bytes; ``device_sums`` runs the float64 scale sums with the
    GPU's algorithm (numpy's order rebuilt as tensor operations) instead of numpy on the CPU view."""
    if device_sums:
        monkeypatch.setattr(ordered_sum, "host_sums", lambda t: False)
    for n in (1, 7, 1001, 70_001):
        x = _with_zeros("t3", n, dtype, seed=n)
        got = mucsc.encode(torch.from_numpy(x), codec, seed=5, **params)
        from_numpy = mucsc.encode(x, codec, seed=5, **params)  # MUCSC_BACKEND=torch takes arrays too
        want = _host_encode(monkeypatch, x, codec, seed=5, **params)
        assert got == want and from_numpy == want, (codec, params, dtype, n)
        host = mucsc.decode(want, as_torch=True)
        dev = mucsc.decode(want, as_torch=True, device="cpu")
        assert host.dtype == dev.dtype and torch.equal(host, dev), (codec, dtype, n)
        assert torch.equal(torch.signbit(host), torch.signbit(dev))  # -mu and -0.0 alike


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_bmucsc_device_mean_is_the_host_mean(torch_backend_on, monkeypatch, dtype):
    """The rest's float64 sum taken as a GPU takes it (numpy's order rebuilt as tensor operations):
    every byte equals the host encoder's, the mean's float32 included."""
    monkeypatch.setattr(ordered_sum, "host_sums", lambda t: False)
    for n in (7, 1001, 100_003):
        x = _with_zeros("t3", n, dtype, seed=n)
        for keep in (0.01, 0.3, 1.0):
            got = mucsc.encode(torch.from_numpy(x), "bmucsc", keep=keep, seed=2)
            want = _host_encode(monkeypatch, x, "bmucsc", keep=keep, seed=2)
            assert got == want, (dtype, n, keep)
            host = mucsc.decode(want, as_torch=True)
            dev = mucsc.decode(want, as_torch=True, device="cpu")  # the scatter over the mean
            assert host.dtype == dev.dtype and torch.equal(host, dev), (dtype, n, keep)


@pytest.mark.parametrize("params", [{"id_coding": "rans"}, {"z": 3, "id_packing": "tight"}, {"keep": 1.0}])
def test_bmucsc_device_decode_equals_the_host_decode(params):
    x = _with_zeros("t3", 20_001, "float64", seed=9)
    blob = mucsc.encode(x, "bmucsc", seed=1, **params)
    host = mucsc.decode(blob, as_torch=True)
    dev = mucsc.decode(blob, as_torch=True, device="cpu")
    assert host.dtype == dev.dtype and torch.equal(host, dev)


@pytest.mark.parametrize("codec", ["topk", "stc", "dgc"])
def test_top_k_ties_at_the_kth_magnitude_take_the_host_selection(torch_backend_on, monkeypatch, codec):
    x = _data("few", 10_001, np.float32, seed=4)  # three values: ties everywhere
    assert torch_selection.top_k_positions(torch.from_numpy(x), 1000) is None
    got = mucsc.encode(torch.from_numpy(x), codec, keep=0.1, seed=1)
    monkeypatch.setattr(kernels, "TORCH", False)
    assert got == mucsc.encode(x, codec, keep=0.1, seed=1)


def test_top_k_positions_is_the_host_selection():
    from mucsc.codec.wire import sparse

    x = _with_zeros("gauss", 5003, np.float64, seed=6)
    for k in (1, 17, 4000, 5003, 6000):  # all non-zeros once k reaches n: top_k never sends a zero
        got = torch_selection.top_k_positions(torch.from_numpy(x), k)
        assert got is not None and np.array_equal(got, sparse.top_k(x, min(k, x.size))), k


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_kth_largest_abs_is_the_partition_value(dtype):
    rng = np.random.default_rng(11)
    x = (rng.standard_t(3, 20_011) * 10.0 ** rng.integers(-6, 4, 20_011)).astype(dtype)
    x[:50] = np.finfo(dtype).tiny / 4  # subnormals
    x[50:60] = np.finfo(dtype).max
    x[60:3000] = 0.0
    x[3000:3100] = x[3100]  # a run of ties
    a = np.abs(x)
    for k in (1, 2, 10, 11, 97, 5000, 17_000, 20_010):
        t, tied, need = torch_selection.kth_largest_abs(torch.from_numpy(a), k)
        want = np.partition(a, a.size - k)[a.size - k]
        assert t == want and tied == int((a == want).sum()), (k, t, want)
        assert need == k - int((a > want).sum()), k


@pytest.mark.parametrize("codec,params", [("fp16", {}), ("signsgd", {}), ("stc", {}), ("topk", {})])
def test_other_codecs_stats_match_the_host(torch_backend_on, monkeypatch, codec, params):
    x = _with_zeros("t3", 4099, "float32", seed=8)
    _, dev = mucsc.encode_with_stats(torch.from_numpy(x), codec, seed=1, **params)
    monkeypatch.setattr(kernels, "TORCH", False)
    _, host = mucsc.encode_with_stats(x, codec, seed=1, **params)
    # the host sums x.x in float32 for float32 groups (numpy's dot), the device in float64
    assert dev.groups[0].stats["J"] == pytest.approx(host.groups[0].stats["J"], rel=1e-6)
    assert dev.tensors[0].rel_error == host.tensors[0].rel_error


@pytest.mark.parametrize("codec,tamper", [("signsgd", "padding"), ("fp16", "inf"), ("none", "inf"),
                                          ("stc", "padding"), ("topk", "inf"), ("bmucsc", "inf")])
def test_other_device_decoders_validate_like_the_host(codec, tamper):
    x = np.linspace(-1, 1, 13, dtype="f4")
    keep = {"keep": 0.5} if codec in ("stc", "topk", "bmucsc") else {}
    blob = bytearray(mucsc.encode(x, codec, compress="off", **keep))
    tag = {"signsgd": "SIGN", "stc": "SIGN", "fp16": "VALS", "none": "VALS", "topk": "VALS", "bmucsc": "SCAL"}[codec]
    pos, _, stored, _ = next(s for s in section_offsets(bytes(blob)) if s[1] == tag)
    data = pos + fmt.SECTION.size
    if tamper == "padding":
        blob[data + stored - 1] |= 0x80  # 13 or 7 bits: the top bit of the last byte is padding
    elif codec == "fp16":
        blob[data:data + 2] = np.array([np.inf], "<f2").tobytes()
    else:
        blob[data:data + 4] = np.array([np.inf], "<f4").tobytes()
    bad = recrc(blob)
    with pytest.raises(mucsc.MucscError) as host:
        mucsc.decode(bad, as_torch=True)
    with pytest.raises(type(host.value)):
        mucsc.decode(bad, as_torch=True, device="cpu")


def test_other_codecs_stay_torch_free():
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "MUCSC_BACKEND"}  # the default backend
    code = ("import sys, numpy as np, mucsc; "
            "[mucsc.decode(mucsc.encode(np.ones(9, 'f4'), c)) "
            " for c in ('fp16', 'none', 'signsgd', 'topk', 'stc', 'dgc', 'bmucsc')]; "
            "assert 'torch' not in sys.modules and 'triton' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, env=env)


# ---- the message's host side: payloads left on the device, the CRC-32 computed there ----------------

CRC_LENGTHS = (0, 1, 2, 63, 64, 65, 255, 256, 257, 1023, 1024, 1025, 64 * 37 + 11, 100_003)


@pytest.mark.parametrize("batch", [crc.CRC_BATCH, 256, 300])
def test_device_crc32_equals_zlib(monkeypatch, batch):
    """The CRC-32 in parts (per-position byte tables, an XOR tree, then the blocks joined by
    shifting) is zlib's for empty, one-byte and odd lengths, around block and batch boundaries,
    continued from a running CRC; no batch holds more than CRC_BATCH bytes."""
    import zlib

    monkeypatch.setattr(crc, "CRC_BATCH", batch)
    seen = []
    registers = crc._block_registers
    monkeypatch.setattr(crc, "_block_registers", lambda b, *a: seen.append(b.numel()) or registers(b, *a))
    for n in CRC_LENGTHS + (batch - 1, batch, batch + 1, 3 * batch + 64 + 5):
        a = np.random.default_rng(n).integers(0, 256, n, dtype=np.uint8)
        t = torch.from_numpy(a)
        assert crc.crc32(t) == zlib.crc32(a), n
        assert crc.crc32(t, 0xDEADBEEF) == zlib.crc32(a, 0xDEADBEEF), n
        assert crc.crc32_finish(int(crc.crc32_register(t)), n) == zlib.crc32(a), n
    assert max(seen) <= max(batch, crc.CRC_BLOCK)
    x = torch.linspace(-3, 3, 1001, dtype=torch.float64)[::3].half()  # raw bytes of a strided view
    assert crc.crc32(x) == zlib.crc32(x.contiguous().numpy().tobytes())


@pytest.mark.parametrize("device_crc", [False, True])
@pytest.mark.parametrize("level", [None, 3])
@pytest.mark.parametrize("threads", [1, 2])
def test_device_payload_writes_the_host_bytes(monkeypatch, device_crc, level, threads):
    """A DeviceBytes payload goes through the writer into the same message as its host bytes; its
    CRC comes from the device when asked and the payload is not compressed (a compressed one is
    checksummed as stored, on the host)."""
    from mucsc.codec import parallel

    registers = []
    register = crc.crc32_register
    monkeypatch.setattr(crc, "crc32_register", lambda t: registers.append(t.numel()) or register(t))
    header = fmt.Header((), ())
    data = [np.random.default_rng(n).integers(0, 4, n, dtype=np.uint8) for n in (0, 1, 4099, 300_001)]
    with parallel.using(threads):
        want = fmt.write_message(header, [(0, f"D{i:03}", d, True) for i, d in enumerate(data)],
                                 zstd_level=level)
        lazy = [torch_transfer.DeviceBytes(torch.from_numpy(d), device_crc=device_crc) for d in data]
        got = fmt.write_message(header, [(0, f"D{i:03}", p, True) for i, p in enumerate(lazy)], zstd_level=level)
    assert got == want
    # a payload zstd was tried on is on the host, compressed or not; an empty part is not written at all
    assert registers == (([1, 4099, 300_001] if level is None else []) if device_crc else [])


@pytest.mark.parametrize("codec,params", [("mucsc", {"z": 16}), ("mucsc", {"z": 5, "id_packing": "tight"}),
                                          ("signsgd", {}), ("stc", {}), ("fp16", {}), ("none", {})])
@pytest.mark.parametrize("compress", ["off", "auto"])
def test_messages_with_the_device_crc_are_byte_identical(torch_backend_on, monkeypatch, codec, params, compress):
    """Payloads written with their CRC-32 computed by torch ops (what a GPU encode does) give the
    compiled kernels' bytes, authenticated messages included."""
    calls = []

    class DeviceCrc(torch_transfer.DeviceBytes):
        def __init__(self, t, device_crc=None):
            super().__init__(t, device_crc=True)
            calls.append(self.nbytes)

    monkeypatch.setattr(torch_transfer, "DeviceBytes", DeviceCrc)
    x = _data("t3", 20_011, np.float32, seed=4)
    key = {"key": bytes(range(32)), "key_id": "c1", "context": b"round-3"}
    for extra in ({}, key):
        got = mucsc.encode(torch.from_numpy(x), codec, seed=5, compress=compress, **params, **extra)
        assert got == _host_encode(monkeypatch, x, codec, seed=5, compress=compress, **params, **extra), extra
    assert calls and max(calls) > 0


# ---- on a GPU: the same checks with CUDA tensors (skipped where torch sees no CUDA device) ---------

needs_cuda = pytest.mark.skipif(not CUDA, reason="no CUDA device on this machine")


@needs_cuda
@pytest.mark.parametrize("kind", ["t3", "gauss", "zeros", "few"])
@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_cuda_messages_byte_identical(kind, dtype):
    """CUDA tensor -> the compiled kernels' bytes, for Z = 2..300 and odd sizes on both sides of the
    solver's full-sort limit (so the device's subsample + exact-tails summary is exercised), and the
    message decodes on the GPU to the host decode's values."""
    for n in (1, 7, 1001, centroids.FULL_SORT_MAX + 4099):
        x = _data(kind, n, dtype, seed=n)
        xd = torch.from_numpy(x).cuda()
        for z in (2, 3, 16, 300):
            want = mucsc.encode(x, "mucsc", z=z, seed=11)
            assert mucsc.encode(xd, "mucsc", z=z, seed=11) == want, (kind, dtype, n, z)
        back = mucsc.decode(want, as_torch=True, device="cuda")
        assert back.is_cuda and torch.equal(back.cpu(), mucsc.decode(want, as_torch=True))


@needs_cuda
@pytest.mark.parametrize("codec,params", [("mucsc", {"z": 8}), ("mucsc", {"z": 4, "id_packing": "tight"}),
                                          ("bmucsc", {"keep": 0.05}), ("qsgd", {}), ("topk", {}),
                                          ("signsgd", {}), ("fp16", {}), ("none", {}), ("stc", {}),
                                          ("dgc", {"positions": "paper"})])
def test_cuda_state_dicts(codec, params):
    """Every codec takes a state_dict of CUDA tensors: the bytes are the host's (B-MUCSC's float64
    mean too: ``pairwise_sum64``) and the decode onto the GPU equals the host decode."""
    g = torch.Generator().manual_seed(0)
    sd = {"w": torch.randn(1230, 45, generator=g), "b": torch.zeros(7), "h": torch.randn(51, generator=g).half(),
          "d": torch.randn(17, generator=g).double(), "step": torch.arange(3)}
    host = mucsc.encode(sd, codec, seed=2, compress="off", **params)
    got = mucsc.encode({k: v.cuda() for k, v in sd.items()}, codec, seed=2, compress="off", **params)
    a, b = mucsc.decode(host, as_torch=True), mucsc.decode(got, as_torch=True, device="cuda")
    assert got == host
    for k in a:
        assert b[k].is_cuda and a[k].dtype == b[k].dtype and torch.equal(b[k].cpu(), a[k]), k


@needs_cuda
@pytest.mark.parametrize("codec,params", [("signsgd", {}), ("topk", {"keep": 0.05}), ("stc", {}),
                                          ("dgc", {"momentum": 0.9, "clip_norm": 5.0}), ("fp16", {})])
def test_cuda_compressor_state_stays_on_the_gpu(codec, params):
    g = torch.Generator().manual_seed(0)
    updates = [{"w": torch.randn(120, 30, generator=g), "b": torch.randn(30, generator=g)} for _ in range(3)]
    dev = mucsc.Compressor(codec, seed=3, **params)
    got = [dev.compress({k: v.cuda() for k, v in u.items()}) for u in updates]
    assert all(v.is_cuda for t in dev.memory.tables.values() for v in t.values())
    hostc = mucsc.Compressor(codec, seed=3, **params)
    assert got == [hostc.compress(u) for u in updates]


@needs_cuda
@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
@pytest.mark.parametrize("codec,params", OTHER_CODECS)
def test_cuda_other_codecs_byte_identical(codec, params, dtype):
    """fp16/none, signsgd and the top-k family on CUDA tensors: the host's bytes (the scales' float64
    sums in numpy's order on the GPU), and the decode onto the GPU equals the host decode."""
    for n in (1, 7, 1001, 70_001):
        x = _with_zeros("t3", n, dtype, seed=n)
        want = mucsc.encode(x, codec, seed=5, **params)
        assert mucsc.encode(torch.from_numpy(x).cuda(), codec, seed=5, **params) == want, (codec, params, dtype, n)
        back = mucsc.decode(want, as_torch=True, device="cuda")
        host = mucsc.decode(want, as_torch=True)
        assert back.is_cuda and torch.equal(back.cpu(), host) and torch.equal(back.cpu().signbit(), host.signbit())


@needs_cuda
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_cuda_pairwise_sum64_and_float16(dtype):
    for n in SUM_SIZES + [3_000_017]:
        g = np.random.default_rng(n)
        a = np.abs((g.standard_t(1, n) * np.exp(g.normal(0, 8, n))).astype(dtype))
        assert ordered_sum.pairwise_sum64(torch.from_numpy(a).cuda()) == a.sum(dtype=np.float64), n
    x = (np.random.default_rng(3).normal(size=100_000) * 1e3).astype(dtype)
    x[:3] = [1 + 2.0**-11 + 2.0**-40, -(1 + 2.0**-11 + 2.0**-40), 2.0**-25 + 1e-30] if dtype == np.float64 else 1.0
    got = elementwise.to_float16(torch.from_numpy(x).cuda()).cpu().numpy()
    assert np.array_equal(got.view(np.uint16), x.astype(np.float16).view(np.uint16))


@needs_cuda
@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_cuda_bmucsc_is_byte_identical(dtype):
    """B-MUCSC on CUDA tensors, the rest's mean included (its float64 sum in numpy's order)."""
    for n in (7, 1001, 100_003):
        x = _with_zeros("t3", n, dtype, seed=n)
        for keep in (0.01, 0.3, 1.0):
            want = mucsc.encode(x, "bmucsc", keep=keep, seed=2)
            assert mucsc.encode(torch.from_numpy(x).cuda(), "bmucsc", keep=keep, seed=2) == want, (dtype, n, keep)


@needs_cuda
@pytest.mark.parametrize("codec", ["mucsc", "signsgd", "fp16", "topk"])
def test_cuda_groups_side_by_side_on_threads(codec):
    """Several small groups encoded and decoded on two threads at once share the pinned staging
    buffer of the host <-> device copies (one copy at a time): the bytes and values stay the host's."""
    g = torch.Generator().manual_seed(1)
    sd = {f"t{i}": torch.randn(100_000 + i, generator=g) for i in range(8)}
    want = mucsc.encode(sd, codec, seed=3, shared=False)
    for _ in range(3):
        assert mucsc.encode({k: v.cuda() for k, v in sd.items()}, codec, seed=3, shared=False, threads=2) == want
        back = mucsc.decode(want, as_torch=True, device="cuda", threads=2)
        host = mucsc.decode(want, as_torch=True)
        assert all(torch.equal(back[k].cpu(), host[k]) for k in host)


@needs_cuda
def test_cuda_crc32_and_staged_copies(monkeypatch):
    """On the GPU: the device CRC-32 is zlib's; a payload crosses through the pinned buffer's two
    halves in turn (a small buffer: many chunks) into the message, with the device CRC or the host's
    CRC of each chunk, and the message equals the host bytes' message."""
    import zlib

    from mucsc.codec import parallel

    for n in CRC_LENGTHS:
        a = np.random.default_rng(n).integers(0, 256, n, dtype=np.uint8)
        assert crc.crc32(torch.from_numpy(a).cuda()) == zlib.crc32(a), n
    monkeypatch.setattr(torch_transfer, "STAGE", 1 << 12)
    monkeypatch.setattr(torch_transfer, "_stages", {})
    a = np.random.default_rng(0).integers(0, 256, 10 * 4096 + 17, dtype=np.uint8)
    out = np.zeros_like(a)
    assert torch_transfer.copy_out(torch.from_numpy(a).cuda(), out, 7) == zlib.crc32(a, 7) and np.array_equal(out, a)
    assert np.array_equal(torch_transfer.to_host(torch.from_numpy(a).cuda()), a)
    header = fmt.Header((), ())
    want = fmt.write_message(header, [(0, "DATA", a, True)], zstd_level=None)
    for device_crc in (False, True):
        for threads in (1, 2):
            with parallel.using(threads):
                p = torch_transfer.DeviceBytes(torch.from_numpy(a).cuda(), device_crc=device_crc)
                assert fmt.write_message(header, [(0, "DATA", p, True)], zstd_level=None) == want
