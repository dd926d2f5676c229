"""Format 1.2's lane-parallel rANS of cluster IDs (IDSL, spec/FORMAT.md 4.6): the layout, the coder's
backends (compiled, numpy, the torch loop, the Triton kernels in Triton's interpreter) writing the
same bytes, threads, the default's choice against zstd, and corrupt sections rejected."""

from __future__ import annotations

import types
import warnings

import numpy as np
import pytest

import mucsc
from mucsc.codec import kernels, parallel
from mucsc.codec.wire import bitpack
from mucsc.codec.wire import container as fmt
from mucsc.codec.wire import lanes
from mucsc.codec.wire import rans
from mucsc.errors import FormatError

pytestmark = pytest.mark.backends  # .ci/run's torch and numpy passes run it too

BACKENDS = ["numpy", "c"] if kernels.c_module() is not None else ["numpy"]


def ids_for(n, k, seed=0, conc=0.3):
    g = np.random.default_rng(seed)
    return g.choice(k, n, p=g.dirichlet(np.full(k, conc))).astype(np.uint16 if k > 256 else np.uint8)


def gauss(n, seed=0, dtype=np.float32):
    return np.random.default_rng(seed).normal(size=n).astype(dtype)


# n, k: one lane, a partial row, byte symbols of 1, 2, 4, 8 bits, one symbol per ID (w = 16, scale bits
# 16 and 22), several blocks with a partial last one
CASES = [(1, 2), (7, 2), (100, 3), (1000, 16), (4099, 16), (70000, 256), (5000, 300), (30000, 5000),
         (2 * lanes.BLOCK * 2 + 3, 16), (lanes.BLOCK * 8 + 9, 2)]


@pytest.mark.parametrize("n, k", CASES)
def test_round_trip_and_backends_agree(n, k, monkeypatch):
    ids = ids_for(n, k, seed=n)
    blobs = {}
    for backend in BACKENDS:
        monkeypatch.setattr(kernels, "BACKEND", backend)
        blobs[backend] = lanes.encode(ids, k)
        sym, w = lanes.decode_symbols(blobs[backend], n, k)
        assert w == lanes.symbol_bits(k)
        np.testing.assert_array_equal(sym, lanes.symbols(ids, k))
    assert len(set(blobs.values())) == 1  # bit-identical twins


def test_layout_is_a_function_of_the_symbol_count():
    for m in (1, 2047, 2048, 2049, lanes.BLOCK, lanes.BLOCK + 1, 5 * lanes.BLOCK + 4097):
        lay = lanes.layout(m)
        assert lay.total_lanes == lanes.lane_total(m)
        covered = np.concatenate([lay.base[j] + np.arange(lay.count[j]) * lay.stride[j] for j in range(lay.total_lanes)])
        np.testing.assert_array_equal(np.sort(covered), np.arange(m))  # every symbol in exactly one lane
        assert lay.count.max() <= lanes.LANE_SYMBOLS and (lay.lanes[:-1] == lanes.LANES).all()
    assert lanes.layout(3 * lanes.BLOCK).total_lanes == 3 * lanes.LANES


@pytest.mark.parametrize("backend", BACKENDS)
def test_threads_change_no_byte(backend, monkeypatch):
    monkeypatch.setattr(kernels, "BACKEND", backend)
    monkeypatch.setattr(lanes, "RUN_BLOCKS", 1)  # one block per task: several tasks per thread
    x = gauss(6 * lanes.BLOCK + 77, 3)
    blob = mucsc.encode(x, "mucsc", seed=1)
    assert mucsc.inspect(blob).sections[-1].tag == "IDSL"
    ref = mucsc.decode(blob)
    for t in (2, 3):
        assert mucsc.encode(x, "mucsc", seed=1, threads=t) == blob
        np.testing.assert_array_equal(mucsc.decode(blob, threads=t), ref)


def test_the_default_codes_ids_by_lanes_when_smaller():
    x = gauss(400_000, 5)
    blob = mucsc.encode(x, "mucsc")  # Z = 16
    info = mucsc.inspect(blob)
    assert info.version == "1.2" and info.groups[0].params["id_coding"] == "lanes"
    assert all(s.encoding == "raw" or s.tag == "HEAD" for s in info.sections)  # no zstd section but HEAD
    packed = mucsc.encode(x, "mucsc", id_coding="packed")
    assert len(blob) < len(packed)
    np.testing.assert_array_equal(mucsc.decode(blob), mucsc.decode(packed))  # the same rounding
    off = mucsc.encode(x, "mucsc", compress="off")  # the paper's fixed width, format 1.0
    assert mucsc.inspect(off).version == "1.0" and "id_bits" in mucsc.inspect(off).groups[0].params
    small = mucsc.encode(x[:1000], "mucsc")  # the table does not pay: 1.0 as before
    assert mucsc.inspect(small).version == "1.0"
    forced = mucsc.encode(x[:1000], "mucsc", id_coding="lanes", compress="off")
    assert mucsc.inspect(forced).version == "1.2"
    np.testing.assert_array_equal(mucsc.decode(forced), mucsc.decode(small))


def test_zstd_stays_where_it_compresses_better():
    # long runs of one value (a pruned tensor): order-0 rANS pays per ID, zstd's matches per run; the
    # packed IDs exceed EXACT_ZSTD_BYTES, so the sample decides that the full frame is computed
    from mucsc.codec.codecs import clusters

    x = gauss(1_200_000, 6)
    x[(np.arange(x.size) // 5000) % 4 != 0] = 0.0
    assert x.size // 2 > clusters.EXACT_ZSTD_BYTES
    info = mucsc.inspect(mucsc.encode(x, "mucsc"))
    assert [s.encoding for s in info.sections if s.tag == "IDS_"] == ["zstd"]
    assert info.version == "1.0"


def test_bmucsc_kept_ids_by_lanes():
    x = gauss(300_000, 7)
    blob = mucsc.encode(x, "bmucsc", keep=0.5, z=16)
    info = mucsc.inspect(blob)
    assert info.groups[0].params["id_coding"] == "lanes" and info.version == "1.2"
    ref = mucsc.encode(x, "bmucsc", keep=0.5, z=16, id_coding="packed")
    np.testing.assert_array_equal(mucsc.decode(blob), mucsc.decode(ref))


def _section(blob, tag="IDSL"):
    msg = fmt.read_message(blob)
    return bytes(next(msg.payload(s) for s in msg.sections if s.tag == tag))


@pytest.mark.parametrize("backend", BACKENDS)
def test_corrupt_sections_are_rejected(backend, monkeypatch):
    monkeypatch.setattr(kernels, "BACKEND", backend)
    n, k = 9000, 12  # 4-bit symbols, IDs 12..15 invalid
    ids = ids_for(n, k, 1)
    good = lanes.encode(ids, k)
    L = lanes.layout(lanes.symbol_count(n, 4)).total_lanes
    head = 2 + len(lanes.rans._varints(lanes.table(np.bincount(lanes.symbols(ids, k), minlength=256),
                                                    n // 2)[1]))
    first_state = head + 2 * L  # the first lane's stream: its initial state, little-endian

    def mutated(fn):
        b = bytearray(good)
        fn(b)
        return bytes(b)

    bad = {
        "stream byte": mutated(lambda b: b.__setitem__(-1, b[-1] ^ 0x41)),
        "scale bits": mutated(lambda b: b.__setitem__(0, 23)),
        "symbol width": mutated(lambda b: b.__setitem__(1, 2)),  # 2-bit symbols cannot carry 12 IDs
        "unknown width": mutated(lambda b: b.__setitem__(1, 3)),
        "table sum": mutated(lambda b: b.__setitem__(2, b[2] ^ 1)),
        "extra byte": good + b"\0",
        "lane length": mutated(lambda b: b.__setitem__(head, b[head] ^ 1)),
        "state above 2^31": mutated(lambda b: b.__setitem__(first_state + 3, b[first_state + 3] | 0x80)),
        "truncated": good[: len(good) // 2],
    }
    for what, blob in bad.items():
        with pytest.raises(FormatError):
            lanes.decode_symbols(blob, n, k)
            raise AssertionError(what)
    # a valid coding of invalid symbols: an ID >= k, non-zero padding bits (an odd count: the last
    # symbol's high nibble is padding)
    blob = mucsc.encode(gauss(n + 1, 2), "mucsc", z=k, id_coding="lanes", compress="off")
    assert fmt.read_message(blob).header.groups[0].params["centroids"] == k
    sym = lanes.symbols(ids_for(n + 1, k, 3), k)
    for at, value in ((5, 0xDD), (-1, 0xF3)):
        s = sym.copy()
        s[at] = value
        with pytest.raises(FormatError):
            mucsc.decode(_rebuild(blob, lanes.encode_symbols(s, 4, 256)))


@pytest.mark.skipif(not kernels.use_c(), reason="compiled kernels not built")
@pytest.mark.parametrize("blocks, conc", [(1, 0.3), (5, 50.0)])
def test_damaged_streams_get_the_same_verdict_from_both_coders(blocks, conc, monkeypatch):
    # random byte changes and cut lanes in the streams of full blocks and a partial one: the
    # compiled decoder (AVX2 for full blocks, else four lanes at a time while 4 bytes remain, then
    # byte by byte), and its value mode (AVX2 or scalar; with near-uniform IDs, every f <= 2^12 and 4+
    # blocks, AVX2's one-gather table), accept and reject exactly what the numpy reference does, with
    # the same symbols (values) when it accepts
    n, k = 2 * blocks * lanes.BLOCK + 5000, 16
    good = np.frombuffer(lanes.encode(ids_for(n, k, 5, conc), k), np.uint8)
    p = lanes.parse(good, n, k)
    table = np.arange(k, dtype=np.float32) - 7.5
    g = np.random.default_rng(7)
    verdicts = []
    for trial in range(40):
        b = good.copy()
        lane = int(g.integers(p.lengths.size))
        s, ln = int(p.starts[lane]), int(p.lengths[lane])
        if trial % 4 == 3:  # the lane's last bytes zeroed: it runs short of state
            b[s + ln - int(g.integers(1, 4)): s + ln] = 0
        else:
            at = s + int(g.integers(ln))
            b[at] ^= np.uint8(1 << int(g.integers(8)))
        outs = []
        for backend in ("c", "numpy"):
            monkeypatch.setattr(kernels, "BACKEND", backend)
            out = np.zeros(p.layout.m, np.uint8)
            outs.append((lanes.decode_lanes(b, p, out), out))
        assert outs[0][0] == outs[1][0]
        out = np.zeros(p.layout.m, np.uint8)  # the compiled symbols without AVX2
        assert bool(kernels.c_module().lanes_decode(b, p.f.astype(np.uint32), p.cum.astype(np.uint32), p.S,
                                                    p.layout.m, 0, p.layout.blocks, p.starts, p.lengths, out, None,
                                                    0)) == outs[0][0]
        if not outs[0][0]:
            np.testing.assert_array_equal(out, outs[1][1])
            np.testing.assert_array_equal(outs[0][1], outs[1][1])
        for simd in (1, 0):  # the value mode (AVX2 for the full block, scalar): the same verdict and IDs
            vals = np.zeros(n, np.float32)
            got = kernels.c_module().lanes_decode(b, p.f.astype(np.uint32), p.cum.astype(np.uint32), p.S, p.layout.m,
                                                  0, p.layout.blocks, p.starts, p.lengths, vals.view(np.uint8),
                                                  parallel.byte_table(table, 4).bytes, simd)
            assert (got < 0) == outs[0][0]
            if got >= 0:
                np.testing.assert_array_equal(vals, table[bitpack.unpack(outs[1][1], 4, n)])
        verdicts.append(outs[0][0])
    assert any(verdicts)


def _rebuild(blob, idsl):
    msg = fmt.read_message(blob)
    secs = [(s.group, s.tag, idsl if s.tag == "IDSL" else bytes(msg.payload(s)), False)
            for s in msg.sections if s.tag != "HEAD"]
    return fmt.write_message(msg.header, secs, zstd_level=None, minor=msg.minor)


def test_hostile_element_counts_are_refused_before_allocating():
    blob = lanes.encode(ids_for(100, 300), 300)
    with pytest.raises(FormatError, match="cannot hold"):
        lanes.decode_symbols(blob, 1 << 40, 300)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("n, k", [(5000, 16), (70000, 16), (30000, 300), (9000, 5000)])
def test_a_symbol_without_frequency_is_refused(backend, n, k, monkeypatch):
    # a table that leaves out a symbol the data has (or a u16 symbol beyond the table): an error,
    # never a stream (the compiled coder marks it in the state's bit 31, checked per block)
    monkeypatch.setattr(kernels, "BACKEND", backend)
    ids = ids_for(n, k, seed=k)
    w = lanes.symbol_bits(k)
    sym = lanes.symbols(ids, k, w)
    counts = lanes.counts_of(sym, lanes.alphabet(k, w))
    S, f = lanes.table(counts, sym.size)
    cum = np.concatenate(([0], np.cumsum(f)[:-1])).astype(np.int64)
    last = int(sym[-7])  # one symbol of the last block's last rows
    donor = int(np.argmax(np.where(np.arange(f.size) == last, 0, f)))  # another symbol takes its share
    f2 = f.copy()
    f2[donor] += f2[last]
    f2[last] = 0
    cum2 = np.concatenate(([0], np.cumsum(f2)[:-1])).astype(np.int64)
    with pytest.raises(ValueError, match="no frequency"):
        lanes.code_lanes(sym, f2, cum2, S)
    if w == lanes.WIDE:  # the table shorter than the symbols' range
        with pytest.raises((ValueError, IndexError)):
            lanes.code_lanes(sym, f[:last], cum[:last], S)
    lanes.code_lanes(sym, f, cum, S)  # the full table codes


@pytest.mark.skipif(not kernels.use_c(), reason="compiled kernels not built")
@pytest.mark.parametrize("n, k, conc", [(2 * lanes.BLOCK * 2 + 5, 16, 0.3), (lanes.BLOCK * 2, 16, 50.0),
                                        (lanes.BLOCK * 8, 2, 0.3), (lanes.BLOCK, 256, 0.05),
                                        (lanes.BLOCK * 3 + 1, 256, 5.0)])
def test_the_vector_coder_writes_the_scalar_bytes(n, k, conc, monkeypatch):
    # full byte-symbol blocks go to the AVX2 coder where the CPU has it (simd=1); simd=0 is the
    # scalar coder: the same streams as it and the numpy reference, also for tables of 9..16 scale
    # bits, for a single symbol (f = M) and for unused symbols after the last used one (their cum is
    # M: the default Z = 16 message's table, whose byte 255 is rarely used, goes to the vector coder)
    ids = ids_for(n, k, seed=n + k, conc=conc)
    sym = lanes.symbols(ids, k, lanes.symbol_bits(k))
    lay = lanes.layout(sym.size)
    C = kernels.c_module()
    for S, variant in [(16, ""), (12, ""), (9, ""), (16, "single"), (16, "capped"), (9, "capped")]:
        s = {"single": np.full(sym.size, sym[-1]), "capped": np.minimum(sym, sym.max() - 1)}.get(variant, sym)
        f = rans.normalize(lanes.counts_of(s, 256), S)
        cum = np.concatenate(([0], np.cumsum(f)[:-1]))
        got = []
        for simd in (0, 1):
            out = np.zeros(int((4 + 3 * lay.count).sum()), np.uint8)
            lens = np.zeros(lay.total_lanes, np.int64)
            used = C.lanes_encode(s, f.astype(np.uint32), cum.astype(np.uint32), S, lay.m, 0, lay.blocks, out,
                                  lens, simd)
            got.append((out[:used].tobytes(), lens.tolist()))
        monkeypatch.setattr(kernels, "BACKEND", "numpy")
        lens, streams = lanes.code_lanes(s, f, cum, S)
        monkeypatch.undo()
        assert got[0] == got[1] == (b"".join(streams), lens.tolist())


# ---- the torch backend: the vector loop and the Triton kernels -----------------------------------

torch = pytest.importorskip("torch")
from mucsc.codec.backends import torch_lanes, triton_lanes  # noqa: E402
import tritontools  # noqa: E402


@pytest.mark.parametrize("n, k", [(1, 2), (1000, 16), (5000, 300), (lanes.BLOCK * 2 + 4100, 16)])
def test_the_torch_loop_writes_the_reference_bytes(n, k):
    ids = ids_for(n, k, seed=k)
    want = lanes.encode(ids, k)
    w = lanes.symbol_bits(k)
    sym = torch_lanes.symbols_of(torch.from_numpy(ids.astype(np.int64)), k, w)
    S, f = lanes.table(np.bincount(sym.numpy(), minlength=lanes.alphabet(k, w)), sym.numel())
    cum = np.concatenate(([0], np.cumsum(f)[:-1]))
    geo = torch_lanes.Geometry(lanes.layout(sym.numel()), sym.device)
    streams, lens = torch_lanes.compact(*torch_lanes.encode_lanes_torch(sym, f, cum, S, geo), geo)
    head = bytes([S, w]) + lanes.rans._varints(f) + lens.astype("<u2").tobytes()
    assert head + streams.numpy().tobytes() == want
    b = np.frombuffer(want, np.uint8)
    p = lanes.parse(b, n, k)
    got, bad = torch_lanes.decode_lanes_torch(torch.from_numpy(np.concatenate((b, np.zeros(3, np.uint8)))), p, geo)
    assert not bad
    np.testing.assert_array_equal(got.numpy(), lanes.symbols(ids, k, w))
    b2 = b.copy()
    b2[-1] ^= 0x21
    assert torch_lanes.decode_lanes_torch(torch.from_numpy(np.concatenate((b2, np.zeros(3, np.uint8)))), p, geo)[1]


def test_torch_tensors_encode_and_decode_as_the_host():
    x = gauss(300_000, 9)
    blob = mucsc.encode(x, "mucsc", seed=4)
    assert mucsc.inspect(blob).groups[0].params["id_coding"] == "lanes"
    assert mucsc.encode(torch.from_numpy(x), "mucsc", seed=4) == blob
    y = mucsc.decode(blob, as_torch=True, device="cpu")
    np.testing.assert_array_equal(y.numpy(), mucsc.decode(blob))
    wide = mucsc.encode(x[:20000], "mucsc", z=300, seed=4, id_coding="lanes")
    assert mucsc.encode(torch.from_numpy(x[:20000]), "mucsc", z=300, seed=4, id_coding="lanes") == wide
    np.testing.assert_array_equal(mucsc.decode(wide, as_torch=True, device="cpu").numpy(), mucsc.decode(wide))


@pytest.fixture
def interpreter(monkeypatch):
    """The Triton kernels on CPU tensors through Triton's interpreter (skipped where it cannot run them)."""
    yield from tritontools.interpreter(monkeypatch, triton_lanes,
                                       lambda: triton_lanes._self_check(torch.device("cpu"), torch.uint8))


def test_the_interpreter_fixture_skips_where_it_cannot_run_and_leaves_no_switch_off(monkeypatch):
    # a numpy or triton release the interpreter does not support: the probe fails, the tests skip with its reason
    pytest.importorskip("triton")
    fake = types.SimpleNamespace(__name__="fake_kernels", disabled_reason=lambda: "InterpreterError: TypeError('x')")
    with pytest.raises(pytest.skip.Exception, match="fake_kernels.*InterpreterError"):
        next(tritontools.interpreter(monkeypatch, fake, lambda: False))
    # a kernel switch turned off earlier (another test, the interpreter) is on again during and after the test
    with pytest.warns(RuntimeWarning):
        triton_lanes.SWITCH.disable("an earlier failure")
    body = tritontools.interpreter(monkeypatch, triton_lanes, lambda: True)
    next(body)
    assert triton_lanes.disabled_reason() is None
    with pytest.warns(RuntimeWarning):
        triton_lanes.SWITCH.disable("a failure inside the test")
    with pytest.raises(StopIteration):
        next(body)
    assert triton_lanes.disabled_reason() is None


@pytest.mark.parametrize("wide", [False, True])
def test_the_triton_kernels_pass_their_self_check(interpreter, wide):
    dt = torch.int32 if wide else torch.uint8
    assert triton_lanes._self_check(torch.device("cpu"), dt)
    assert triton_lanes.disabled_reason() is None


def test_the_triton_kernels_write_the_reference_bytes(interpreter):
    # one lane and a few lanes of a real layout, through the codec (the kernels code, the compiled
    # reference checks): byte symbols of 2 and 4 bits and one symbol per ID
    for n, k in ((300, 3), (4200, 16), (2100, 300)):
        x = gauss(n, k)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # the kernels must not be disabled on the way
            got = mucsc.encode(torch.from_numpy(x), "mucsc", z=k, seed=2, id_coding="lanes")
            y = mucsc.decode(got, as_torch=True, device="cpu")
        want = mucsc.encode(x, "mucsc", z=k, seed=2, id_coding="lanes")
        assert got == want, (n, k)
        np.testing.assert_array_equal(y.numpy(), mucsc.decode(want))
    assert triton_lanes.SWITCH.checked  # they ran (the self-check passed first)


@pytest.mark.skipif(not kernels.use_c(), reason="compiled kernels not built")
@pytest.mark.parametrize("w", [1, 2, 4, 8])
@pytest.mark.parametrize("n", [1, 7, 8, 1001, (1 << 20) + 13])
def test_symbols_counted_equals_the_two_steps(w, n):
    # the compiled pack-and-count pass gives IDS_'s packing and the symbols' histogram
    from mucsc.codec import parallel

    ids = np.random.default_rng(n).integers(0, 1 << w, n).astype(np.uint8)
    with parallel.using(2):
        sym, counts = lanes.symbols_counted(ids, 1 << w, w)
    assert np.array_equal(sym, lanes.symbols(ids, 1 << w, w))
    assert np.array_equal(counts, np.bincount(sym, minlength=256))
    # ... and the entropy floor's sum c log2 c as it counts: the numpy twin's value, bit for bit
    with parallel.using(2):
        sym2, counts2, xlog = lanes.symbols_counted(ids, 1 << w, w, xlog=True)
    assert np.array_equal(sym2, sym) and np.array_equal(counts2, counts)
    assert type(xlog) is float and xlog == lanes._sum_xlog2x(counts, sym.size)
    assert lanes.entropy_floor(counts, sym.size, xlog=xlog) == lanes.entropy_floor(counts, sym.size)


def test_nearest_rounding_lane_codes_a_fixed_z_and_goals_never_do():
    # the default lane-codes the IDs of both roundings that send centroids; a goal weighs packed IDs
    # against IDSA only, and id_coding="lanes" with a goal is refused
    x = gauss(200_000, 11)
    # nearest rounding on the cluster-ID path: "auto" sends whichever of IDSL and IDS_ is smaller
    # (Lloyd-Max IDs are nearly uniform: here zstd's IDS_ wins by the IDSL table's cost)
    coded = {c: mucsc.encode(x, "mucsc", rounding="nearest", id_coding=c) for c in ("auto", "lanes", "packed")}
    assert mucsc.inspect(coded["lanes"]).groups[0].params["rounding"] == "nearest"
    assert np.array_equal(mucsc.decode(coded["lanes"]), mucsc.decode(coded["packed"]))  # deterministic IDs
    assert coded["auto"] == min(coded["lanes"], coded["packed"], key=len)
    goal = mucsc.inspect(mucsc.encode(x, "mucsc", bits=3.0))
    assert goal.groups[0].params.get("id_coding", "packed") in ("packed", "rans")
    with pytest.raises(mucsc.ParameterError, match="lanes"):
        mucsc.get_codec("mucsc", bits=3.0, id_coding="lanes")


def test_dithered_keeps_its_own_index_coding():
    # a dithered grid codes its indices per context (QIDX): "auto" is not resolved to packed IDs when
    # nothing is compressed, and id_coding "lanes" does not apply
    x = gauss(20_000, 12)
    blob = mucsc.encode(x, "mucsc", rounding="dithered", compress="off")
    assert mucsc.inspect(blob).groups[0].params["rounding"] == "dithered"
    assert mucsc.decode(blob).shape == x.shape
    with pytest.raises(mucsc.ParameterError, match="dithered"):
        mucsc.get_codec("mucsc", rounding="dithered", id_coding="lanes")


# ---- the default's choice above EXACT_ZSTD_BYTES: the structure screen, then zstd's trial --------

def _structured(kind, n=600_000):
    g = np.random.default_rng(11)
    if kind == "tile":  # a random block repeated: zstd's matches, no order-0 trace
        return np.tile(gauss(1000, 12), n // 1000)
    if kind == "tile_far":  # repeats 15 KiB of packed IDs apart
        return np.tile(gauss(30_000, 13), n // 30_000)
    if kind == "sorted":
        return np.sort(gauss(n, 14))
    if kind == "ramp":
        return np.linspace(-1.0, 1.0, n, dtype=np.float32)
    if kind == "sine":
        return np.sin(np.arange(n) / 50.0).astype(np.float32)
    if kind == "two_scales":  # two layers' scales in one group: the byte distribution drifts
        return np.concatenate([gauss(n // 2, 15), 0.05 * gauss(n // 2, 16)])
    return g.laplace(size=n).astype(np.float32) if kind == "laplace" else gauss(n, 17)


def _screened(monkeypatch):
    """The screen's verdicts during the encodes that follow."""
    from mucsc.codec.wire import structure

    seen = []
    real = structure.Screen.order0_suffices

    def spy(self, *a, **k):
        seen.append(real(self, *a, **k))
        return seen[-1]
    monkeypatch.setattr(structure.Screen, "order0_suffices", spy)
    return seen


@pytest.mark.parametrize("kind", ["tile", "tile_far", "sorted", "ramp", "sine", "two_scales"])
def test_structured_ids_go_to_the_zstd_trial_and_keep_zstd_where_smaller(kind, monkeypatch):
    from mucsc.codec.codecs import clusters

    x = _structured(kind)
    assert x.size // 2 > clusters.EXACT_ZSTD_BYTES  # the sampled path
    seen = _screened(monkeypatch)
    blob = mucsc.encode(x, "mucsc")
    assert seen == [False]  # the screen found structure: zstd's trial decided
    sizes = [len(mucsc.encode(x, "mucsc", id_coding=c)) for c in ("packed", "lanes")]
    assert sizes[0] < sizes[1] and len(blob) == sizes[0]  # zstd is smaller here, and kept
    assert mucsc.inspect(blob).groups[0].params.get("id_coding", "packed") == "packed"


@pytest.mark.parametrize("kind, z", [("gauss", 16), ("laplace", 16), ("gauss", 256)])
def test_unstructured_ids_skip_the_zstd_trial(kind, z, monkeypatch):
    x = _structured(kind)
    seen = _screened(monkeypatch)
    blob = mucsc.encode(x, "mucsc", z=z)
    assert seen == [True] and mucsc.inspect(blob).groups[0].params["id_coding"] == "lanes"
    assert len(blob) < len(mucsc.encode(x, "mucsc", z=z, id_coding="packed"))  # rightly so


@pytest.mark.skipif(kernels.c_module() is None, reason="compiled kernels not built")
@pytest.mark.parametrize("seed", range(4))
def test_the_screen_kernel_counts_as_its_numpy_twin(seed, monkeypatch):
    from mucsc.codec.wire import structure

    g = np.random.default_rng(seed)
    block = g.integers(0, 256, g.integers(1, 3000), dtype=np.uint8)
    bufs = [g.integers(0, 256, 200_000, dtype=np.uint8), np.zeros(70_000, np.uint8),
            np.tile(block, 200_000 // block.size + 1), (g.integers(0, 3, 150_000) * 85).astype(np.uint8),
            g.integers(0, 256, 7, dtype=np.uint8)]
    for buf in bufs:
        for starts, length, stride, window in (([0], 65536, 16, 4096), ([0, buf.size // 2, buf.size], 65536, 1, 100),
                                               ([0, 3], 1000, 3, 5), ([buf.size // 3], 50_000, 8, 65536)):
            starts = np.array(starts, np.int64)
            c = structure.slice_stats(buf, starts, length, stride, window)
            monkeypatch.setattr(kernels, "BACKEND", "numpy")
            n = structure.slice_stats(buf, starts, length, stride, window)
            monkeypatch.undo()
            assert c[0] == n[0] and np.array_equal(c[1], n[1])
    with pytest.raises(ValueError):
        structure.slice_stats(np.zeros(10, np.uint8), np.array([11], np.int64), 5)


def test_size_floor_never_exceeds_the_payload():
    """lanes.size_floor is a lower bound on the IDSL payload's length (the encoder skips coding on it):
    never above, and within a few percent of it, for flat, skewed, sparse and two-symbol histograms
    over one and several blocks (its slack was 2 bytes at least in 1,500 random trials); and
    lanes.entropy_floor, asked before it, is a lower bound on it."""
    rng = np.random.default_rng(37)
    for m in (1, 7, 2049, 9000, 70_000):
        for sym in (rng.integers(0, 256, m), np.minimum(rng.geometric(0.3, m), 255),
                    np.where(rng.random(m) < 0.002, 9, 0), rng.integers(0, 2, m) * 255):
            sym = sym.astype(np.uint8)
            counts = lanes.counts_of(sym, 256)
            real = len(lanes.payload(sym, 8, 256, counts))
            floor = lanes.size_floor(counts, m)
            assert floor <= real
            assert lanes.entropy_floor(counts, m) <= floor  # the cheaper bound asked first
            assert lanes.entropy_floor(counts, m, above=0) <= lanes.entropy_floor(counts, m)  # its header
            assert real - floor <= 0.03 * real + 24 + m * 0.0114 / 8  # its slack: ~n delta, ~3%


def test_size_estimate_is_tight_and_below_the_payload():
    """lanes.size_estimate (what the encoder skips lane coding on, less estimate_slack): on random
    histograms of 200-262,144 symbols (flat to very skewed, shuffled and sorted, one to many blocks)
    it is never above the payload, within a byte per lane of it, and never below size_floor -- so
    the skip changes no byte, and does skip where the lanes lose by more than the slack."""
    rng = np.random.default_rng(41)
    for _ in range(120):
        m = int(np.exp(rng.uniform(np.log(200), np.log(262_144))))
        k = int(rng.choice([2, 3, 16, 64, 256]))
        sym = rng.choice(k, size=m, p=rng.dirichlet(np.full(k, rng.choice([0.05, 1.0, 50.0])))).astype(np.uint8)
        if rng.random() < 0.2:
            sym = np.sort(sym)
        counts = lanes.counts_of(sym, 256)
        tab = lanes.table(counts, m)
        real = len(lanes.payload(sym, 8, 256, counts, tab))
        est = lanes.size_estimate(counts, m, tab)
        assert lanes.size_floor(counts, m, tab) <= est <= real  # the trials' claim (slack unused)
        assert real - est <= lanes.lane_total(m) + 1
        assert lanes.estimate_slack(m) >= 2


def test_entropy_floor_of_a_wide_alphabet_and_its_table():
    """entropy_floor with one symbol per ID (w = 16, more than 2^12 symbols used: IDSA's larger
    scale) stays below size_floor; its sum of c log2 c (a table up to XLOG2X_MAX, computed beyond)
    is the direct sum's."""
    rng = np.random.default_rng(38)
    m = 60_000
    sym = rng.integers(0, 6000, m).astype(np.uint16)
    counts = lanes.counts_of(sym, 6000)
    floor = lanes.size_floor(counts, m)
    assert lanes.entropy_floor(counts, m) <= floor <= len(lanes.payload(sym, lanes.WIDE, 6000, counts))
    for c in (counts, np.array([0, 3, lanes.XLOG2X_MAX + 5, 1], np.int64)):
        used = c[c > 0].astype(np.float64)
        assert lanes._sum_xlog2x(c, int(c.sum())) == pytest.approx(float((used * np.log2(used)).sum()), rel=1e-12)


@pytest.mark.parametrize("d, z", [(3000, 16), (10_000, 16), (10_000, 4), (20_000, 64), (40_000, 3)])
def test_auto_id_coding_without_coding_the_lanes_chooses_as_coding_them(d, z, monkeypatch):
    """Small messages ("auto", packed IDs <= EXACT_ZSTD_BYTES): skipping the lane coding when its size
    floor loses to zstd changes no byte -- the same message as deciding on the coded lanes."""
    _auto_lane_codings(d, z, monkeypatch)


def _auto_lane_codings(d: int, z: int, monkeypatch) -> int:
    """How many of three default encodes (Gaussian, Student-t, sparse Laplace) coded the lanes, each
    checked against the encode that always codes them and against the smaller explicit coding."""
    from mucsc.codec.codecs import clusters

    rng = np.random.default_rng(d + z)
    coded = []
    real_payload = lanes.payload
    for x in (rng.standard_normal(d), rng.standard_t(3, d), np.where(rng.random(d) < 0.6, 0.0, rng.laplace(size=d))):
        x = x.astype(np.float32)
        monkeypatch.setattr(lanes, "payload", lambda *a, **k: coded.append(1) or real_payload(*a, **k))
        fast = mucsc.encode(x, "mucsc", z=z)
        monkeypatch.setattr(lanes, "size_floor", lambda counts, m, tab=None: 0)  # never skip: always code the lanes
        monkeypatch.setattr(lanes, "size_estimate", lambda counts, m, tab: 0.0)
        monkeypatch.setattr(lanes, "entropy_floor", lambda counts, m, above=None, xlog=None: 0)
        assert mucsc.encode(x, "mucsc", z=z) == fast
        monkeypatch.undo()
        assert len(fast) == min(len(mucsc.encode(x, "mucsc", z=z, id_coding=c)) for c in ("packed", "lanes"))
    assert clusters.EXACT_ZSTD_BYTES >= 40_000 * 6 // 8
    return len(coded) - 3  # lane codings beyond the 3 forced ones: < 3 when a floor skipped one


def test_the_size_floor_skips_lane_coding_where_zstd_wins(monkeypatch):
    """Gaussian IDs at Z = 16, d = 1e4 (zstd's frame of the packing beats the lanes by ~6%): the
    lanes are not coded at all (the host coder's shortcut: IDs rounded on a torch device are lane-coded there)."""
    from mucsc.codec.backends.dispatch import HOST, backend_for

    if backend_for(np.zeros(1, np.float32)) is not HOST:
        pytest.skip("MUCSC_BACKEND=torch: the IDs are coded by the device coder")
    assert _auto_lane_codings(10_000, 16, monkeypatch) < 3
