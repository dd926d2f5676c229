"""Hostile input, round 4 (issue 38): decoding takes memory in proportion to its output, and every
length is checked against the element count before the output is allocated.

- every reproducer of shared/data/hostile-4 decodes within 2 x its output + 32 MiB or is refused
  with a MucscError within 32 MiB (a fresh process under RLIMIT_AS, its ru_maxrss high-water mark);
- each codec's decode of a large-n message, traced (tracemalloc), against its output size;
- the pieces: the rANS length bound (FORMAT.md 4.4), the resumable lane decoder, the dithered
  decoder's passes (the same values whatever the pass size), the chunked narrowing of a record.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import mucsc
from mucsc.codec import kernels
from mucsc.codec.backends import tensors
from mucsc.codec.codecs import _dithered, clusters
from mucsc.codec.wire import rans
from mucsc.errors import FormatError
from msgtools import peak_bytes

pytestmark = pytest.mark.backends

ROOT = Path(__file__).resolve().parent.parent
HOSTILE = ROOT.parent / "shared" / "data" / "hostile-4"
MiB = 1 << 20
PURE_NUMPY = kernels.BACKEND == "numpy"

# what each reproducer of issue 38 must do now: "decoded" (its output in MiB) or the error type
EXPECTED = {
    "dither_amp_2e24": 64, "dither_amp_2e25": 128, "dither_amp_2e26": 256, "dither_amp_2e27": 512,
    "rss_bmucsc_bits25_head52": 64, "rss_bmucsc_def_d100000_head52": 64, "rss_bmucsc_lanes_k02_head52": 64,
    "rss_dict_bmucsc_head286": 32.4, "rss_vec_bmucsc_bits_rans_head52": 64, "rss_vec_bmucsc_z4_rice_head52": 64,
    "rss_vec_mucsc_dithered_constant_head51": 4, "rss_vec_mucsc_dithered_constant_head52": 64,
    **{name: "FormatError" for name in (
        "rss_dict_dithered_bitflip850", "rss_dict_dithered_head325", "rss_dict_dithered_head52",
        "rss_dict_dithered_head91", "rss_dith_bits2_d1e6_thr_head53", "rss_dith_bits3_head52",
        "rss_dith_maxerr_head52", "rss_dith_z16_head52", "rss_vec_mucsc_dithered_escape_head52")},
}

STEP = r"""
import json, resource, sys
blob = open(sys.argv[1], "rb").read()
import numpy as np, mucsc
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
with open("/proc/self/statm") as f:
    mapped = int(f.read().split()[0]) * resource.getpagesize()
limit = mapped + (3 << 30)  # what the process has mapped so far + 3 GiB
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
result, out, group = None, 0, 0
try:
    got = mucsc.decode(blob)
    arrays = got.values() if isinstance(got, dict) else [got]
    out = sum(int(a.nbytes) for a in arrays)
    group = sum(g.elements * np.dtype(g.dtype).itemsize for g in mucsc.inspect(blob).groups)
except mucsc.MucscError as exc:
    result = type(exc).__name__
except MemoryError:
    result = "MemoryError"
growth = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024
print(json.dumps({"result": result, "out": out, "group": group, "growth": growth}))
"""


def _decode_in_subprocess(path: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    p = subprocess.run([sys.executable, "-c", STEP, str(path)], capture_output=True, text=True, env=env,
                       timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_hostile4_reproducer_within_its_bound(name):
    path = HOSTILE / f"{name}.mucsc"
    if not path.exists():
        pytest.skip(f"{path} absent (the shared data of issue 38 lives beside the repository)")
    want = EXPECTED[name]
    if PURE_NUMPY and not isinstance(want, str) and want > 8:
        pytest.skip("a decode of over 2^21 elements takes minutes on the numpy reference coder (compiled and "
                    "torch passes run it; test_dithered_passes_* check the numpy passes on small ones)")
    got = _decode_in_subprocess(path)
    if isinstance(want, str):
        assert got["result"] == want
        assert got["growth"] <= 32 * MiB, got
        return
    assert got["result"] is None, got
    assert abs(got["out"] / MiB - want) < 0.5
    # the bound for every file, rss_dict_bmucsc_head286 included: a float16 record of 32 MiB
    # in a float32 group of 64 MiB is decoded into the record a piece at a time (FORMAT.md 3.2)
    assert got["growth"] <= 2 * got["out"] + 32 * MiB, got


# ---- each codec's decode against its output ----------------------------------------------------------

N = 1 << 22
OUT = 4 * N  # float32
CODECS = {  # (encode parameters, bound on the decode's traced peak); dgc and stc decode as topk, none as fp16
    "mucsc-dithered": ({"codec": "mucsc", "rounding": "dithered", "z": 16}, OUT + 16 * MiB),
    "mucsc-idsa": ({"codec": "mucsc", "z": 16, "id_coding": "rans"}, OUT + 6 * MiB),
    "mucsc-idsl": ({"codec": "mucsc", "z": 16}, OUT + OUT // 4 + 8 * MiB),
    "mucsc-packed": ({"codec": "mucsc", "z": 16, "id_coding": "packed"}, OUT + OUT // 4 + 8 * MiB),
    "bmucsc": ({"codec": "bmucsc"}, OUT + 8 * MiB),
    "topk": ({"codec": "topk"}, OUT + 8 * MiB),
    "qsgd": ({"codec": "qsgd"}, OUT + OUT // 4 + 8 * MiB),
    # its two Elias-gamma streams read a block of codes at a time (111.0 MiB when decoded whole)
    "qsgd-elias": ({"codec": "qsgd", "coding": "elias"}, OUT + 8 * MiB),
    "terngrad": ({"codec": "terngrad"}, OUT + OUT // 4 + 8 * MiB),
    "signsgd": ({"codec": "signsgd"}, OUT + OUT // 4 + 8 * MiB),
    "fp16": ({"codec": "fp16"}, OUT + 8 * MiB),
    # the zstd DATA section decompressed straight into the output array
    "raw": ({"codec": "raw"}, OUT + 4 * MiB),
}


@pytest.fixture(scope="module")
def big_vector():
    return np.random.default_rng(38).standard_normal(N).astype(np.float32)


@pytest.mark.parametrize("name", sorted(CODECS))
def test_codec_decode_memory_is_its_output_plus_scratch(name, big_vector):
    if PURE_NUMPY and name in ("mucsc-dithered", "mucsc-idsa"):
        pytest.skip("the numpy reference rANS decoder takes minutes at 2^22 IDs (the passes are checked below)")
    params, bound = CODECS[name]
    blob = mucsc.encode(big_vector, seed=1, **params)
    peak, exc = peak_bytes(mucsc.decode, blob)
    assert exc is None
    assert peak <= bound, f"{name}: peak {peak / MiB:.1f} MiB for {OUT / MiB:.0f} MiB of output"


@pytest.mark.parametrize("name", sorted(set(CODECS) - {"raw"}))  # lossless: a record is its group's dtype
def test_a_float16_record_decodes_without_its_groups_float32_vector(name, big_vector):
    """A float16 record of N elements in a float32 group (FORMAT.md 2.4) takes its 2N bytes plus a
    fixed piece, not the group's 4N bytes of float32 as well (the dict decode of issue 38: 5x)."""
    if PURE_NUMPY and name in ("mucsc-dithered", "mucsc-idsa"):
        pytest.skip("the numpy reference rANS decoder takes minutes at 2^22 IDs (the passes are checked below)")
    params, _ = CODECS[name]
    data = {"w": big_vector[:1000].copy(), "h": big_vector.astype(np.float16)}
    out = sum(a.nbytes for a in data.values())
    blob = mucsc.encode(data, seed=1, **params)
    assert [g.dtype for g in mucsc.inspect(blob).groups] == ["float32"]
    peak, exc = peak_bytes(mucsc.decode, blob)
    assert exc is None
    # a piece of 2^18 values and its scratch (the dithered passes: ~13 MiB); decoding the group's
    # float32 vector first, then the record, took 24.0-29.3 MiB here
    scratch = 16 * MiB if name == "mucsc-dithered" else 12 * MiB
    assert peak <= out + scratch, f"{name}: peak {peak / MiB:.1f} MiB for {out / MiB:.1f} MiB of output"


# ---- the rANS length bound (FORMAT.md 4.4) ------------------------------------------------------------

@pytest.mark.parametrize("seed", range(6))
def test_the_rans_bound_never_refuses_what_the_encoder_writes(seed):
    rng = np.random.default_rng(seed)
    for _ in range(40):
        k = int(rng.integers(2, 30))
        n = int(rng.integers(1, 2500))
        p = rng.dirichlet(np.full(k, float(rng.choice([0.03, 0.3, 1.0]))))
        ids = rng.choice(k, n, p=p)
        W, S = int(rng.integers(1, 6)), int(rng.choice([12, 16, 22]))
        try:
            buf = rans.encode(ids, k, lanes=W, scale_bits=S)
        except ValueError:  # more symbols than the table holds
            continue
        assert np.array_equal(rans.decode(buf, n, k), ids)


def test_a_skewed_stream_claiming_more_ids_is_refused_before_decoding():
    ids = np.zeros(4000, np.int64)
    ids[::50] = 1  # p(0) = 0.98: at least 0.029 bits an ID
    buf = rans.encode(ids, 2)
    assert np.array_equal(rans.decode(buf, ids.size, 2), ids)
    peak, exc = peak_bytes(rans.Lanes, buf, 1 << 30, 2)
    assert isinstance(exc, FormatError) and "cannot be coded" in str(exc)
    assert peak < MiB


def test_a_certain_symbol_is_not_bounded_by_length():
    """f = M: an ID costs nothing, so any n fits 4 bytes a lane (a constant vector's stream)."""
    buf = rans.encode(np.zeros(100, np.int64), 1)
    lanes = rans.Lanes(buf, 100, 1)
    assert rans.min_code_bits(lanes.f, lanes.S) < 0
    assert np.array_equal(rans.decode(buf, 100, 1), np.zeros(100))


@pytest.mark.parametrize("keep_table", [True, False])
def test_lanes_decode_in_any_split_equals_the_whole(keep_table):
    rng = np.random.default_rng(5)
    ids = rng.choice(7, 3001, p=[0.4, 0.2, 0.1, 0.1, 0.1, 0.05, 0.05])
    buf = rans.encode(ids, 7, lanes=5)
    for trial in range(5):
        lanes, parts, left = rans.Lanes(buf, ids.size, 7), [], ids.size
        lanes.keep_table = keep_table
        while left:
            m = int(rng.integers(0, min(left, 700) + 1))
            parts.append(lanes.take(m))
            left -= m
        lanes.finish()
        assert np.array_equal(np.concatenate(parts), ids)


def test_lanes_finish_refuses_an_unfinished_or_corrupt_stream():
    buf = bytearray(rans.encode(np.arange(200) % 3, 3))
    lanes = rans.Lanes(bytes(buf), 200, 3)
    lanes.take(100)
    with pytest.raises(FormatError, match="corrupt rANS stream"):
        lanes.finish()
    buf[-1] ^= 0x55
    with pytest.raises(FormatError):
        rans.decode(bytes(buf), 200, 3)


# ---- the dithered decoder's passes ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def dithered_messages():
    rng = np.random.default_rng(7)
    x = rng.standard_t(2, 20000).astype(np.float32)  # heavy tails: escapes
    return [mucsc.encode(x, "mucsc", rounding="dithered", bits=b, seed=s) for b, s in ((1.0, 1), (3.0, 2), (6.0, 3))]


@pytest.mark.parametrize("chunk", [1, 777, 4096])
def test_dithered_passes_decode_the_same_values(monkeypatch, dithered_messages, chunk):
    whole = [mucsc.decode(b) for b in dithered_messages]
    assert any("QESC" in {s.tag for s in mucsc.inspect(b).sections} for b in dithered_messages)
    monkeypatch.setattr(_dithered, "CHUNK", chunk if chunk > 1 else 1 << 10)
    monkeypatch.setattr(_dithered, "TABLES", 0 if chunk == 777 else _dithered.TABLES)  # tables rebuilt each pass
    monkeypatch.setattr(rans, "VALUES_CHUNK", 333)
    for blob, want in zip(dithered_messages, whole):
        got = mucsc.decode(blob)
        assert got.tobytes() == want.tobytes()


def test_dithered_qesc_errors_are_unchanged(dithered_messages):
    blob = next(b for b in dithered_messages if "QESC" in {s.tag for s in mucsc.inspect(b).sections})
    info = mucsc.inspect(blob)
    group = info.groups[0]
    from mucsc.codec.api.messages import codec_class
    from mucsc.codec.wire import container as fmt
    msg = fmt.read_message(blob)
    sections = dict(msg.group_sections(0))
    n = group.elements
    qesc = bytes(sections["QESC"])
    cls = codec_class("mucsc")
    for bad, why in ((qesc + b"\x00", "bytes after the"), (qesc[:-1], "runs past the end")):
        with pytest.raises(FormatError, match=why):
            cls.decode_array(n, group.params, {**sections, "QESC": memoryview(bad)}, np.dtype(np.float32))


def _outcome(fn):
    """fn()'s values (bytes) or its error (type and message)."""
    try:
        return fn().tobytes()
    except FormatError as exc:
        return type(exc).__name__, str(exc)


def test_dithered_fused_pass_is_the_chunked_path(monkeypatch, dithered_messages):
    """The compiled one-pass decoder (_dithered._fused) gives the chunked path's values, float32 and
    float64, and on damaged sections the chunked path's error, word for word: a stream that ends
    early or does not end in its state, escapes too few, too many, inside the alphabet or out of
    range, a grid decoding beyond float32, element counts that do not fit the lanes."""
    if kernels.compiled("dither_decode") is None:  # both sides would be the chunked path (~17 s of numpy)
        pytest.skip("the compiled kernels are not in use: no one-pass decoder to compare")
    from mucsc.codec.api.messages import codec_class
    from mucsc.codec.wire import container as fmt
    cls = codec_class("mucsc")
    cases = []
    for blob in dithered_messages:
        group = mucsc.inspect(blob).groups[0]
        sections = dict(fmt.read_message(blob).group_sections(0))
        n, params = group.elements, group.params
        cases += [(n, params, sections, np.dtype(np.float32)), (n, params, sections, np.dtype(np.float64)),
                  (n + 1, params, sections, np.dtype(np.float32)), (n - 7, params, sections, np.dtype(np.float32))]
        qidx = bytearray(sections["QIDX"])
        for at in (len(qidx) - 1, len(qidx) // 2, 40, 75):  # tables, lane heads, streams
            bad = bytearray(qidx)
            bad[at] ^= 0x5A
            cases.append((n, params, {**sections, "QIDX": memoryview(bytes(bad))}, np.dtype(np.float32)))
        # the first context's first lane starting from a state of 2^31 or more, or below 2^23
        head = 1 + 4 + int(_dithered._Indices(n, params["symbols"], 0, sections["QIDX"]).lanes[0].p[0]) - 4
        for byte, value in ((3, 0xFF), (3, 0x00)):
            bad = bytearray(qidx)
            bad[head + byte] = value
            cases.append((n, params, {**sections, "QIDX": memoryview(bytes(bad))}, np.dtype(np.float32)))
        grid = bytearray(sections["GRID"])
        grid[:8] = np.float64(1e300).tobytes()  # the step: every value beyond float32
        cases.append((n, params, {**sections, "GRID": memoryview(bytes(grid))}, np.dtype(np.float32)))
        if "QESC" in sections:
            qesc = bytes(sections["QESC"])
            for bad in (qesc + b"\x00", qesc[:-1], b"\x00" + qesc[1:], b"\xff" * 9 + b"\x7f" + qesc[1:],
                        b"\x80" * 12 + qesc):
                cases.append((n, params, {**sections, "QESC": memoryview(bad)}, np.dtype(np.float32)))
    fused = _dithered._fused
    calls = []
    monkeypatch.setattr(_dithered, "_fused", lambda *a: calls.append(1) or fused(*a))
    got = [_outcome(lambda: cls.decode_array(*c)) for c in cases]
    assert len(calls) > len(cases) * 3 // 4  # the others are refused while the sections are parsed
    monkeypatch.setattr(_dithered, "_fused", lambda *a: False)
    want = [_outcome(lambda: cls.decode_array(*c)) for c in cases]
    assert got == want
    assert sum(isinstance(w, tuple) for w in want) >= len(cases) // 2  # most of them are refused


def test_dithered_refuses_before_allocating_for_a_grown_count(dithered_messages):
    """A HEAD that claims 2^26 elements for the sections of 20000: refused, with no allocation for n."""
    from mucsc.codec.wire import container as fmt
    blob = dithered_messages[0]
    msg = fmt.read_message(blob)
    group = mucsc.inspect(blob).groups[0]
    sections = dict(msg.group_sections(0))
    peak, exc = peak_bytes(_dithered.decode, 1 << 26, group.params, sections, np.dtype(np.float32))
    assert isinstance(exc, FormatError) and "cannot be coded" in str(exc)
    assert peak < 16 * MiB  # one pass's scratch of the context count (the old decoder: 1.2 GiB of stream first)


# ---- a record narrower than its group -------------------------------------------------------------------

def test_narrowing_in_chunks_equals_saturate_then_cast(monkeypatch):
    monkeypatch.setattr(tensors, "SATURATE_CHUNK", 1000)
    x = np.random.default_rng(1).standard_normal(5555).astype(np.float32) * 3e4
    x[::7] = 1e6  # beyond float16
    x[3] = -np.inf
    got = tensors.from_record(x, "float16", (5555,), False)
    assert got.dtype == np.float16
    assert got.tobytes() == tensors.saturate(x, "float16").astype(np.float16).tobytes()
    assert np.isfinite(got[::7]).all()


NARROW_CODECS = [("mucsc", {}), ("mucsc", {"rounding": "dithered"}), ("mucsc", {"id_coding": "rans"}),
                 ("mucsc", {"id_coding": "packed"}), ("mucsc", {"z": 300}), ("bmucsc", {"keep": 0.3}),
                 ("topk", {}), ("stc", {}), ("qsgd", {}), ("qsgd", {"coding": "elias"}), ("terngrad", {}),
                 ("signsgd", {}), ("fp16", {}), ("none", {})]


@pytest.mark.parametrize("wide", ["float32", "float64"])
def test_records_decoded_in_pieces_equal_the_whole_vector_cast(monkeypatch, wide):
    """Every codec's pieces (Codec.decode_parts), small enough to straddle records and passes, give
    a narrower record the same bytes as the group's whole vector saturated and cast (FORMAT.md 2.4)."""
    from mucsc.codec.api import messages
    from mucsc.codec.codecs import _cast, base, qsgd, signsgd, terngrad
    rng = np.random.default_rng(38)
    data = {"a": rng.standard_normal(1234).astype(wide), "h": np.clip(rng.standard_normal((50, 61)) * 3e4, -65000, 65000).astype(np.float16),
            "e": np.zeros(0, np.float16), "f": rng.standard_normal(999).astype(np.float32), "z": np.ones(7, np.float16)}
    blobs = [mucsc.encode(data, codec, seed=2, **p) for codec, p in NARROW_CODECS]
    for blob in blobs:
        assert mucsc.inspect(blob).groups[0].dtype == wide
    with monkeypatch.context() as m:
        m.setattr(messages, "_narrows", lambda header, group: False)  # the whole vector, then each record cast
        wants = [mucsc.decode(b) for b in blobs]
    for mod, name, size in ((base, "PART", 104), (clusters, "PART", 104), (_cast, "PART", 104), (clusters, "RANS_CHUNK", 333),
                            (_dithered, "CHUNK", 1 << 10), (qsgd, "CHUNK", 200), (signsgd, "CHUNK", 96), (terngrad, "CHUNK", 100)):
        monkeypatch.setattr(mod, name, size)
    for (codec, p), blob, want in zip(NARROW_CODECS, blobs, wants):
        got = mucsc.decode(blob)
        for k, v in want.items():
            assert got[k].dtype == v.dtype and got[k].shape == v.shape, (codec, p, k)
            assert got[k].tobytes() == v.tobytes(), (codec, p, k)


def test_a_message_file_splits_a_narrowing_group_from_its_records(tmp_path, big_vector):
    """``mucsc decompress``'s reader (MessageFile.records) decodes such a group into its records too:
    the same values as mucsc.decode, without the group's float32 vector (tracemalloc)."""
    data = {"w": big_vector[:1000].copy(), "h": big_vector.astype(np.float16)}
    blob = mucsc.encode(data, "bmucsc", seed=1)
    path = tmp_path / "m.mucsc"
    path.write_bytes(blob)
    want = mucsc.decode(blob)
    with open(path, "rb") as f:
        mf = mucsc.MessageFile(f)
        peak, exc = peak_bytes(lambda: [(rec.name, v) for rec, v in mf.records()])
        got = dict((rec.name, v) for rec, v in mf.records())
    assert exc is None and peak <= 8 * MiB + 12 * MiB, peak / MiB  # 24.0 MiB with the group's vector first
    assert all(got[k].dtype == want[k].dtype and got[k].tobytes() == want[k].tobytes() for k in want)


def test_a_decoder_giving_the_wrong_count_is_refused(monkeypatch):
    from mucsc.codec.codecs.topk import TopK
    blob = mucsc.encode({"a": np.ones(10, np.float32), "h": np.ones(10, np.float16)}, "topk", seed=1)
    for pieces in ([np.zeros(19)], [np.zeros(20), np.zeros(1)], [np.zeros((2, 10))], [[0.0] * 20]):
        monkeypatch.setattr(TopK, "decode_parts", classmethod(
            lambda cls, n, params, sections, dtype, pieces=pieces: iter(pieces)))
        with pytest.raises(FormatError, match="wrong number of values"):
            mucsc.decode(blob)


def test_raw_decodes_into_a_writable_output_of_its_own():
    """A zstd DATA is decompressed straight into the output (no second copy); a stored one is
    copied out of the message: either way the array is the caller's, writable."""
    for x, encoding in ((np.zeros(100_000, np.float32), "zstd"), (np.array([1, -7], np.int16), "raw")):
        blob = mucsc.encode(x, "raw")
        assert next(s for s in mucsc.inspect(blob).sections if s.tag == "DATA").encoding == encoding
        got = mucsc.decode(blob)
        assert got.flags.writeable and got.tobytes() == x.tobytes()
        got[:] = 1  # the message is untouched
        assert mucsc.decode(blob).tobytes() == x.tobytes()


def test_a_signalling_nan_norm_is_refused_without_a_warning():
    """Found by the sections12 campaign on qsgd dicts: a NORM of 0x7F800001 warned ("invalid value
    encountered in cast") before its FormatError."""
    import struct
    import warnings
    import zlib
    from mucsc.codec.wire import container as fmt
    blob = bytearray(mucsc.encode(np.ones(100, np.float32), "qsgd", seed=1))
    norm = next(s for s in fmt.read_message(bytes(blob)).sections if s.tag == "NORM")
    assert norm.encoding == "raw"
    blob[norm.offset: norm.offset + 4] = struct.pack("<I", 0x7F800001)
    blob[-4:] = struct.pack("<I", zlib.crc32(bytes(blob[:-4])))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(FormatError, match="bucket norms must be finite"):
            mucsc.decode(bytes(blob))


@pytest.mark.parametrize("packing", ["2bit", "base3"])
def test_terngrad_decodes_the_same_in_chunks(monkeypatch, packing):
    from mucsc.codec.codecs import terngrad
    x = np.random.default_rng(3).standard_normal(1001).astype(np.float32)
    blob = mucsc.encode(x, "terngrad", packing=packing, seed=1)
    want = mucsc.decode(blob)
    monkeypatch.setattr(terngrad, "CHUNK", 20)
    assert mucsc.decode(blob).tobytes() == want.tobytes()


def test_qsgd_elias_decodes_the_same_in_blocks_and_refuses_alike(monkeypatch):
    """Tiny gamma blocks, reads, runs and pieces give the same values, and each corrupted stream
    the same error, as the default sizes (the streams are read front to back in both)."""
    from mucsc.codec.codecs import base, qsgd
    from mucsc.codec.wire import bitpack
    x = np.random.default_rng(4).standard_normal(3001).astype(np.float32)
    x[::3] = 0
    blob = mucsc.encode(x, "qsgd", coding="elias", s=63, bucket=100, seed=1)
    info = mucsc.inspect(blob)
    n, params = info.groups[0].elements, info.groups[0].params
    sections = {k: bytes(v) for k, v in dict(_group_sections(blob)).items()}
    cases = [dict(sections)]
    for tag in ("INDX", "VALS"):
        b = sections[tag]
        cases += [{**sections, tag: b[:-1]}, {**sections, tag: b + b"\0"}, {**sections, tag: b[:7] + b"\0" * 9 + b[16:]},
                  {**sections, tag: b"\xff" * len(b)}, {**sections, tag: b[:-1] + bytes([b[-1] | 0x80])},
                  {**sections, tag: b[: len(b) // 2]}]
    cases += [{**sections, "INDX": sections["VALS"]}, {**sections, "SIGN": bytes([255 - sections["SIGN"][0]]) + sections["SIGN"][1:]}]

    def outcomes():
        got = []
        for secs in cases:
            try:
                got.append(qsgd.QSGD.decode_array(n, params, {k: memoryview(v) for k, v in secs.items()},
                                                  np.dtype(np.float32)).tobytes())
            except FormatError as e:
                got.append(str(e))
        return got

    want = outcomes()
    assert want[0] == mucsc.decode(blob).tobytes() and len(set(want)) >= 8, set(want)
    for mod, name, size in ((bitpack, "GAMMA_BLOCK", 1), (bitpack, "GAMMA_READ", 3), (qsgd, "ELIAS_CHUNK", 8), (base, "PART", 77)):
        monkeypatch.setattr(mod, name, size)
    assert outcomes() == want


def _group_sections(blob: bytes):
    from mucsc.codec.wire import container as fmt
    return fmt.read_message(blob).group_sections(0)


def test_a_bounded_sections12_campaign_finds_nothing():
    """fuzz/sections12.py's oracle on 200 mutants (the 10-minute campaign: docs/security.md)."""
    if PURE_NUMPY:
        pytest.skip("grown mutants decode millions of rANS IDs: 7 minutes on the numpy reference coder")
    import importlib.util
    spec = importlib.util.spec_from_file_location("sections12", ROOT / "fuzz" / "sections12.py")
    s12 = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(s12)
    res = s12.run(seed=0, mutants=200, seconds=None)
    assert res["mutants"] == 200 and not res["problems"], res["problems"]
    assert res["outcomes"].get("decoded", 0) and res["outcomes"].get("FormatError", 0)
