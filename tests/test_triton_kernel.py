"""The fused Triton rounding + packing kernel (mucsc/codec/backends/triton_round.py) writes the reference's
bytes: FORMAT.md 4.3's stream and decision, 4.2's packing, for every ID width, data dtype, size,
key and stream offset; its self-check falls back to the torch path with one warning.  Runs the
kernel in Triton's interpreter (TRITON_INTERPRET=1) on CPU tensors; skipped without triton."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import mucsc
from mucsc.codec import kernels
from mucsc.codec.numerics import quantize
from mucsc.codec.wire import bitpack

torch = pytest.importorskip("torch")
pytest.importorskip("triton")
from mucsc.codec.backends import random_stream, torch_rounding  # noqa: E402  (after the skips)
from mucsc.codec.backends import triton_round as tr  # noqa: E402
from mucsc.errors import ParameterError  # noqa: E402
import tritontools  # noqa: E402


@pytest.fixture
def interpreter(monkeypatch):
    """The kernel on CPU tensors through Triton's interpreter (CPU data encoded on the torch backend,
    as MUCSC_BACKEND=torch selects).  Variants that passed the self-check stay checked."""
    monkeypatch.setattr(kernels, "TORCH", True)
    yield from tritontools.interpreter(monkeypatch, tr, _probe)


def _probe() -> bool:
    """The kernel's self-check for one variant on CPU tensors (float32 data, float32 decision)."""
    return tr._self_check(torch.device("cpu"), ("cpu", "torch.float32", True, 4))


@pytest.fixture
def fresh():
    """The self-check forgotten (it runs again), and forgotten again afterwards."""
    tr.reset()
    yield
    tr.reset()


class KeyRng:
    """A generator whose only draw (the rounding key, quantize.draw_key) is ``key``."""

    def __init__(self, key: int):
        self.key = key

    def integers(self, *args, **kwargs):
        return np.uint64(self.key)


def _levels(z: int, seed: int, f64: bool = False) -> np.ndarray:
    """z sorted distinct centroids, exact in float32 (else nudged off the float32 grid)."""
    g = np.random.default_rng(seed)
    c = np.unique(g.normal(size=3 * z).astype(np.float32))[:z].astype(np.float64)
    return c + np.linspace(0, 1e-9, c.size) if f64 else c


def _reference(x: np.ndarray, c: np.ndarray, key: int, width: int) -> bytes:
    """The compiled kernels' (or the numpy path's) ids, packed by bitpack."""
    return bitpack.pack(quantize.stochastic_round(x, c, KeyRng(key)), width)


def _data(n: int, c: np.ndarray, dtype, seed: int) -> np.ndarray:
    g = np.random.default_rng(seed)
    x = g.uniform(c[0], c[-1], n)
    x[: n // 5] = g.choice(c, n // 5)  # on the centroids
    return np.clip(x.astype(dtype), c[0], c[-1]).astype(dtype)


# Z = 2..300 at every id width up to 9 bits (powers of two and one past them), and 10 and 16 bits
@pytest.mark.parametrize("z", [2, 3, 5, 8, 16, 17, 33, 65, 128, 256, 257, 300, 1000, 40000])
def test_bytes_equal_the_compiled_kernels_at_every_width(interpreter, z):
    width = (z - 1).bit_length()
    for dtype, f64, n in ((np.float32, False, 2063), (np.float32, True, 13), (np.float64, False, 7)):
        c = _levels(z, z, f64)
        x = _data(n, c, dtype, z + n)
        key = quantize.draw_key(np.random.default_rng([z, n]))
        got = tr.launch(torch.from_numpy(x), c, key, width).numpy().tobytes()
        assert got == _reference(x, c, key, width), (dtype, f64, n)


@pytest.mark.parametrize("key", [0, 1, 12345, 2**63, 2**64 - 1])
def test_keys_and_stream_offsets(interpreter, key):
    c = _levels(11, 4)
    x = _data(1001, c, np.float32, 5)
    full = _reference(x, c, key, 4)
    for start in (0, 8, 16, 1000):
        got = tr.launch(torch.from_numpy(x[start:]), c, key, 4, start).numpy().tobytes()
        assert got == full[start * 4 // 8:], start
    x64 = x.astype(np.float64)
    full = _reference(x64, c, key, 7)
    assert tr.launch(torch.from_numpy(x64[24:]), c, key, 7, 24).numpy().tobytes() == full[24 * 7 // 8:]


@pytest.mark.parametrize("dtype,f32", [(np.float32, True), (np.float64, False)])
def test_the_decision_is_strict(interpreter, dtype, f32):
    # x = c[0] + u * (c[1] - c[0]) exactly, for each element's own u: u * gap < x - c[0] is false,
    # so every id is 0 (a <= would send them up)
    c = np.array([0.0, 1.0])
    x = random_stream.uniforms(99, 0, 1001, f32, "cpu").numpy().astype(dtype)
    got = tr.launch(torch.from_numpy(x), c, 99, 1).numpy().tobytes()
    assert got == _reference(x, c, 99, 1) == bytes(126)


def test_padding_bits_are_zero_and_sizes_exact(interpreter):
    c = np.array([-1.0, 0.0, 1.0])
    x = np.ones(13, np.float32)  # on the top centroid: every id is 2 = 0b10
    out = tr.launch(torch.from_numpy(x), c, 3, 2).numpy()
    assert out.tolist() == [0b10101010] * 3 + [0b10]  # 26 bits: the last byte's top 6 bits stay 0
    assert tr.launch(torch.zeros(0), c, 3, 2).numel() == 0


@pytest.mark.parametrize("xdtype,f32", [("float32", True), ("float32", False), ("float64", False)])
def test_the_self_check_probes_pass(interpreter, xdtype, f32):
    for span in (2, 4, 8, 16):
        cases = tr.probes(xdtype, f32, span)
        assert {w for *_, w, _ in cases} == {w for w in range(1, 17) if tr._span(w) == span}
        assert all(torch_rounding.work_float32(torch.from_numpy(x), c) == f32 for x, c, *_ in cases)  # the variant's
        assert tr._self_check(torch.device("cpu"), ("cpu", f"torch.{xdtype}", f32, span))
    assert tr.disabled_reason() is None


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
@pytest.mark.parametrize("z", [7, 300])
def test_messages_through_the_kernel_equal_the_host_path(interpreter, monkeypatch, dtype, z):
    sizes = []
    launch = tr.launch
    monkeypatch.setattr(tr, "launch", lambda x, *a, **k: sizes.append(x.numel()) or launch(x, *a, **k))
    x = np.random.default_rng(z).standard_t(3, 1001).astype(dtype)
    p = {"z": z, "solver": "uniform" if z > 16 else "optimal"}  # (the optimal DP at Z = 300 takes longer)
    assert mucsc.encode(torch.from_numpy(x), "mucsc", seed=2, **p) == mucsc.encode(x, "mucsc", seed=2, **p)
    sizes.clear()  # the default may lane-code the IDs (Z = 300: one symbol per ID, no fused packing)
    p["id_coding"] = "packed"
    assert mucsc.encode(torch.from_numpy(x), "mucsc", seed=2, **p) == mucsc.encode(x, "mucsc", seed=2, **p)
    assert sizes[-1] == x.size  # the kernel wrote the message's IDs (after any probes)
    if z == 7:
        assert mucsc.encode(torch.from_numpy(x), "bmucsc", z=z, seed=2) == mucsc.encode(x, "bmucsc", z=z, seed=2)


def test_groups_on_threads_share_one_first_use(interpreter, fresh, monkeypatch):
    # per-tensor groups encoded side by side on two threads: one self-check, the same bytes
    checks = []
    real = tr._self_check
    monkeypatch.setattr(tr, "_self_check", lambda *a: checks.append(a[1]) or real(*a))
    g = torch.Generator().manual_seed(1)
    sd = {f"t{i}": torch.randn(500 + i, generator=g) for i in range(6)}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the kernel must not be disabled on the way (e.g. by concurrent launches)
        got = mucsc.encode(sd, "mucsc", seed=3, shared=False, threads=2)
    monkeypatch.setattr(kernels, "TORCH", False)
    assert got == mucsc.encode(sd, "mucsc", seed=3, shared=False)
    assert checks == [("cpu", "torch.float32", True, 4)]


def test_rans_and_aligned_packing_take_the_ids(interpreter, monkeypatch):
    x = np.random.default_rng(1).normal(size=2001).astype(np.float32)
    for params in ({"z": 8, "id_coding": "rans"}, {"z": 8, "id_packing": "aligned"}):
        assert mucsc.encode(torch.from_numpy(x), "mucsc", seed=3, **params) == mucsc.encode(x, "mucsc", seed=3, **params)


def test_a_mismatch_disables_the_kernel_with_one_warning(interpreter, fresh, monkeypatch):
    real = tr.launch

    def wrong(*args, **kwargs):  # one flipped bit
        out = real(*args, **kwargs)
        out[0] ^= 1
        return out

    monkeypatch.setattr(tr, "launch", wrong)
    x = np.random.default_rng(2).normal(size=999).astype(np.float32)
    with pytest.warns(RuntimeWarning, match="bytes differ from the torch path"):
        blob = mucsc.encode(torch.from_numpy(x), "mucsc", z=16, seed=1)
    assert blob == mucsc.encode(x, "mucsc", z=16, seed=1)
    assert "differ" in tr.disabled_reason()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no second warning: the kernel stays off in this process
        assert mucsc.encode(torch.from_numpy(x), "mucsc", z=5, seed=1) == mucsc.encode(x, "mucsc", z=5, seed=1)


def test_a_compile_failure_disables_the_kernel(interpreter, fresh, monkeypatch):
    def broken():
        raise RuntimeError("no compiler here")

    monkeypatch.setattr(tr, "_kernel", broken)
    x = np.random.default_rng(3).normal(size=100).astype(np.float64)
    with pytest.warns(RuntimeWarning, match="RuntimeError: no compiler here"):
        assert mucsc.encode(torch.from_numpy(x), "mucsc", z=4, seed=0) == mucsc.encode(x, "mucsc", z=4, seed=0)


@pytest.mark.parametrize("setting", ["0", ""])
def test_off_and_auto_leave_cpu_tensors_to_the_torch_path(monkeypatch, setting):
    monkeypatch.setenv("MUCSC_TRITON", setting)
    monkeypatch.setattr(kernels, "TORCH", True)
    monkeypatch.setattr(tr, "launch", lambda *a, **k: pytest.fail("the kernel ran"))
    x = np.random.default_rng(4).normal(size=300).astype(np.float32)
    assert mucsc.encode(torch.from_numpy(x), "mucsc", seed=0) == mucsc.encode(x, "mucsc", seed=0)
    assert tr.round_pack(torch.from_numpy(x), np.array([-9.0, 0.0, 9.0]), 1, 2) is None


def test_a_bad_setting_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("MUCSC_TRITON", "yes")
    with pytest.raises(ParameterError, match="MUCSC_TRITON must be 0, 1 or auto"):
        tr.mode()


def test_what_the_kernel_does_not_cover_goes_to_the_torch_path(interpreter):
    t = torch.ones(16, dtype=torch.float32)
    assert tr.round_pack(t.half(), np.array([0.0, 2.0]), 1, 1) is None  # float16 data
    assert tr.round_pack(t, np.array([0.0, 2.0]), 1, 1, start=4) is None  # start not a multiple of 8
    wide = np.array([-3e38, 3e38], np.float32).astype(np.float64)
    assert tr.round_pack(t, wide, 1, 1) is None  # a gap beyond float32


def test_cpu_tensors_do_not_even_look_for_triton(monkeypatch):
    monkeypatch.delenv("MUCSC_TRITON", raising=False)
    monkeypatch.setattr(kernels, "TORCH", True)
    monkeypatch.setattr(tr, "triton_module", lambda: pytest.fail("triton was looked up for a CPU tensor"))
    x = torch.randn(100, generator=torch.Generator().manual_seed(0))
    assert mucsc.encode(x, "mucsc", seed=0) == mucsc.encode(x.numpy(), "mucsc", seed=0)


@pytest.mark.parametrize("xd,f32", [("fp32", True), ("fp32", False), ("fp64", False)])
def test_the_compiled_code_neither_fuses_nor_flushes(xd, f32):
    # compiled for sm_90 here, no GPU needed (triton ships ptxas): the decision's product and
    # difference are separate IEEE operations (FORMAT.md 4.3), subnormals are kept.
    # benchmarks/triton_sass.py checks the SASS of every variant the same way.
    import triton

    if tuple(int(v) for v in triton.__version__.split(".")[:2]) < (3, 5):
        pytest.skip("the compile-only API used here is triton >= 3.5's")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from mucsc.codec.backends import _triton_kernel

    cw = "fp32" if f32 else "fp64"
    sig = {"x_ptr": f"*{xd}", "c_ptr": f"*{cw}", "g_ptr": f"*{cw}", "out_ptr": "*u8", "args_ptr": "*i64",
           "F32": "constexpr", "SPAN": "constexpr", "G": "constexpr"}
    fn = triton.jit(_triton_kernel.round_pack_kernel, do_not_specialize=[0, 1, 2, 3, 4])
    src = ASTSource(fn=fn, signature=sig, constexprs={"F32": f32, "SPAN": 4, "G": tr.TILE // 32})
    ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"enable_fp_fusion": False}).asm["ptx"]
    assert f"mul.rn.{cw[:1]}{cw[2:]}" in ptx and f"sub.rn.{cw[:1]}{cw[2:]}" in ptx
    assert "fma" not in ptx and ".ftz" not in ptx


# ---- on a GPU: the compiled kernel (skipped where torch sees no CUDA device) ----------------------

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")


@needs_cuda
@pytest.mark.parametrize("xdtype,f32", [("float32", True), ("float32", False), ("float64", False)])
def test_cuda_kernel_passes_its_self_check(monkeypatch, xdtype, f32):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    for span in (2, 4, 8, 16):
        assert tr._self_check(torch.device("cuda"), ("cuda", f"torch.{xdtype}", f32, span)), tr.disabled_reason()


@needs_cuda
@pytest.mark.parametrize("z", [2, 3, 5, 16, 17, 33, 65, 256, 257, 300, 1000, 40000])
def test_cuda_bytes_equal_the_compiled_kernels(monkeypatch, z):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    width = (z - 1).bit_length()
    for dtype, f64, n in ((np.float32, False, 200_003), (np.float32, True, 70_001), (np.float64, False, 99_999)):
        c = _levels(z, z, f64)
        x = _data(n, c, dtype, z + n)
        key = quantize.draw_key(np.random.default_rng([z, n]))
        got = tr.launch(torch.from_numpy(x).cuda(), c, key, width).cpu().numpy().tobytes()
        assert got == _reference(x, c, key, width), (dtype, f64, n)


@needs_cuda
@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_cuda_messages_take_the_kernel(monkeypatch, dtype):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.delenv("MUCSC_TRITON", raising=False)  # auto: CUDA tensors take the kernel
    sizes = []
    launch = tr.launch
    monkeypatch.setattr(tr, "launch", lambda x, *a, **k: sizes.append(x.numel()) or launch(x, *a, **k))
    x = np.random.default_rng(5).standard_t(3, 300_001).astype(dtype)
    for z in (7, 16, 300):
        assert mucsc.encode(torch.from_numpy(x).cuda(), "mucsc", z=z, seed=1) == mucsc.encode(x, "mucsc", z=z, seed=1)
        assert sizes and sizes[-1] == x.size and tr.disabled_reason() is None
