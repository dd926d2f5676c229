"""The IDSL decoder's value mode (``lanes.decode_values``, the compiled ``lanes_decode`` with a row
table): each byte symbol's values written as it is decoded, the IDs never stored.  The AVX2 decoder
(full blocks, rows of 4 or 8 bytes), the scalar one (``simd=0``, every other row size, the last block)
and the reference (decode the symbols, then ``parallel.unpack_take``) give the same values and refuse
the same sections with the same errors (damaged lane streams: ``test_lanes.py``)."""

from __future__ import annotations

import numpy as np
import pytest

import mucsc
from mucsc.codec import kernels, parallel
from mucsc.codec.wire import container as fmt
from mucsc.codec.wire import lanes
from mucsc.errors import FormatError
from test_lanes import _rebuild, ids_for

pytestmark = pytest.mark.backends

C = kernels.c_module()
needs_c = pytest.mark.skipif(C is None, reason="compiled kernels not built")


def reference(payload, n, k, table):
    """table[ids] the way the decoder did before the value mode: symbols, then IDS_'s unpacking."""
    sym, w = lanes.decode_symbols(payload, n, k)
    return parallel.unpack_take(sym, w, n, table, lambda top: FormatError(f"cluster id {top} out of range"))


def kernel_values(payload, n, k, table, simd):
    """The compiled value decoder over every block in one call: (result code, values)."""
    b = np.frombuffer(payload, np.uint8)
    p = lanes.parse(b, n, k)
    rows = parallel.byte_table(table, p.w)
    out = np.empty(n, table.dtype)
    got = C.lanes_decode(b, p.f.astype(np.uint32), p.cum.astype(np.uint32), p.S, p.layout.m, 0, p.layout.blocks,
                         p.starts, p.lengths, out.view(np.uint8), rows.bytes, simd)
    return got, out


# n, k: within one lane, a partial row, w = 1, 2, 4, 8, full blocks then a partial one, an odd count
# (the last symbol half padding), exactly whole blocks (the last block full)
CASES = [(1, 2), (7, 2), (100, 3), (1001, 16), (4099, 5), (70001, 256), (2 * lanes.BLOCK * 2 + 3, 16),
         (lanes.BLOCK * 8 + 9, 2), (3 * lanes.BLOCK * 2, 16), (lanes.BLOCK * 2 + 1, 12), (5 * lanes.BLOCK + 77, 200)]


@needs_c
@pytest.mark.parametrize("n, k", CASES)
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
@pytest.mark.parametrize("conc", [0.3, 50.0])  # skewed IDs (some f > 2^12), near-uniform (every f <= 2^12)
def test_values_equal_the_reference(n, k, dtype, conc):
    ids = ids_for(n, k, seed=n + k, conc=conc)
    payload = lanes.encode(ids, k)
    table = np.random.default_rng(k).normal(size=k).astype(dtype)
    want = table[ids]
    np.testing.assert_array_equal(reference(payload, n, k, table), want)
    for simd in (1, 0):
        got, out = kernel_values(payload, n, k, table, simd)
        assert got >= 0
        np.testing.assert_array_equal(out, want)
    if kernels.use_c():
        np.testing.assert_array_equal(lanes.decode_values(payload, n, k, table), want)
    else:  # the numpy backend leaves it to the reference
        assert lanes.decode_values(payload, n, k, table) is None


@needs_c
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_threads_give_the_same_values(threads):
    n, k = 9 * lanes.BLOCK * 2 + 11, 16  # three runs of blocks
    ids = ids_for(n, k, 4)
    payload = lanes.encode(ids, k)
    table = np.linspace(-1, 1, k).astype(np.float32)
    with parallel.using(threads):
        out = lanes.decode_values(payload, n, k, table) if kernels.use_c() else reference(payload, n, k, table)
    np.testing.assert_array_equal(out, table[ids])


def _error(blob):
    try:
        mucsc.decode(blob)
    except FormatError as e:
        return str(e)
    return None


@pytest.mark.parametrize("n", [9001, 2 * lanes.BLOCK * 2 + 1])
def test_invalid_ids_and_padding_get_the_reference_errors(n, monkeypatch):
    # validly coded symbols that hold an ID >= k, or non-zero padding bits in the last symbol (n odd):
    # the same FormatError, word for word, from the value mode and from the numpy reference
    k = 12
    blob = mucsc.encode(np.random.default_rng(2).normal(size=n).astype(np.float32), "mucsc", z=k,
                        id_coding="lanes", compress="off")
    assert fmt.read_message(blob).header.groups[0].params["centroids"] == k
    sym = lanes.symbols(ids_for(n, k, 3), k)
    for at, value in ((5, 0xDD), (-1, 0xF3), (-1, 0x13), (lanes.BLOCK + 3, 0xC0)):
        s = sym.copy()
        s[min(at, s.size - 2)] = value
        bad = _rebuild(blob, lanes.encode_symbols(s, 4, 256))
        errors = set()
        for backend in ("c", "numpy") if C is not None else ("numpy",):
            monkeypatch.setattr(kernels, "BACKEND", backend)
            errors.add(_error(bad))
        assert len(errors) == 1 and None not in errors, errors


@pytest.mark.parametrize("z", [2, 3, 4, 5, 16, 17, 255, 256, 257, 4096, 65536])
def test_every_lane_coded_z_decodes_as_the_numpy_reference(z, monkeypatch):
    n = 70001
    x = np.random.default_rng(z).standard_t(3, size=n).astype(np.float32)
    blob = mucsc.encode(x, "mucsc", z=z, id_coding="lanes", seed=1)
    assert "IDSL" in {s.tag for s in fmt.read_message(blob).sections}
    outs = []
    for backend in ("c", "numpy") if C is not None else ("numpy",):
        monkeypatch.setattr(kernels, "BACKEND", backend)
        outs.append(mucsc.decode(blob))
    for o in outs[1:]:
        np.testing.assert_array_equal(o, outs[0])
    assert outs[0].dtype == np.float32 and outs[0].shape == (n,)


@needs_c
def test_huge_outputs_are_aligned_traced_and_reused(monkeypatch):
    """kernels.output_array's large arrays: writable, on memory from a 2 MiB boundary, counted by
    tracemalloc like numpy's own while alive; a freed one's mapping serves the next output of its size
    (no new pages) while the pool keeps it, and huge_buffer_pool(0) gives everything back.  Small
    arrays and the numpy backend get np.empty."""
    import tracemalloc
    monkeypatch.setattr(kernels, "BACKEND", "c")
    n = (kernels.HUGE_OUTPUT >> 2) + 1001
    prev, _ = C.huge_buffer_pool(64 << 20)
    try:
        C.huge_buffer_pool(0)  # start from an empty pool
        C.huge_buffer_pool(64 << 20)
        tracemalloc.start()
        try:
            a = kernels.output_array(n, np.float32)
            traced = tracemalloc.get_traced_memory()[0]
        finally:
            tracemalloc.stop()
        assert traced >= 4 * n and a.shape == (n,) and a.dtype == np.float32 and a.flags.writeable
        assert a.ctypes.data % (2 << 20) == 0
        a[:] = 7
        where = a.ctypes.data
        view = a[10:]
        del a
        assert C.huge_buffer_pool(-1)[1] == 0  # a view keeps the memory alive: not pooled yet
        del view
        assert C.huge_buffer_pool(-1)[1] >= 4 * n
        b = kernels.output_array(n - 900, np.float32)  # the kept mapping, its tail given back
        assert b.ctypes.data == where and C.huge_buffer_pool(-1)[1] == 0
        del b
        assert C.huge_buffer_pool(-1)[1] > 0 and C.huge_buffer_pool(0)[1] == 0
        small = kernels.output_array(1000, np.float32)
        assert small.base is None and small.shape == (1000,)
        monkeypatch.setattr(kernels, "BACKEND", "numpy")
        assert kernels.output_array(n, np.float32).base is None
    finally:
        C.huge_buffer_pool(prev)
    with pytest.raises(ValueError):
        C.huge_buffer(0)


@needs_c
def test_large_output_decodes_the_same_fresh_and_reused(monkeypatch):
    """A lane-coded message whose output takes huge pages (and the AVX2 decoder's non-temporal stores)
    decodes to the numpy reference's values, on a new mapping, on a reused one (the pool's), without the
    pool, and into numpy memory off the stores' alignment (a sorted table: every centroid is used)."""
    n = (kernels.HUGE_OUTPUT >> 2) + 77
    x = np.random.default_rng(5).normal(size=n).astype(np.float32)
    blob = mucsc.encode(x, "mucsc", seed=2)
    assert "IDSL" in {s.tag for s in fmt.read_message(blob).sections}
    with monkeypatch.context() as mp:
        mp.setattr(kernels, "BACKEND", "numpy")
        ref = mucsc.decode(blob)
    monkeypatch.setattr(kernels, "BACKEND", "c")
    prev, _ = C.huge_buffer_pool(64 << 20)
    try:
        first = mucsc.decode(blob)
        assert first.ctypes.data % (2 << 20) == 0
        np.testing.assert_array_equal(first, ref)
        first[:] = np.nan  # whatever the freed memory held, the next decode writes every value
        del first
        np.testing.assert_array_equal(mucsc.decode(blob), ref)
        C.huge_buffer_pool(0)
        np.testing.assert_array_equal(mucsc.decode(blob), ref)
    finally:
        C.huge_buffer_pool(prev)
    # the kernel into numpy memory 4 bytes off a 32-byte boundary: the stores that need alignment step aside
    sec = next(s for s in fmt.read_message(blob).sections if s.tag == "IDSL")
    payload = memoryview(blob)[sec.offset: sec.offset + sec.stored_bytes]
    table = np.unique(ref)
    b = np.frombuffer(payload, np.uint8)
    p = lanes.parse(b, n, table.size)
    rows = parallel.byte_table(table, p.w)
    space = np.empty(4 * n + 64, np.uint8)
    at = (-space.ctypes.data) % 32 + 4
    out = space[at: at + 4 * n]
    got = C.lanes_decode(b, p.f.astype(np.uint32), p.cum.astype(np.uint32), p.S, p.layout.m, 0, p.layout.blocks,
                         p.starts, p.lengths, out, rows.bytes)
    assert got >= 0
    np.testing.assert_array_equal(out.view(np.float32), ref)


def test_decoded_outputs_kept_up_to_the_cap():
    """mucsc.heap.keep_decoded_outputs sets the compiled kernels' cap on the freed outputs kept
    (returning the previous one) and refuses a negative or non-integer cap; without the compiled
    kernels it reports None."""
    from mucsc import heap
    with pytest.raises(ValueError, match="max_bytes"):
        heap.keep_decoded_outputs(-1)
    with pytest.raises(ValueError, match="max_bytes"):
        heap.keep_decoded_outputs(1.5)
    prev = heap.keep_decoded_outputs(0)
    if kernels.compiled("huge_buffer_pool") is None:
        assert prev is None
        return
    try:
        assert heap.keep_decoded_outputs(1 << 20) == 0
        assert heap.keep_decoded_outputs(heap.DECODED_OUTPUTS) == 1 << 20
    finally:
        heap.keep_decoded_outputs(prev)
