"""mucsc.tensorfiles: every format round trips, hostile files are refused with TensorFileError, and
writes are atomic."""

from __future__ import annotations

import io
import json
import os
import pickle
import struct
import zipfile

import numpy as np
import pytest

from mucsc import tensorfiles as tf
from mucsc.errors import MucscError
from mucsc.tensorfiles import TensorFileError

torch = pytest.importorskip("torch")

ALL_NUMPY = {
    "f32": np.arange(12, dtype=np.float32).reshape(3, 4) / 7,
    "f16": np.linspace(-2, 2, 5).astype(np.float16),
    "f64": np.array([[1e-300, -3.5]]),
    "i64": np.array(7, dtype=np.int64),
    "u8": np.arange(4, dtype=np.uint8),
    "b": np.array([True, False]),
    "i32": np.arange(6, dtype=np.int32).reshape(1, 2, 3),
    "empty": np.zeros((0, 3), dtype=np.float32),
}


def assert_same(a, b):
    assert a.keys() == b.keys()
    for k in a:
        x, y = a[k], b[k]
        if isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor):
            assert isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor), k
            assert x.dtype == y.dtype and torch.equal(x, y), k
        else:
            assert x.dtype == y.dtype and x.shape == y.shape and np.array_equal(x, y), k


@pytest.mark.parametrize("suffix", [".safetensors", ".pt", ".npz"])
def test_round_trip_every_dtype(tmp_path, suffix):
    p = tmp_path / f"x{suffix}"
    tf.save(p, ALL_NUMPY)
    got = tf.load(p)
    assert got.format == tf.SUFFIXES[suffix] and not got.bare
    assert_same(ALL_NUMPY, got.tensors)


def test_npy_round_trip_and_fortran_and_big_endian(tmp_path):
    a = np.asfortranarray(np.arange(6, dtype=np.float32).reshape(2, 3))
    np.save(tmp_path / "f.npy", a)
    got = tf.load(tmp_path / "f.npy")
    assert got.bare and np.array_equal(got.tensors[tf.BARE_NAME], a)
    np.save(tmp_path / "be.npy", a.astype(">f8"))
    be = tf.load(tmp_path / "be.npy").tensors[tf.BARE_NAME]
    assert be.dtype == np.float64 and be.dtype.isnative and np.array_equal(be, a)
    tf.save(tmp_path / "o.npy", a)
    assert np.array_equal(np.load(tmp_path / "o.npy"), a)


@pytest.mark.parametrize("suffix", [".safetensors", ".pt"])
def test_bfloat16_round_trips_as_torch(tmp_path, suffix):
    t = {"w": torch.randn(3, 5).to(torch.bfloat16), "n": torch.arange(3)}
    p = tmp_path / f"b{suffix}"
    tf.save(p, t)
    got = tf.load(p).tensors
    assert isinstance(got["w"], torch.Tensor) and got["w"].dtype == torch.bfloat16
    assert torch.equal(got["w"], t["w"]) and np.array_equal(got["n"], t["n"].numpy())


def test_bfloat16_refused_by_npz(tmp_path):
    with pytest.raises(TensorFileError, match="bfloat16"):
        tf.save(tmp_path / "b.npz", {"w": torch.ones(2, dtype=torch.bfloat16)})
    assert os.listdir(tmp_path) == []


def test_safetensors_compatible_both_ways(tmp_path):
    st = pytest.importorskip("safetensors.torch")
    stn = pytest.importorskip("safetensors.numpy")
    ours = tmp_path / "ours.safetensors"
    tf.save(ours, {**ALL_NUMPY, "bf": torch.full((2, 2), 1.5, dtype=torch.bfloat16)})
    theirs = st.load_file(str(ours))
    assert theirs["bf"].dtype == torch.bfloat16 and torch.equal(theirs["bf"], torch.full((2, 2), 1.5,
                                                                                       dtype=torch.bfloat16))
    for k, v in ALL_NUMPY.items():
        assert np.array_equal(theirs[k].numpy(), v)
    ref = tmp_path / "ref.safetensors"
    stn.save_file(ALL_NUMPY, str(ref))
    assert_same(ALL_NUMPY, tf.load(ref).tensors)


def test_names_numpy_savez_would_misread(tmp_path):
    d = {"file": np.ones(2), "allow_pickle": np.zeros(1), "a/b.c": np.arange(3)}
    tf.save(tmp_path / "n.npz", d)
    assert_same(d, tf.load(tmp_path / "n.npz").tensors)
    assert_same(d, dict(np.load(tmp_path / "n.npz")))


def test_streams_are_sniffed(tmp_path):
    for suffix in (".safetensors", ".pt", ".npz", ".npy"):
        p = tmp_path / f"s{suffix}"
        tf.save(p, {"a": np.arange(3.0)} if suffix != ".npy" else np.arange(3.0))
        got = tf.load(io.BytesIO(p.read_bytes()))
        assert got.format == tf.SUFFIXES[suffix]
        assert np.array_equal(next(iter(got.tensors.values())), np.arange(3.0))
    with pytest.raises(TensorFileError, match="<stdin>: not a recognised"):
        tf.load(io.BytesIO(b"hello world, not tensors"))


def test_save_to_stream_needs_format():
    buf = io.BytesIO()
    tf.save(buf, {"a": np.ones(2)}, fmt="npz")
    assert np.array_equal(tf.load(io.BytesIO(buf.getvalue())).tensors["a"], np.ones(2))
    with pytest.raises(TensorFileError):
        tf.save(io.BytesIO(), {"a": np.ones(2)})


# ---- torch checkpoints ---------------------------------------------------------------------------

def test_state_dict_found_inside_checkpoint(tmp_path):
    p = tmp_path / "c.pt"
    torch.save({"epoch": 3, "state_dict": {"w": torch.ones(2)}, "optimizer": {"lr": 0.1}}, p)
    got = tf.load(p)
    assert list(got.tensors) == ["w"]
    assert "state_dict" in got.notes[0] and "'epoch'" in got.notes[0] and "'optimizer'" in got.notes[0]


def test_bare_tensor_checkpoint(tmp_path):
    torch.save(torch.arange(4.0), tmp_path / "t.pt")
    got = tf.load(tmp_path / "t.pt")
    assert got.bare and np.array_equal(got.tensors[tf.BARE_NAME], np.arange(4.0, dtype=np.float32))


def test_non_tensor_entries_are_refused(tmp_path):
    p = tmp_path / "c.pt"
    torch.save({"w": torch.ones(2), "step": 5, "cfg": {"a": 1}}, p)
    with pytest.raises(TensorFileError, match=r"c\.pt: not a state_dict of tensors: entries 'step' \(int\)"):
        tf.load(p)
    torch.save([torch.ones(2)], p)
    with pytest.raises(TensorFileError, match="holds a list"):
        tf.load(p)


class _Evil:
    """Unpickling this would create a marker file (harmless proof that code ran)."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_code_executing_pickles_are_refused(tmp_path):
    marker = tmp_path / "pwned"
    torch.save({"w": torch.ones(2), "x": _Evil(marker)}, tmp_path / "zip.pt")
    (tmp_path / "legacy.pt").write_bytes(pickle.dumps({"w": _Evil(marker)}, protocol=2))
    for name in ("zip.pt", "legacy.pt"):
        with pytest.raises(TensorFileError, match="refused.*would call.*weights_only=True") as e:
            tf.load(tmp_path / name)
        assert name in str(e.value)
        assert not marker.exists()
    arr = np.empty(1, dtype=object)
    arr[0] = _Evil(marker)
    np.save(tmp_path / "obj.npy", arr, allow_pickle=True)
    with pytest.raises(TensorFileError, match="not plain numbers"):
        tf.load(tmp_path / "obj.npy")
    np.savez(tmp_path / "obj.npz", a=arr)
    with pytest.raises(TensorFileError, match="not plain numbers"):
        tf.load(tmp_path / "obj.npz")
    assert not marker.exists()


def test_garbage_pt(tmp_path):
    (tmp_path / "g.pt").write_bytes(b"\x00" * 100)
    with pytest.raises(TensorFileError, match=r"g\.pt: not a torch checkpoint that torch\.load\(weights"):
        tf.load(tmp_path / "g.pt")
    (tmp_path / "z.pt").write_bytes(b"PK\x03\x04" + b"\x00" * 60)
    with pytest.raises(TensorFileError, match=r"z\.pt: not a valid torch zip checkpoint \(File is not a zip"):
        tf.load(tmp_path / "z.pt")


# ---- hostile safetensors -------------------------------------------------------------------------

def _st(header: dict | bytes, data: bytes = b"", declared: int | None = None) -> bytes:
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(raw) if declared is None else declared) + raw + data


@pytest.mark.parametrize("blob, message", [
    (b"\x01\x02", "header length alone"),
    (_st({}, declared=1 << 60), "exceeds the limit"),
    (_st({}, declared=50), "past the end of the file"),
    (_st(b"[1, 2]"), "not a JSON object"),
    (_st(b"{\"a\": "), "not valid JSON"),
    (_st(b'{"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, '
         b'"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}', b"\0" * 4), "duplicate"),
    (_st({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}, b"\0" * 4), "needs 8 bytes"),
    (_st({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
          "b": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 4), "overlap"),
    (_st({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}, b"\0" * 8), "hole"),
    (_st({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 8), "cover 4"),
    (_st({"a": {"dtype": "F32", "shape": [1 << 40], "data_offsets": [0, 1 << 42]}}, b"\0" * 8),
     "truncated file"),
    (_st({"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}, b"\0" * 4), "bad shape"),
    (_st({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 0]}}, b"\0" * 4), "bad data_offsets"),
    (_st({"a": {"dtype": "F8_E4M3", "shape": [1], "data_offsets": [0, 1]}}, b"\0"), "unsupported dtype"),
    (_st({"a": {"dtype": "F32", "shape": [1]}}, b"\0" * 4), "exactly dtype"),
    (_st({"__metadata__": {"x": 1}}), "__metadata__"),
])
def test_hostile_safetensors(tmp_path, blob, message):
    p = tmp_path / "h.safetensors"
    p.write_bytes(blob)
    with pytest.raises(TensorFileError, match=message) as e:
        tf.load(p)
    assert str(e.value).startswith(f"{p}: ")


def test_safetensors_every_truncation_and_flip_raises_only_our_error(tmp_path):
    p = tmp_path / "v.safetensors"
    tf.save(p, {"a": np.arange(3, dtype=np.float32), "b": np.ones((2, 2), np.int16)})
    good = p.read_bytes()
    for cut in range(len(good)):
        try:
            tf.load(io.BytesIO(good[:cut]), fmt="safetensors")
        except TensorFileError:
            continue
        raise AssertionError(f"truncation at {cut} accepted")
    header_end = 8 + struct.unpack_from("<Q", good)[0]
    for i in range(header_end):  # flips in the data area are undetectable by design (no checksum)
        bad = bytearray(good)
        bad[i] ^= 0xFF
        try:
            tf.load(io.BytesIO(bytes(bad)), fmt="safetensors")
        except TensorFileError:
            pass


# ---- npy / npz bombs and truncation --------------------------------------------------------------

def test_truncated_npy(tmp_path):
    np.save(tmp_path / "a.npy", np.arange(100.0))
    raw = (tmp_path / "a.npy").read_bytes()
    (tmp_path / "t.npy").write_bytes(raw[:-8])
    with pytest.raises(TensorFileError, match="truncated"):
        tf.load(tmp_path / "t.npy")
    (tmp_path / "x.npy").write_bytes(raw + b"junk")
    with pytest.raises(TensorFileError, match="holds"):
        tf.load(tmp_path / "x.npy")
    (tmp_path / "h.npy").write_bytes(raw[:20])
    with pytest.raises(TensorFileError, match="not a valid .npy"):
        tf.load(tmp_path / "h.npy")


def _npz_with_member(path, member_name, npy_bytes):
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as zf:
        zf.writestr(member_name, npy_bytes)


def test_npz_bomb_refused_before_inflating(tmp_path):
    bomb = tmp_path / "bomb.npz"
    hdr = io.BytesIO()
    np.lib.format.write_array_header_1_0(hdr, {"descr": "<f4", "fortran_order": False,
                                               "shape": (8 << 20,)})
    with zipfile.ZipFile(bomb, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        with zf.open("w.npy", "w", force_zip64=True) as m:
            m.write(hdr.getvalue())
            zero = bytes(1 << 22)
            for _ in range(8):  # 32 MiB inflated from ~32 KB
                m.write(zero)
    assert bomb.stat().st_size < 256 << 10
    with pytest.raises(TensorFileError, match="zip bomb") as e:
        tf.load(bomb, max_bytes=8 << 20)
    assert str(e.value).startswith(f"{bomb}: ")


def test_npz_member_lying_about_its_size(tmp_path):
    buf = io.BytesIO()
    np.save(buf, np.zeros(1000, dtype=np.float32))
    p = tmp_path / "lie.npz"
    _npz_with_member(p, "w.npy", buf.getvalue())
    raw = bytearray(p.read_bytes())
    # the .npy header inside claims 10x the elements the member holds
    i = raw.find(b"(1000,)")
    raw[i: i + 7] = b"(9999,)"
    p.write_bytes(bytes(raw))
    with pytest.raises(TensorFileError, match=r"lie\.npz\[w\]: array float32 \(9999,\) needs"):
        tf.load(p)


def test_npz_odd_members(tmp_path):
    p = tmp_path / "o.npz"
    with zipfile.ZipFile(p, "w") as zf:
        zf.writestr("readme.txt", b"hi")
    with pytest.raises(TensorFileError, match="not a .npy array"):
        tf.load(p)
    (tmp_path / "z.npz").write_bytes(b"PK\x03\x04 not really")
    with pytest.raises(TensorFileError, match="not a valid .npz"):
        tf.load(tmp_path / "z.npz")


# ---- names, suffixes, atomic writes --------------------------------------------------------------

def test_unknown_suffix_and_missing_file(tmp_path):
    with pytest.raises(TensorFileError, match=r"m\.h5: unknown suffix '\.h5'; known"):
        tf.load(tmp_path / "m.h5")
    with pytest.raises(TensorFileError, match="No such file"):
        tf.load(tmp_path / "missing.npz")
    assert issubclass(TensorFileError, MucscError)


def test_atomic_write_leaves_nothing_on_error(tmp_path):
    target = tmp_path / "out.safetensors"
    with pytest.raises(TensorFileError, match="cannot be stored"):
        tf.save(target, {"ok": np.ones(3), "bad": np.array(["text"])})
    assert os.listdir(tmp_path) == []
    with pytest.raises(RuntimeError):
        with tf.atomic_open(tmp_path / "x.bin") as f:
            f.write(b"partial")
            raise RuntimeError("boom")
    assert os.listdir(tmp_path) == []


def test_overwrite_needs_force(tmp_path):
    p = tmp_path / "a.npz"
    tf.save(p, {"a": np.ones(1)})
    with pytest.raises(TensorFileError, match="already exists"):
        tf.save(p, {"a": np.zeros(1)})
    assert tf.load(p).tensors["a"][0] == 1
    tf.save(p, {"a": np.zeros(1)}, force=True)
    assert tf.load(p).tensors["a"][0] == 0
    assert sorted(os.listdir(tmp_path)) == ["a.npz"]
    assert (p.stat().st_mode & 0o777) == 0o666 & ~_umask()


def _umask():
    m = os.umask(0o022)
    os.umask(m)
    return m


def test_npy_needs_exactly_one_array(tmp_path):
    with pytest.raises(TensorFileError, match="holds one array"):
        tf.save(tmp_path / "two.npy", {"a": np.ones(1), "b": np.ones(1)})
    assert os.listdir(tmp_path) == []
