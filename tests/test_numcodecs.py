"""The numcodecs codec and the zarr v3 serializer: config round trip, determinism, decode(out=),
limits, registration through the entry points, and zarr round trips in a temp directory."""

import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest

import mucsc

numcodecs = pytest.importorskip("numcodecs", reason="numcodecs not installed (pip install 'mucsc[numcodecs]')")
from mucsc.numcodecs import Mucsc  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def _x(shape=(4000,), seed=0, dtype="float32"):
    return np.random.default_rng(seed).normal(size=shape).astype(dtype)


def test_config_round_trip_and_registry():
    c = Mucsc(dtype="float32", z=8)
    cfg = c.get_config()
    assert cfg["id"] == "mucsc" and cfg["dtype"] == "<f4" and cfg["codec"] == "mucsc" and cfg["z"] == 8
    assert "solver" in cfg  # defaults are resolved into the stored config
    again = numcodecs.get_codec(cfg)
    assert isinstance(again, Mucsc) and again.get_config() == cfg
    x = _x()
    assert again.encode(x) == c.encode(x)
    other = Mucsc.from_config({"dtype": "<f8", "codec": "qsgd", "s": 3, "seed": 7, "compress": "off"})
    assert other.get_config()["s"] == 3 and other.get_config()["seed"] == 7


@pytest.mark.parametrize("params", [{"z": 16, "rounding": "nearest"}, {"bits": 3, "rounding": "dithered"},
                                    {"max_error": 0.05, "rounding": "nearest"}, {"bits": 2}])
def test_config_round_trips_rounding_and_goals(tmp_path, params):
    """``rounding`` and the goals (``bits=``, ``max_error=``) are stored in the config, come back from it
    (numcodecs registry and a reopened zarr v3 array) and encode the same bytes."""
    c = Mucsc(dtype="<f4", **params)
    cfg = c.get_config()
    assert {k: cfg[k] for k in params} == {k: (float(v) if k == "bits" else v) for k, v in params.items()}
    assert cfg["rounding"] == params.get("rounding", "stochastic")
    again = numcodecs.get_codec(dict(cfg))
    assert again.get_config() == cfg
    x = _x((3000,), seed=5)
    assert again.encode(x) == c.encode(x)
    if "max_error" in params:  # the goal is relative error sqrt(J)/||x||; nearest rounding meets it
        y = c.decode(c.encode(x)).astype(np.float64)
        assert np.linalg.norm(y - x) / np.linalg.norm(x) <= params["max_error"] * (1 + 1e-6)
    zarr = pytest.importorskip("zarr", reason="zarr not installed")
    from mucsc.zarr import MucscCodec

    a = zarr.create_array(str(tmp_path / "a.zarr"), shape=x.shape, chunks=x.shape, dtype="float32",
                          serializer=MucscCodec(**params), compressors=None, fill_value=0.0)
    a[:] = x
    stored = zarr.open_array(str(tmp_path / "a.zarr"), mode="r").metadata.codecs[0].to_dict()["configuration"]
    assert {k: v for k, v in cfg.items() if k not in ("id", "dtype")} == stored
    assert np.array_equal(zarr.open_array(str(tmp_path / "a.zarr"), mode="r")[:], c.decode(c.encode(x)))


def test_lossy_unbiased_and_deterministic():
    c = Mucsc(z=16)
    x = _x((50, 80))
    blob = c.encode(x)
    assert blob == c.encode(x.copy())           # default seed from the chunk's bytes
    assert blob != c.encode(x + 1e-3)           # a different chunk, a different message
    assert len(blob) < x.nbytes / 4
    y = c.decode(blob)
    assert y.dtype == np.float32 and y.shape == (x.size,)
    assert np.abs(y - x.ravel()).mean() < 0.3
    # a fixed seed gives the same bytes too, and differs from the derived one
    assert Mucsc(z=16, seed=3).encode(x) == Mucsc(z=16, seed=3).encode(x)
    # unbiased: the mean over seeds approaches the input
    draws = np.array([Mucsc(z=4, seed=s).decode(Mucsc(z=4, seed=s).encode(x[:1])) for s in range(200)])
    err = draws - x[:1].ravel()
    assert abs(err.mean()) < 5 * err.std() / np.sqrt(err.size)


@pytest.mark.parametrize("dtype", ["<f2", "<f4", "<f8", ">f4", ">f8"])
def test_dtypes_and_decode_into_out(dtype):
    x = _x((30, 40), dtype=dtype)
    c = Mucsc(dtype=dtype, z=16)
    blob = c.encode(x.tobytes())                # untyped buffer, as numcodecs passes it
    assert blob == c.encode(x)
    y = c.decode(blob)
    assert y.dtype == np.dtype(dtype)
    assert np.abs(y.astype(np.float64) - x.ravel()).max() < 2.0
    out = np.zeros((30, 40), dtype=dtype)
    res = c.decode(blob, out=out)
    assert res is out and np.array_equal(out.ravel(), y)
    raw_out = bytearray(x.nbytes)
    c.decode(blob, out=raw_out)
    assert bytes(raw_out) == y.tobytes()


def test_limits_and_errors():
    with pytest.raises(mucsc.ParameterError, match="float16/32/64"):
        Mucsc(dtype="int32")
    with pytest.raises(mucsc.ParameterError):
        Mucsc(dtype="not-a-dtype")
    with pytest.raises(mucsc.ParameterError):
        Mucsc(z=0)
    with pytest.raises(mucsc.UnknownCodecError):
        Mucsc(codec="nope")
    with pytest.raises(mucsc.ParameterError):
        Mucsc(seed=-1)
    with pytest.raises(mucsc.ParameterError):
        Mucsc(compress="fast")
    c = Mucsc()
    with pytest.raises(mucsc.InputError, match="whole number"):
        c.encode(b"\x00" * 7)
    x = _x((100,))
    x[3] = np.nan
    with pytest.raises(mucsc.InputError, match="NaN"):
        c.encode(x)
    blob = c.encode(_x((100,)))
    with pytest.raises(mucsc.InputError, match="out holds"):
        c.decode(blob, out=np.empty(99, np.float32))
    with pytest.raises(mucsc.FormatError):
        c.decode(blob[:-3])
    assert c.decode(c.encode(np.empty(0, np.float32))).size == 0


def test_entry_points_declared_and_loadable(tmp_path, monkeypatch):
    """pyproject declares the entry points, and numcodecs/zarr load them from an installed dist."""
    eps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]
    assert eps["numcodecs.codecs"]["mucsc"] == "mucsc.numcodecs:Mucsc"
    assert eps["zarr.codecs"]["mucsc"] == "mucsc.zarr:MucscCodec"
    # a stand-in installed distribution with the same entry point, found on sys.path
    dist = tmp_path / "mucsc_ep_probe-0.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: mucsc-ep-probe\nVersion: 0.0\n")
    (dist / "entry_points.txt").write_text("[numcodecs.codecs]\nmucsc = mucsc.numcodecs:Mucsc\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    from numcodecs import registry

    saved = registry.codec_registry.pop("mucsc", None)
    try:
        registry.run_entrypoints()
        assert "mucsc" in registry.entries
        assert isinstance(registry.get_codec({"id": "mucsc", "z": 4}), Mucsc)
    finally:
        monkeypatch.undo()
        registry.run_entrypoints()
        if saved is not None:
            registry.codec_registry["mucsc"] = saved


def test_zarr_v3_round_trip(tmp_path):
    zarr = pytest.importorskip("zarr", reason="zarr not installed")
    from mucsc.zarr import MucscCodec

    x = _x((120, 90), seed=1)
    a = zarr.create_array(str(tmp_path / "a.zarr"), shape=x.shape, chunks=(40, 90), dtype="float32",
                          serializer=MucscCodec(z=16), compressors=None, fill_value=0.0)
    a[:] = x
    r = zarr.open_array(str(tmp_path / "a.zarr"), mode="r")
    assert r.metadata.codecs[0].to_dict()["name"] == "mucsc"
    y = r[:]
    assert y.shape == x.shape and y.dtype == np.float32
    assert 0 < np.abs(y - x).mean() < 0.3
    stored = sum(p.stat().st_size for p in (tmp_path / "a.zarr" / "c").rglob("*") if p.is_file())
    assert stored < x.nbytes / 4
    # deterministic: writing the same data again stores the same chunks
    b = zarr.create_array(str(tmp_path / "b.zarr"), shape=x.shape, chunks=(40, 90), dtype="float32",
                          serializer=MucscCodec(z=16), compressors=None, fill_value=0.0)
    b[:] = x
    assert np.array_equal(zarr.open_array(str(tmp_path / "b.zarr"), mode="r")[:], y)
    with pytest.raises(mucsc.ParameterError):
        zarr.create_array(str(tmp_path / "i.zarr"), shape=(10,), dtype="int32", serializer=MucscCodec(),
                          compressors=None)


def test_zarr_serializer_works_off_the_event_loop(tmp_path, monkeypatch):
    """Chunks are encoded and decoded on worker threads, never on the thread running zarr's event loop."""
    zarr = pytest.importorskip("zarr", reason="zarr not installed")
    import threading

    from mucsc.zarr import MucscCodec

    seen = {"encode": set(), "decode": set()}
    loop_threads = set()
    real_encode, real_decode = Mucsc.encode, Mucsc.decode

    def encode(self, buf):
        seen["encode"].add(threading.get_ident())
        return real_encode(self, buf)

    def decode(self, buf, out=None):
        seen["decode"].add(threading.get_ident())
        return real_decode(self, buf, out)

    real_single = MucscCodec._encode_single

    async def encode_single(self, chunk, spec):
        loop_threads.add(threading.get_ident())
        return await real_single(self, chunk, spec)

    monkeypatch.setattr(Mucsc, "encode", encode)
    monkeypatch.setattr(Mucsc, "decode", decode)
    monkeypatch.setattr(MucscCodec, "_encode_single", encode_single)
    x = np.random.default_rng(3).normal(size=(80, 90)).astype("float32")
    a = zarr.create_array(str(tmp_path / "t.zarr"), shape=x.shape, chunks=(40, 90), dtype="float32",
                          serializer=MucscCodec(z=16), compressors=None, fill_value=0.0)
    a[:] = x
    zarr.open_array(str(tmp_path / "t.zarr"), mode="r")[:]
    assert seen["encode"] and seen["decode"] and loop_threads
    assert not (seen["encode"] | seen["decode"]) & loop_threads


def test_zarr_v2_format_with_the_numcodecs_codec(tmp_path):
    zarr = pytest.importorskip("zarr", reason="zarr not installed")
    x = _x((64, 64), seed=2)
    a = zarr.create_array(str(tmp_path / "v2.zarr"), shape=x.shape, chunks=(32, 64), dtype="float32",
                          zarr_format=2, compressors=Mucsc(dtype="<f4", z=16), fill_value=0.0)
    a[:] = x
    r = zarr.open_array(str(tmp_path / "v2.zarr"), mode="r")
    assert isinstance(r.compressors[0], Mucsc)
    assert 0 < np.abs(r[:] - x).mean() < 0.3


def test_import_mucsc_stays_light():
    import subprocess

    code = "import sys, mucsc; print('numcodecs' in sys.modules, 'zarr' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]
