"""Multi-threaded encode and decode (mucsc.codec.parallel): the bytes never depend on ``threads``.

Most tests shrink ``parallel.CHUNK`` to 4096 elements so that small inputs span many chunks (and
sizes not divisible by the chunk leave a short last one) while the suite stays fast; the compiled
kernel and the numpy fallback are compared in one process by switching ``kernels.BACKEND``.
"""

from __future__ import annotations

import hashlib
import math
import threading

import numpy as np
import pytest
import zstandard

import mucsc
from mucsc.codec.wire import container as fmt
from mucsc.codec import kernels, parallel
from mucsc.codec.api.state import Compressor

THREADS = (1, 2, 3, 8)
SMALL_CHUNK = 1 << 12
HAVE_C = kernels.c_module() is not None
BACKENDS = ("c", "numpy") if HAVE_C else ("numpy",)

CODECS = [
    ("mucsc", {"z": 2}),
    ("mucsc", {"z": 8}),  # 3-bit ids: widened to 4 when compressed, tight when not
    ("mucsc", {"z": 16}),
    ("mucsc", {"z": 16, "centroid_dtype": "float16"}),
    ("mucsc", {"z": 256}),
    ("mucsc", {"z": 300}),  # 9-bit ids: chunks of the generic packer
    ("mucsc", {"z": 6, "id_packing": "tight"}),
    ("bmucsc", {"keep": 0.3, "z": 64}),
    ("qsgd", {}),
    ("topk", {}),
    ("none", {}),
]


@pytest.fixture
def small_chunks(monkeypatch):
    monkeypatch.setattr(parallel, "CHUNK", SMALL_CHUNK)
    monkeypatch.setattr(parallel, "GROUP_PARALLEL_MAX", 2 * SMALL_CHUNK)


def data(n, dtype=np.float32, seed=0):
    x = np.random.default_rng(seed).standard_t(4, size=n).astype(dtype)
    if n > 10:
        x[:3] = [0.0, -0.0, x[5]]  # signed zeros and a repeated value
    return x


def sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


@pytest.mark.parametrize("codec,params", CODECS, ids=[f"{c}-{p}" for c, p in CODECS])
@pytest.mark.parametrize("n", [5 * SMALL_CHUNK + 3, 3 * SMALL_CHUNK])
def test_identical_bytes_for_any_thread_count_and_backend(small_chunks, monkeypatch, codec, params, n):
    x = data(n, seed=n)
    blobs, decoded = {}, {}
    for backend in BACKENDS:
        with monkeypatch.context() as mp:
            mp.setattr(kernels, "BACKEND", backend)
            for t in THREADS if backend == "c" else (1, 3):  # the numpy solver is slow at Z = 256
                for compress in ("auto", "off"):
                    blobs[backend, t, compress] = mucsc.encode(x, codec, seed=7, threads=t, compress=compress,
                                                               **params)
    for compress in ("auto", "off"):
        ref = blobs[BACKENDS[0], 1, compress]
        for key, blob in blobs.items():
            if key[2] == compress:
                assert blob == ref, key
        for t in THREADS:
            decoded[t] = mucsc.decode(ref, threads=t)
        for t in THREADS:
            np.testing.assert_array_equal(decoded[t], decoded[1])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_chunked_rounding_equals_one_pass(small_chunks, monkeypatch, dtype):
    """The per-chunk stream offsets reproduce the one-pass ids exactly (float32: two elements per word)."""
    x = data(7 * SMALL_CHUNK + 1, dtype)
    one_pass = {}
    with monkeypatch.context() as mp:
        mp.setattr(parallel, "CHUNK", 1 << 30)  # one chunk: the kernel's own pass
        for backend in BACKENDS:
            mp.setattr(kernels, "BACKEND", backend)
            one_pass[backend] = mucsc.encode(x, z=16, seed=3)
    assert len(set(one_pass.values())) == 1
    for t in THREADS:
        assert mucsc.encode(x, z=16, seed=3, threads=t) == one_pass[BACKENDS[0]]


def test_stats_do_not_depend_on_threads(small_chunks):
    x = data(6 * SMALL_CHUNK + 5)
    ref = mucsc.encode_with_stats(x, z=16, threads=1)[1].to_dict()
    for t in THREADS[1:]:
        assert mucsc.encode_with_stats(x, z=16, threads=t)[1].to_dict() == ref
    exact = mucsc.encode_with_stats(x, z=16, compress="off")[1].J
    assert ref["J"] == pytest.approx(exact, rel=1e-12)


def test_many_groups_side_by_side(small_chunks):
    """shared=False: small groups are encoded concurrently, large ones chunked; same bytes, same order."""
    rng = np.random.default_rng(5)
    tensors = {f"t{i}": rng.normal(size=s).astype(np.float32) for i, s in
               enumerate([10, 3 * SMALL_CHUNK + 1, 100, 0, 5000, 7, 9 * SMALL_CHUNK, 1])}
    tensors["steps"] = np.arange(12, dtype=np.int64)
    tensors["half"] = rng.normal(size=333).astype(np.float16)
    ref = mucsc.encode(tensors, z=16, shared=False, seed=1)
    for t in THREADS[1:]:
        assert mucsc.encode(tensors, z=16, shared=False, seed=1, threads=t) == ref
    out1 = mucsc.decode(ref)
    for t in THREADS[1:]:
        out = mucsc.decode(ref, threads=t)
        assert list(out) == list(out1)
        for k in out1:
            np.testing.assert_array_equal(out[k], out1[k])


def test_first_failing_group_is_reported(small_chunks):
    """Errors come out as a loop over the groups would raise them, whatever the thread count."""
    tensors = {"a": np.ones(10, np.float32), "b": np.array([1.0, np.nan], np.float32),
               "c": np.array([np.inf], np.float32), "d": np.ones(3 * SMALL_CHUNK, np.float32)}
    for t in THREADS:
        with pytest.raises(mucsc.InputError, match="'b'"):
            mucsc.encode(tensors, z=4, shared=False, threads=t)


def _ids_section(blob: bytes) -> tuple[int, int]:
    msg = fmt.read_message(blob)
    s = next(s for s in msg.sections if s.tag == "IDS_")
    return s.offset, s.stored_bytes


def _with_crc(blob: bytearray) -> bytes:
    import zlib

    blob[-4:] = zlib.crc32(bytes(blob[:-4])).to_bytes(4, "little")
    return bytes(blob)


# (z, id width, largest id a 0xFF byte holds): the generic unpacker (3 bits) and the byte-table
# lookups (2, 4, 8 bits) with fewer levels than the width can address
BAD_IDS = [(5, 3, 7), (3, 2, 3), (12, 4, 15), (200, 8, 255)]


@pytest.mark.parametrize("z,width,top", BAD_IDS)
@pytest.mark.parametrize("t", (1, 3))
def test_decoder_checks_every_chunk(small_chunks, t, z, width, top):
    n = 4 * SMALL_CHUNK + 3
    x = data(n)
    blob = mucsc.encode(x, z=z, compress="off")
    assert mucsc.inspect(blob).groups[0].params["id_bits"] == width
    off, size = _ids_section(blob)
    for pos in (off + 10, off + size - 10):  # the first and the last chunk
        bad = bytearray(blob)
        bad[pos] = 0xFF
        with pytest.raises(mucsc.FormatError, match=f"cluster id {top} out of range for {z} centroids"):
            mucsc.decode(_with_crc(bad), threads=t)
    if n * width % 8:
        pad = bytearray(blob)
        pad[off + size - 1] |= 0x80  # the top bit of the last byte is padding
        with pytest.raises(mucsc.FormatError, match="padding"):
            mucsc.decode(_with_crc(pad), threads=t)


@pytest.mark.parametrize("z", [2, 3, 4, 12, 16, 200, 256])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", [1, 7, 2 * SMALL_CHUNK + 5])
def test_byte_table_lookup_equals_plain_indexing(small_chunks, z, dtype, n):
    from mucsc.codec.wire import bitpack

    x = data(n, dtype, seed=z)
    blob = mucsc.encode(x, z=z, compress="off")
    p = mucsc.inspect(blob).groups[0].params
    msg = fmt.read_message(blob)
    secs = msg.group_sections(0)
    cent = np.frombuffer(bytes(secs["CENT"]), "<f4")
    ids = bitpack.unpack(bytes(secs["IDS_"]), p["id_bits"], n)
    np.testing.assert_array_equal(mucsc.decode(blob, threads=2), cent.astype(dtype)[ids])


def test_bounds_are_remembered_per_array_within_one_call():
    a = np.arange(10.0)
    b = np.arange(5.0) - 3
    with parallel.using(2):
        assert parallel.bounds(a) == (0.0, 9.0)
        assert parallel.bounds(b) == (-3.0, 1.0)
        assert parallel.bounds(a) == (0.0, 9.0)
    a[0] = -50.0  # a new call sees the new values
    with parallel.using(1):
        assert parallel.bounds(a) == (-50.0, 9.0)


@pytest.mark.skipif(kernels.c_module() is None, reason="compiled kernels not built")
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_bounds_kernel_is_numpys_reductions(monkeypatch, dtype):
    """The one-pass compiled min/max gives numpy's two reductions bit for bit, and hands back (None)
    exactly where only numpy's order decides: a NaN, or a zero (either sign) as the min or the max."""
    monkeypatch.setattr(kernels, "BACKEND", "c")
    minmax = kernels.compiled("minmax")
    rng = np.random.default_rng(5)
    for n in (1, 2, 3, 7, 15, 16, 17, 33, 1000, 10_001):
        for t in range(24):
            x = (rng.standard_normal(n) * rng.choice([1e-30, 1.0, 1e30])).astype(dtype)
            x[rng.integers(n)] = [x[0], np.inf, -np.inf, np.nan, 0.0, -0.0][t % 6]
            ref = (float(np.minimum.reduce(x)), float(np.maximum.reduce(x)))
            got = minmax(x)
            if got is None:
                assert np.isnan(ref[0]) or ref[0] == 0.0 or ref[1] == 0.0, (n, t, ref)
            else:
                assert got == ref and [math.copysign(1, v) for v in got] == [math.copysign(1, v) for v in ref]
            with parallel.using(1):  # bounds itself: numpy's signs of zero, NaN propagated
                b = parallel.bounds(x)
            assert str(b) == str(ref)
    # buffers it does not take: numpy answers
    assert minmax(np.zeros(0, dtype)) is None and minmax(np.arange(9, dtype=np.int32)) is None
    assert minmax(np.arange(1.0, 9.0, dtype=dtype)[::2]) is None
    assert minmax(np.array([-1.0, 0.0], dtype)) is None and minmax(np.array([-0.0, 2.0], dtype)) is None


def test_zstd_one_frame_same_bytes_for_any_threads():
    """Above one job (4 MiB at level 3) zstd's multi-threaded mode writes one frame, equal for any
    worker count >= 1; small inputs match the single-threaded mode (the spec vectors' bytes)."""
    rng = np.random.default_rng(0)
    ids = np.clip(np.round(rng.normal(7.5, 2.5, size=2 * 9_000_000)), 0, 15).astype(np.uint8)
    big = (ids[0::2] | (ids[1::2] << 4)).tobytes()
    frames = {t: parallel.zstd_compressor(3, t).compress(big) for t in THREADS}
    assert len(set(frames.values())) == 1
    frame = frames[1]
    d = zstandard.ZstdDecompressor().decompressobj()
    assert d.decompress(frame) == big and d.unused_data == b""  # exactly one frame
    assert zstandard.frame_content_size(frame) == len(big)
    small = big[:100_000]
    assert parallel.zstd_compressor(3, 4).compress(small) == \
        zstandard.ZstdCompressor(level=3, write_content_size=True, write_checksum=False).compress(small)


def test_run_keeps_order_and_raises_the_first_error():
    items = list(range(50))
    assert parallel.run(lambda i: i * i, items, 4) == [i * i for i in items]
    seen = set()

    def fn(i):
        seen.add(threading.get_ident())
        if i in (7, 30):
            raise ValueError(f"bad {i}")
        return i

    for t in (1, 3):
        with pytest.raises(ValueError, match="bad 7"):
            parallel.run(fn, items, t)
    with parallel.using(3):
        assert parallel.current() == 3
        assert parallel.run(lambda i: parallel.current(), [0, 1, 2], 3) == [1, 1, 1]  # nested: serial
    assert parallel.current() == 1


def test_threads_argument_is_validated():
    x = data(100)
    for bad in (-1, 1.5, True, "2"):
        with pytest.raises(mucsc.ParameterError, match="threads"):
            mucsc.encode(x, threads=bad)
        with pytest.raises(mucsc.ParameterError, match="threads"):
            mucsc.decode(mucsc.encode(x), threads=bad)
    assert mucsc.encode(x, threads=0) == mucsc.encode(x)  # 0: all cores
    assert parallel.resolve(0) == parallel.available_cores() >= 1


def test_stateful_compressor_takes_threads(small_chunks):
    rng = np.random.default_rng(1)
    updates = [{"w": rng.normal(size=3 * SMALL_CHUNK + 1).astype(np.float32)} for _ in range(3)]
    out = {}
    for t in (1, 3):
        comp = Compressor("topk", keep=0.1, threads=t)  # error feedback: encode and decode each round
        out[t] = [comp.compress(u) for u in updates]
    assert out[1] == out[3]
    with pytest.raises(mucsc.ParameterError, match="threads"):
        Compressor("mucsc", threads=-2)


@pytest.mark.parametrize("backend", ["c", "numpy"])
def test_take_is_fancy_indexing_on_any_threads(small_chunks, monkeypatch, backend):
    """parallel.take (an encoder's own lookup): table[ids] for 8-bit IDs (the compiled byte gather or
    np.take) and wider ones, float32 and float64 tables, chunks on 1 or 3 threads, and no IDs."""
    monkeypatch.setattr(kernels, "BACKEND", backend)
    rng = np.random.default_rng(4)
    n = 3 * SMALL_CHUNK + 5
    for k, id_dtype in ((16, np.uint8), (256, np.uint8), (300, np.uint16)):
        ids = rng.integers(0, k, n).astype(id_dtype)
        for dtype in (np.float32, np.float64):
            table = rng.standard_normal(k).astype(dtype)
            for t in (1, 3):
                with parallel.using(t):
                    got = parallel.take(table, ids)
                assert got.dtype == dtype and got.tobytes() == table[ids].tobytes()
    assert parallel.take(np.zeros(0, np.float32), np.zeros(0, np.uint8)).shape == (0,)


def test_pools_work_after_fork(small_chunks):
    """A child forked after the pools started gets fresh ones (its copies have no threads)."""
    import multiprocessing

    if kernels.TORCH:
        pytest.skip("torch's own thread pool is not fork-safe (MUCSC_BACKEND=torch encodes with it)")
    x = data(5 * SMALL_CHUNK + 1)
    ref = mucsc.encode(x, z=16, threads=3)
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(1) as pool:
        assert pool.apply_async(_encode_in_child, (x,)).get(timeout=60) == ref


def _encode_in_child(x):
    parallel.CHUNK = SMALL_CHUNK  # the fixture's patch, which a forked child inherits anyway
    return mucsc.encode(x, z=16, threads=3)


def test_cli_threads_option_gives_the_same_files(small_chunks, tmp_path):
    """compress/decompress/test -T N: the same message and decoded file for any N (default 0: all cores)."""
    from click.testing import CliRunner

    from mucsc.cli.main import main

    x = data(3 * SMALL_CHUNK + 5)
    src = tmp_path / "u.npy"
    np.save(src, x)
    outs = {}
    for t in ("0", "1", "3"):
        out = tmp_path / f"u{t}.mucsc"
        res = CliRunner().invoke(main, ["compress", str(src), "-o", str(out), "-q", "-T", t])
        assert res.exit_code == 0, res.output
        outs[t] = out.read_bytes()
        back = tmp_path / f"b{t}.npy"
        res = CliRunner().invoke(main, ["decompress", str(out), "-o", str(back), "-q", "-T", t])
        assert res.exit_code == 0, res.output
        np.testing.assert_array_equal(np.load(back), mucsc.decode(outs[t]))
        assert CliRunner().invoke(main, ["test", str(out), "-q", "-T", t]).exit_code == 0
    assert outs["0"] == outs["1"] == outs["3"]
    res = CliRunner().invoke(main, ["compress", str(src), "-o", str(tmp_path / "x.mucsc"), "-T", "-1"])
    assert res.exit_code == 2


# ---- decoding a zstd-coded ID section while it is decompressed (format.ZstdStream) ---------------

def _count_stream_reads(monkeypatch) -> list[int]:
    calls: list[int] = []
    real = fmt.ZstdStream.read_to

    def counted(self, pos):
        calls.append(pos)
        return real(self, pos)

    monkeypatch.setattr(fmt.ZstdStream, "read_to", counted)
    return calls


@pytest.mark.parametrize("z", [4, 16, 256, 300])  # byte-table widths 2, 4, 8 and the 9-bit unpacker
def test_streamed_ids_decode_as_decompressed_first(small_chunks, monkeypatch, z):
    """Several threads: the IDS_ frame (several zstd blocks) is unpacked while it is decompressed."""
    x = data(90 * SMALL_CHUNK + 11, seed=z)
    blob = mucsc.encode(x, z=z, id_coding="packed") if z <= 16 else _rezstd(x, z)  # wide ids: zstd would store them raw
    assert [s.encoding for s in mucsc.inspect(blob).sections if s.tag == "IDS_"] == ["zstd"]
    ref = mucsc.decode(blob)
    calls = _count_stream_reads(monkeypatch)
    for t in THREADS[1:]:
        calls.clear()
        np.testing.assert_array_equal(mucsc.decode(blob, threads=t), ref)
        assert len(calls) == 91 and calls == sorted(calls)  # one read per chunk, in order
    calls.clear()
    np.testing.assert_array_equal(mucsc.decode(blob, threads=1), ref)
    assert calls == []  # one thread: decompressed in one call, then unpacked


def _rezstd(x: np.ndarray, z: int, tamper=None, extra: bytes = b"", cut: int = 0,
            corrupt_block: int | None = None) -> bytes:
    """``x`` encoded with its IDS_ section rebuilt as one zstd frame: the raw IDs tampered with,
    bytes appended after the frame, the frame cut short by ``cut`` bytes, or a byte early in block
    ``corrupt_block`` changed (zstd then reports corrupt data when it gets there)."""
    from msgtools import build

    msg = fmt.read_message(mucsc.encode(x, z=z, compress="off"))
    secs = msg.group_sections(0)
    ids = bytearray(secs["IDS_"])
    if tamper is not None:
        tamper(ids)
    frame = bytearray(zstandard.ZstdCompressor(level=3, write_content_size=True).compress(bytes(ids)))
    if corrupt_block is not None:
        pos = zstandard.frame_header_size(frame)
        for _ in range(corrupt_block):  # skip whole blocks: 3-byte header, then its content
            pos += 3 + ((frame[pos] | frame[pos + 1] << 8 | frame[pos + 2] << 16) >> 3)
        frame[pos + 3 + 5] ^= 0x5A
    frame = bytes(frame[: len(frame) - cut]) + extra
    hj = bytes(msg.payload(msg.sections[0]))
    return build(hj, [(0, "CENT", bytes(secs["CENT"])), (0, "IDS_", frame, len(ids))])


def _outcome(blob: bytes, t: int):
    try:
        return "ok", hashlib.sha256(mucsc.decode(blob, threads=t).tobytes()).hexdigest()
    except mucsc.MucscError as exc:
        return type(exc).__name__, str(exc)


def _set_byte(pos: int, value: int):
    def tamper(ids: bytearray) -> None:
        ids[pos] = value
    return tamper


STREAM_CASES = {
    "clean": {},
    "bad-id-first-chunk": {"tamper": _set_byte(10, 0xFF)},
    "bad-id-last-chunk": {"tamper": _set_byte(-10, 0xFF)},
    "zeros-after-frame": {"extra": bytes(8)},
    "second-frame": {"extra": zstandard.ZstdCompressor().compress(b"second frame")},
    "skippable-frame": {"extra": b"\x50\x2a\x4d\x18" + (4).to_bytes(4, "little") + b"skip"},
    "truncated": {"cut": 1000},
    "corrupt-block-1": {"corrupt_block": 1},
    "corrupt-block-4": {"corrupt_block": 4},
    "bad-id-then-corrupt-block-3": {"tamper": _set_byte(10, 0xFF), "corrupt_block": 3},
}


@pytest.mark.parametrize("case", list(STREAM_CASES))
def test_streamed_errors_are_those_of_one_thread(small_chunks, monkeypatch, case):
    """Corrupt frames and bad IDs: any thread count raises what decompressing first raises (the
    stream's error before any chunk's, then the first bad chunk's), or decodes the same values."""
    x = data(300 * SMALL_CHUNK + 3)  # 600 KB of 4-bit ids: a frame of 5 blocks
    blob = _rezstd(x, 12, **STREAM_CASES[case])  # 12 levels: id 15 (0xF) is out of range
    ref = _outcome(blob, 1)
    if case == "clean":
        assert ref[0] == "ok"
    elif case.startswith("bad-id-first") or case.startswith("bad-id-last"):
        assert ref == ("FormatError", "cluster id 15 out of range for 12 centroids")
    else:
        assert ref[0] == "FormatError" and "zstd" in ref[1]
    streams = []
    real = fmt.GroupSections.stream
    monkeypatch.setattr(fmt.GroupSections, "stream", lambda self, tag: streams.append(tag) or real(self, tag))
    for t in THREADS[1:]:
        assert _outcome(blob, t) == ref
    assert streams == ["IDS_"] * (len(THREADS) - 1)  # the streamed path ran


def test_zstd_frame_end_walks_every_block_kind():
    rng = np.random.default_rng(2)
    for payload in (b"abc", bytes(1 << 20), rng.bytes(300_000), b"abcdefgh" * 100_000):  # RLE, raw blocks
        for checksum in (False, True):
            frame = zstandard.ZstdCompressor(write_content_size=True, write_checksum=checksum).compress(payload)
            assert fmt.zstd_frame_end(memoryview(frame), 1000) == len(frame)
            assert fmt.zstd_frame_end(memoryview(frame + b"\x00" * 5), 1000) == len(frame)
            assert fmt.zstd_frame_end(memoryview(frame[:-1]), 1000) != len(frame) - 1  # cut short
            stream = fmt.ZstdStream(memoryview(frame), len(payload), "TEST")
            for pos in range(0, len(payload), 77_777):
                stream.read_to(pos)
                assert bytes(stream.buffer[:pos]) == payload[:pos]
            assert bytes(stream.complete()) == payload


def test_frame_of_many_tiny_blocks_is_left_to_the_one_shot_path():
    """Empty blocks are valid zstd; past the walk's bound the frame is decompressed in one call."""
    payload = bytes(range(200))
    frame = (b"\x28\xb5\x2f\xfd" + bytes([0x20, len(payload)]) + b"\x00\x00\x00" * 100
             + ((len(payload) << 3) | 1).to_bytes(3, "little") + payload)  # 100 empty raw blocks, 1 last
    assert fmt.zstd_frame_end(memoryview(frame), 1000) == len(frame)
    assert fmt.zstd_frame_end(memoryview(frame), 64) is None
    stream = fmt.ZstdStream(memoryview(frame), len(payload), "TEST")
    stream.read_to(10)
    assert bytes(stream.complete()) == payload
    with pytest.raises(mucsc.FormatError, match="after the zstd frame"):
        fmt.ZstdStream(memoryview(frame + b"\x01"), len(payload), "TEST")


def test_crc32_in_parts_equals_one_pass(small_chunks):
    import zlib

    data_ = np.random.default_rng(3).bytes(5 * SMALL_CHUNK + 7)
    for cut in (0, 1, 4095, len(data_) // 2, len(data_)):
        a, b = data_[:cut], data_[cut:]
        assert parallel.crc32_combine(zlib.crc32(a), zlib.crc32(b), len(b)) == zlib.crc32(data_)
    for t in THREADS:
        with parallel.using(t):
            assert parallel.crc32(memoryview(data_)) == zlib.crc32(data_)
    blob = bytearray(mucsc.encode(data(3 * SMALL_CHUNK), z=16, compress="off"))
    blob[100] ^= 1
    for t in THREADS:
        with pytest.raises(mucsc.ChecksumError):
            mucsc.decode(bytes(blob), threads=t)


def test_crc32_continues_a_running_crc_in_parallel_parts(small_chunks):
    """The writer feeds each large section to parallel.crc32 with the CRC of what came before."""
    import zlib

    data = np.random.default_rng(4).integers(0, 256, 5 * SMALL_CHUNK + 7, dtype=np.uint8).tobytes()
    for t in (1, 2, 3):
        with parallel.using(t):
            assert parallel.crc32(memoryview(data), 0xDEADBEEF) == zlib.crc32(data, 0xDEADBEEF)


@pytest.mark.parametrize("crc", [0, 0xDEADBEEF, None])
def test_copy_crc32_copies_and_checksums_in_one_pass(small_chunks, monkeypatch, crc):
    """The writer's copy: the bytes land in the output and the CRC is zlib's (continued from a
    running CRC, or none), in pieces and equal parts whose boundaries fall anywhere."""
    import zlib

    monkeypatch.setattr(parallel, "COPY_PIECE", 1000)
    for n in (0, 1, 999, 5 * SMALL_CHUNK + 7):
        src = np.random.default_rng(n).integers(0, 256, n, dtype=np.uint8)
        for t in THREADS:
            out = bytearray(n)
            with parallel.using(t):
                got = parallel.copy_crc32(memoryview(src), memoryview(out), crc)
            assert bytes(out) == src.tobytes()
            assert got == (None if crc is None else zlib.crc32(src, crc))
    with pytest.raises(ValueError, match="3 bytes into a buffer of 2"):
        parallel.copy_crc32(b"abc", bytearray(2))


def test_packed_ids_go_straight_into_the_message_with_their_crc(small_chunks):
    """parallel.pack's payload packs chunk by chunk into the writer's buffer (parts on threads, the
    CRC joined across them) or into one array of its own: bitpack.pack's bytes either way."""
    import zlib

    from mucsc.codec.wire import bitpack

    for width in (0, 1, 3, 4, 8, 11, 16):
        for n in (0, 5, 3 * SMALL_CHUNK + 5):
            ids = np.random.default_rng(width).integers(0, 1 << width, n)
            want = bitpack.pack(ids, width)
            for t in THREADS:
                with parallel.using(t):
                    p = parallel.pack(ids, width)
                    out = bytearray(p.nbytes)
                    assert p.write_into(memoryview(out)) == zlib.crc32(want) and bytes(out) == want, (width, n, t)
                    arr = parallel.pack_array(ids, width)
                    assert arr.dtype == np.uint8 and arr.tobytes() == want and p.tobytes() == want
                    out = bytearray(p.nbytes)  # after host(): copied from the array
                    assert p.write_into(memoryview(out)) == zlib.crc32(want) and bytes(out) == want
