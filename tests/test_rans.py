"""The static rANS coder of IDSA (spec/FORMAT.md 4.4): round trips, the two backends, bad input."""

import numpy as np
import pytest

from mucsc.codec import kernels
from mucsc.codec.wire import rans
from mucsc.errors import FormatError

pytestmark = pytest.mark.backends  # .ci/run's torch and numpy passes run it too


def ids_for(n, k, seed=0, skew=None):
    rng = np.random.default_rng(seed)
    p = None
    if skew is not None:
        p = np.full(k, (1 - skew) / (k - 1))
        p[k // 2] = skew
    return rng.choice(k, n, p=p).astype(np.uint16)


CASES = [(0, 2), (1, 2), (7, 3), (1000, 3), (40000, 3), (33000, 16), (5000, 300), (20000, 5000)]


@pytest.mark.parametrize("n, k", CASES)
def test_round_trip_and_backends_agree(n, k, monkeypatch):
    ids = ids_for(n, k, skew=0.9 if k == 3 else None)
    blobs = {}
    for backend in (["numpy", "c"] if kernels.c_module() is not None else ["numpy"]):
        monkeypatch.setattr(kernels, "BACKEND", backend)
        blobs[backend] = rans.encode(ids, k)
        assert np.array_equal(rans.decode(blobs[backend], n, k), ids)
        counts = np.bincount(ids, minlength=k)  # counted by the caller: the same payload
        assert rans.encode(ids, k, counts=counts) == blobs[backend]
        if n:
            with pytest.raises(ValueError, match="counts"):
                rans.encode(ids, k, counts=counts + np.eye(k, dtype=np.int64)[0])
    assert len(set(blobs.values())) == 1  # bit-identical twins


def test_backends_agree_at_every_scale_and_lane_count(monkeypatch):
    """The compiled coder's reciprocal step writes the numpy coder's bytes for scales up to 2^22
    (three renormalisation bytes a step) and 1..64 lanes, skewed tables included."""
    if kernels.c_module() is None:
        pytest.skip("compiled kernels not built")
    for seed, (S, W, n, k, skew) in enumerate( ((22, 64, 3000, 3, 0.999), (22, 1, 500, 2, None), (17, 7, 4097, 300, None),
                             (16, 64, 2000, 5, 0.9), (12, 3, 99, 40, None), (20, 33, 5000, 5000, None))):
        ids = ids_for(n, k, seed, skew)
        blobs = []
        for backend in ("numpy", "c"):
            monkeypatch.setattr(kernels, "BACKEND", backend)
            blobs.append(rans.encode(ids, k, lanes=W, scale_bits=S))
        assert blobs[0] == blobs[1], (S, W, n, k)
        assert np.array_equal(rans.decode(blobs[1], n, k), ids)


@pytest.mark.parametrize("skew", [0.5, 0.9, 0.99])
def test_size_is_near_the_entropy_and_estimate_is_close(skew):
    n, k = 50000, 3
    ids = ids_for(n, k, 1, skew)
    blob = rans.encode(ids, k)
    ent = rans.coded_size_bits(np.bincount(ids, minlength=k)) / 8
    assert len(blob) <= ent * 1.01 + 40
    assert abs(rans.estimated_size(ids, k) - len(blob)) <= 0.002 * len(blob) + 8


def test_lanes_and_scale():
    assert rans.lanes_for(100) == 1 and rans.lanes_for(1 << 20) == 64
    f = rans.normalize(np.array([0, 5, 1, 1000]), 8)
    assert f.sum() == 256 and f[0] == 0 and f.min(initial=1) >= 0 and (f[1:] >= 1).all()


def test_the_array_rules_are_the_scalar_ones():
    # the size models that size many tables at once read the reference encoder's lanes and scale
    # bits from these: they must give the scalar rules' values on both sides of every threshold
    n = np.array([0, 1, rans.LANE_ELEMENTS - 1, rans.LANE_ELEMENTS, 3 * rans.LANE_ELEMENTS + 5,
                  rans.MAX_LANES * rans.LANE_ELEMENTS - 1, rans.MAX_LANES * rans.LANE_ELEMENTS, 1 << 30])
    assert rans.lanes_for_each(n.astype(np.float64)).tolist() == [rans.lanes_for(int(v)) for v in n]
    used = np.array([0, 1, 255, rans.SMALL_ALPHABET, rans.SMALL_ALPHABET + 1, 1 << 16])
    assert rans.scale_bits_for_each(used).tolist() == [rans.scale_bits_for(int(u)) for u in used]


@pytest.mark.skipif(kernels.c_module() is None, reason="compiled kernels not built")
def test_the_compiled_normalisation_gives_numpys_table(monkeypatch):
    # proportional rounding, the difference given to the largest or taken from the largest ones down
    # to 1 (ties by symbol), and the refusals: counts sparse, dense, huge, one symbol, all zero
    g = np.random.default_rng(5)
    cases = [np.zeros(5, np.int64), np.array([0, 5, 1, 1000]), np.array([7]), np.array([2 ** 41, 5]),
             np.array([-1, 5]), np.zeros(0, np.int64)]
    for t in range(600):
        A = int(g.integers(1, 300))
        cases.append([g.integers(0, 5, A), (g.random(A) < 0.1) * g.integers(1, 10 ** 6, A),
                      g.integers(0, 10 ** 9, A), g.poisson(g.uniform(0.1, 50), A)][t % 4].astype(np.int64))
    for c in cases:
        for S in (1, 4, 8, 12, 16, 22):
            got = []
            for backend in ("c", "numpy"):
                monkeypatch.setattr(kernels, "BACKEND", backend)
                try:
                    got.append(rans.normalize(c, S).tolist())
                except (ValueError, ZeroDivisionError) as e:
                    got.append(type(e))
            assert got[0] == got[1], (c, S)


@pytest.mark.parametrize("backend", ["numpy", "c"])
def test_corrupt_streams_are_rejected(backend, monkeypatch):
    if backend == "c" and kernels.c_module() is None:
        pytest.skip("no compiled kernels")
    monkeypatch.setattr(kernels, "BACKEND", backend)
    ids = ids_for(3000, 5, 2)
    blob = bytearray(rans.encode(ids, 5))
    for mutate in (lambda b: b.__setitem__(-1, b[-1] ^ 0x41),      # a stream byte
                   lambda b: b.__setitem__(0, 30),                  # S out of range
                   lambda b: b.__setitem__(1, 0),                   # no lanes
                   lambda b: b.__setitem__(2, b[2] ^ 1),            # table sum
                   lambda b: b.extend(b"\0"),                       # extra byte
                   lambda b: b.__delitem__(slice(-3, None))):       # truncated
        bad = bytearray(blob)
        mutate(bad)
        try:
            out = rans.decode(bytes(bad), 3000, 5)
        except FormatError:
            continue
        assert not np.array_equal(out, ids)  # pragma: no cover  (a corruption that decodes must differ)
    with pytest.raises(FormatError):
        rans.decode(b"\x10", 10, 3)


def test_table_reader_fast_path_reads_what_the_loop_reads(monkeypatch):
    """The frequency table's vectorised reader (entries of at most 3 bytes, within the limit) gives
    the loop's values and end, and leaves every malformed table (truncated, an entry past the limit
    or longer than 3 bytes) to the loop, whose errors it keeps."""
    r = rans

    def read(buf, pos, k, limit, fast):
        with monkeypatch.context() as mp:
            if not fast:
                mp.setattr(r, "_short_varints", lambda *a: None)
            try:
                v, p = r._read_varints(buf, pos, k, limit)
                return v.tolist(), p
            except FormatError as e:
                return str(e)

    rng = np.random.default_rng(4)
    for t in range(1500):
        k = int(rng.integers(0, 80))  # both sides of SHORT_TABLE
        vals = rng.integers(0, 1 << int(rng.integers(1, 24)), k, dtype=np.uint64)
        pre = rng.integers(0, 256, int(rng.integers(0, 4)), dtype=np.uint8)
        buf = np.concatenate((pre, np.frombuffer(r._varints(vals), np.uint8),
                              rng.integers(0, 256, int(rng.integers(0, 6)), dtype=np.uint8))).astype(np.uint8)
        if t % 3 == 0 and buf.size:
            buf[rng.integers(0, buf.size)] = rng.integers(0, 256)
        if t % 7 == 0:
            buf = buf[: rng.integers(0, buf.size + 1)]
        limit = int(rng.choice([1 << 10, 1 << 16, 1 << 20]))
        assert read(buf, pre.size, k, limit, True) == read(buf, pre.size, k, limit, False)


def _reference_varints(data: bytes, pos: int, k: int, limit: int):
    """FORMAT.md 4.4's table read byte by byte over the whole buffer (what the readers must match)."""
    vals = []
    for _ in range(k):
        v, shift = 0, 0
        while True:
            if pos >= len(data):
                return "runs past the end"
            b = data[pos]
            pos += 1
            v |= (b & 0x7F) << shift
            if v > limit:
                return "exceeds"
            if not b & 0x80:
                break
            shift += 7
        vals.append(v)
    return vals, pos


def test_table_reader_window_reads_padded_entries():
    """A short table is read from a window of 5 bytes per entry; entries padded with continuation
    bytes past that window (valid LEB128 of small values) are read from the whole section, as before,
    and a table truncated by the section's end is still refused."""
    rng = np.random.default_rng(11)
    for t in range(600):
        k = int(rng.integers(1, 20))
        parts = []
        for _ in range(k):
            v = int(rng.integers(0, 1 << 12))
            pad = int(rng.integers(0, 12)) if rng.random() < 0.4 else 0
            enc = bytearray(rans._varints(np.array([v], np.uint64)))
            if pad:  # the same value with zero groups after it: continuation bit on the last byte
                enc[-1] |= 0x80
                enc += b"\x80" * (pad - 1) + b"\x00"
            parts.append(bytes(enc))
        tail = bytes(rng.integers(0, 256, int(rng.integers(0, 40)), dtype=np.uint8))
        data = b"\x07\x02" + b"".join(parts) + tail
        if t % 5 == 0:
            data = data[: int(rng.integers(2, len(data) + 1))]
        want = _reference_varints(data, 2, k, 1 << 22)
        try:
            v, p = rans._read_varints(np.frombuffer(data, np.uint8), 2, k, 1 << 22)
            got = (v.tolist(), p)
        except FormatError as e:
            got = "runs past the end" if "past the end" in str(e) else "exceeds"
        assert got == want
