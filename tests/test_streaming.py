"""Checkpoints at LLM scale (issue 35): streamed compress and decompress in every format, random
access (``mucsc.open``, ``--only``), bounded memory, the per-group decoding limit, old files."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import mucsc
from mucsc import tensorfiles as tf
from mucsc.cli.main import main
from mucsc.codec.backends.tensors import bf16_bits
from mucsc.errors import ChecksumError, LimitError, ParameterError

pytestmark = pytest.mark.backends  # the API's encode and decode paths, under every backend

ROOT = Path(__file__).resolve().parents[1]
VALID = ROOT / "spec" / "vectors" / "valid"


def run(args, code=0):
    result = CliRunner().invoke(main, [str(a) for a in args])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    assert result.exit_code == code, (result.exit_code, result.stdout, result.stderr)
    return result


def model(seed=0, rows=96):
    """A small transformer-shaped state_dict as numpy (bfloat16 as float32 values it holds exactly)."""
    rng = np.random.default_rng(seed)

    def bf16(a):
        return (bf16_bits(a).astype(np.uint32) << 16).view(np.float32)

    return {
        "embed.weight": bf16(rng.standard_t(4, (rows, 64)).astype(np.float32) * 0.02),
        "layers.0.q.weight": bf16(rng.standard_t(4, (64, 64)).astype(np.float32) * 0.02),
        "layers.0.norm.weight": bf16((1 + 0.05 * rng.standard_normal(64)).astype(np.float32)),
        "layers.0.mlp.weight": rng.standard_t(4, (128, 64)).astype(np.float32) * 0.02,
        "layers.0.bias": rng.normal(size=128).astype(np.float32),
        "zeros": np.zeros((40, 40), np.float32),
        "step": np.array(7, np.int64),
        "mask": rng.random(30) > 0.5,
    }


BF16 = {"embed.weight", "layers.0.q.weight", "layers.0.norm.weight"}


def write_safetensors(path, tensors):
    """bfloat16 for the BF16 names (no torch: the streamed writer takes bit patterns)."""
    entries = [(k, "bfloat16" if k in BF16 else str(v.dtype), v.shape) for k, v in tensors.items()]
    with tf.atomic_open(path, force=True) as f:
        w = tf.open_writer(f, "safetensors", entries)
        for k, v in tensors.items():
            w.write(k, bf16_bits(v) if k in BF16 else v)
        w.finish()
    return path


def read_all(path):
    """name -> (record dtype, float64 or raw values), through the streamed reader."""
    r = tf.open_reader(path)
    try:
        out = {}
        for i, (name, dtype, _) in enumerate(r.entries):
            v = r.read(i)
            if dtype == "bfloat16" and isinstance(v, np.ndarray):
                v = (v.astype(np.uint32) << 16).view(np.float32)
            elif not isinstance(v, np.ndarray):  # torch bfloat16 from a .pt
                v = v.float().numpy()
            out[name] = (dtype, v)
        return out
    finally:
        r.close()


@pytest.mark.parametrize("suffix", [".safetensors", ".npz", ".pt"])
def test_streamed_round_trip_each_format(tmp_path, suffix):
    """compress reads one tensor at a time; the message decodes to what mucsc.encode's does; decompress
    writes each tensor as decoded, names, dtypes and order kept, every float tensor within 1%."""
    x = model()
    src = tmp_path / f"m{suffix}"
    if suffix == ".safetensors":
        write_safetensors(src, x)
    elif suffix == ".npz":
        tf.save(src, x)
    else:
        torch = pytest.importorskip("torch")
        tf.save(src, {k: (torch.from_numpy(v).to(torch.bfloat16) if k in BF16 else torch.from_numpy(np.asarray(v)))
                      for k, v in x.items()})
    assert tf.capabilities(tf.format_of(src)).open_reader is not None
    run(["compress", src, "-q"])
    msg = tmp_path / f"m{suffix}.mucsc"
    loaded = tf.load(src).tensors  # the in-memory path on the same tensors: same values decoded
    blob = mucsc.encode(loaded, mucsc.get_codec("mucsc", rounding="nearest"), shared=False,
                        policy=mucsc.Policy(max_error=0.01, vector_max_error=0.001))
    ref = mucsc.decode(blob)
    streamed = mucsc.decode(msg.read_bytes())
    assert list(streamed) == list(ref) == list(x)
    for k in ref:
        assert np.array_equal(np.asarray(streamed[k]), np.asarray(ref[k])), k
    for out_suffix in (".safetensors", ".npz"):
        out = tmp_path / f"back{out_suffix}"
        run(["decompress", msg, "-o", out, "-q"])
        a, b = read_all(src), read_all(out)
        assert list(a) == list(b)
        for k, (dt, v) in a.items():
            bdt, w = b[k]
            assert bdt == (dt if out_suffix == ".safetensors" or dt != "bfloat16" else "float32"), k
            assert w.shape == v.shape
            norm = np.linalg.norm(v.astype(np.float64).ravel())
            err = np.linalg.norm((w.astype(np.float64) - v.astype(np.float64)).ravel())
            assert err <= 0.01 * norm + 1e-12, (k, err / max(norm, 1e-30))


def test_streamed_compress_is_deterministic_and_threads_do_not_matter(tmp_path):
    src = write_safetensors(tmp_path / "m.safetensors", model(1, rows=3000))
    run(["compress", src, "-o", tmp_path / "a.mucsc", "-T", "1", "-q"])
    run(["compress", src, "-o", tmp_path / "b.mucsc", "-T", "2", "-q"])
    assert (tmp_path / "a.mucsc").read_bytes() == (tmp_path / "b.mucsc").read_bytes()


def test_bare_npy_streams(tmp_path):
    x = np.random.default_rng(2).normal(size=(50, 40)).astype(np.float32)
    np.save(tmp_path / "a.npy", x)
    run(["compress", tmp_path / "a.npy", "-q"])
    info = mucsc.inspect((tmp_path / "a.npy.mucsc").read_bytes())
    assert info.container == "tensor" and info.records[0].name == ""
    assert (tmp_path / "a.npy.mucsc").read_bytes() == mucsc.encode(  # the in-memory path's bytes
        x, mucsc.get_codec("mucsc", rounding="nearest"), shared=False, policy=mucsc.Policy(max_error=0.01))
    run(["decompress", tmp_path / "a.npy.mucsc", "-o", tmp_path / "b.npy", "-q"])
    y = np.load(tmp_path / "b.npy")
    assert y.shape == x.shape and np.linalg.norm(y - x) <= 0.01 * np.linalg.norm(x)


def test_open_get_tensor_reads_one_group(tmp_path, monkeypatch):
    x = model()
    src = write_safetensors(tmp_path / "m.safetensors", x)
    run(["compress", src, "-q"])
    msg = tmp_path / "m.safetensors.mucsc"
    full = mucsc.decode(msg.read_bytes())  # bfloat16 records: float32 before the bfloat16 rounding
    full = {k: (bf16_bits(v).astype(np.uint32) << 16).view(np.float32) if k in BF16 else v for k, v in full.items()}
    from mucsc.codec.api import messages

    decoded = []
    real = messages._decode_group
    monkeypatch.setattr(messages, "_decode_group",
                        lambda m, gi, g, *a, **k: decoded.append(gi) or real(m, gi, g, *a, **k))
    with mucsc.open(msg) as f:
        assert f.keys() == list(x)
        assert f.metadata() == {}
        got = f.get_tensor("layers.0.mlp.weight")
        assert np.array_equal(got, full["layers.0.mlp.weight"]) and got.dtype == np.float32
        assert len(decoded) == 1  # one group, not the model
        for k in x:
            assert np.array_equal(f.get_tensor(k), full[k]), k
        with pytest.raises(KeyError, match="nope"):
            f.get_tensor("nope")
    with pytest.raises(ParameterError):
        mucsc.open(msg, framework="jax")


def test_open_framework_pt_keeps_bfloat16(tmp_path):
    torch = pytest.importorskip("torch")
    src = write_safetensors(tmp_path / "m.safetensors", model())
    run(["compress", src, "-q"])
    full = mucsc.decode((tmp_path / "m.safetensors.mucsc").read_bytes(), as_torch=True)
    with mucsc.open(tmp_path / "m.safetensors.mucsc", framework="pt") as f:
        for k in full:
            t = f.get_tensor(k)
            assert t.dtype == full[k].dtype and torch.equal(t, full[k]), k


def test_open_a_shared_group_slices_it(tmp_path):
    x = {"a": np.arange(100, dtype=np.float32), "b": -np.arange(50, dtype=np.float32)}
    p = tmp_path / "s.mucsc"
    p.write_bytes(mucsc.encode(x, z=16))  # one shared group
    full = mucsc.decode(p.read_bytes())
    with mucsc.open(p) as f:
        assert np.array_equal(f.get_tensor("b"), full["b"]) and np.array_equal(f.get_tensor("a"), full["a"])


def test_only_decodes_the_matching_tensors(tmp_path):
    x = model()
    src = write_safetensors(tmp_path / "m.safetensors", x)
    run(["compress", src, "-q"])
    msg = tmp_path / "m.safetensors.mucsc"
    run(["decompress", msg, "-o", tmp_path / "o.safetensors", "--only", "layers.0.*", "--only", "step", "-q"])
    got = read_all(tmp_path / "o.safetensors")
    assert list(got) == [k for k in x if k.startswith("layers.0.") or k == "step"]
    r = run(["decompress", msg, "-o", tmp_path / "n.safetensors", "--only", "nothing*"], code=2)
    assert "no tensor matches --only" in r.stderr and not (tmp_path / "n.safetensors").exists()
    run(["decompress", msg, "-o", tmp_path / "one.npy", "--only", "embed.weight", "-q"])
    assert np.load(tmp_path / "one.npy").shape == x["embed.weight"].shape


def test_old_format_files_decode_streamed(tmp_path):
    """Every valid vector (formats 1.0 to 1.2, written by mucsc.encode) reads through the file
    reader and mucsc.open to the values mucsc.decode gives."""
    paths = sorted(VALID.glob("*.mucsc"))
    assert paths
    for p in paths:
        ref = mucsc.decode(p.read_bytes(), max_elements=None, max_expansion=None)
        with open(p, "rb") as f:
            mf = mucsc.MessageFile(f, max_elements=None, max_expansion=None)
            got = {r.name: v for r, v in mf.records()}
        if not isinstance(ref, dict):
            ref = {"": ref}
        assert list(got) == list(ref), p.name
        for k in ref:
            assert np.array_equal(np.asarray(got[k]), np.asarray(ref[k]), equal_nan=True), (p.name, k)
        with mucsc.open(p, max_elements=None, max_expansion=None) as f:
            for k in ref:
                assert np.array_equal(f.get_tensor(k), np.asarray(ref[k]), equal_nan=True), (p.name, k)


def test_file_reader_checks_the_crc_and_the_limits(tmp_path):
    blob = bytearray(mucsc.encode(np.random.default_rng(0).integers(-2**31, 2**31, 1000, dtype=np.int32), "raw"))
    p = tmp_path / "x.mucsc"
    blob[-10] ^= 1  # in the raw payload (the last 4 bytes are the CRC)
    p.write_bytes(bytes(blob))
    with open(p, "rb") as f, pytest.raises(ChecksumError):
        mucsc.MessageFile(f)
    with open(p, "rb") as f:  # random access without the CRC pass: the raw payload is read as it is
        assert mucsc.MessageFile(f, check_crc=False).decode_group(0).size == 1000


def test_default_limit_is_per_group_and_relative():
    """A group above max_elements decodes by default when its sections carry its bytes (a coded
    tensor), while a constant one declared from nothing is refused; an explicit value is a hard cap."""
    from mucsc.codec.api.messages import DEFAULT_MAX_ELEMENTS, check_limits
    from mucsc.codec.wire import container as fmt

    n = DEFAULT_MAX_ELEMENTS + 1
    header = fmt.Header((fmt.Record("w", "float32", (n,)), fmt.Record("v", "float32", (10,))),
                        (fmt.Group("mucsc", {}, (0,), "float32"), fmt.Group("raw", {}, (1,), "float32")))
    check_limits(header, n, DEFAULT_MAX_ELEMENTS, None, {0: n // 2, 1: 72})  # 4 bits per element: fine
    with pytest.raises(LimitError, match="group 0 holds"):
        check_limits(header, n, DEFAULT_MAX_ELEMENTS, None, {0: 300, 1: 72})
    with pytest.raises(LimitError, match="max_elements=1000"):
        check_limits(header, n, 1000, None, {0: n // 2, 1: 72})
    # the model is no longer capped: two groups of 2^27 pass where their sum is above 2^28
    half = DEFAULT_MAX_ELEMENTS // 2 + 1
    two = fmt.Header((fmt.Record("a", "float32", (half,)), fmt.Record("b", "float32", (half,))),
                     (fmt.Group("mucsc", {}, (0,), "float32"), fmt.Group("mucsc", {}, (1,), "float32")))
    check_limits(two, 2 * half, DEFAULT_MAX_ELEMENTS, None, {0: 1000, 1: 1000})


MEMORY_SCRIPT = textwrap.dedent("""
    import resource, sys
    from mucsc.cli.main import main
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    try:
        main(sys.argv[1:], prog_name="mucsc")
    except SystemExit as e:
        assert not e.code, e.code
    print(before, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, "torch" in sys.modules)
""")


@pytest.mark.skipif(bool(os.environ.get("MUCSC_PURE_NUMPY") or os.environ.get("MUCSC_BACKEND")),
                    reason="the streaming does not depend on the backend; in pure numpy this takes minutes")
def test_memory_is_bounded_by_the_largest_tensor_not_the_model(tmp_path):
    """A 64 MiB bfloat16 safetensors file of 16 tensors of 2M elements (128 MiB as float32; the
    in-memory path holds the file and more): streamed compress and decompress each stay below the
    file's size above the interpreter; no torch imported.  ru_maxrss in a subprocess (measured: +10
    MiB for compress, +0 for decompress, whose groups fit in the import's own peak)."""
    rng = np.random.default_rng(0)
    entries = [(f"layers.{i}.weight", "bfloat16", (2048, 1024)) for i in range(16)]
    src = tmp_path / "big.safetensors"
    with tf.atomic_open(src, force=True) as f:
        w = tf.open_writer(f, "safetensors", entries)
        for name, _, shape in entries:
            w.write(name, bf16_bits((rng.standard_normal(shape) * 0.02).astype(np.float32)))
        w.finish()
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    peaks = {}
    for step, args in [("compress", ["compress", str(src), "-o", str(tmp_path / "m.mucsc"), "-q"]),
                       ("decompress", ["decompress", str(tmp_path / "m.mucsc"), "-o", str(tmp_path / "b.safetensors"),
                                       "-q"])]:
        out = subprocess.run([sys.executable, "-c", MEMORY_SCRIPT, *args], capture_output=True, text=True, env=env,
                             timeout=600)
        assert out.returncode == 0, out.stderr
        before, after, torch_loaded = out.stdout.split()
        peaks[step] = (int(after) - int(before)) / 1024  # MiB above the interpreter with mucsc imported
        assert torch_loaded == "False" or os.environ.get("MUCSC_BACKEND") == "torch"
    # one tensor is 4 MiB of bfloat16, 8 MiB as float32; the file 64 MiB (128 MiB as float32)
    assert peaks["compress"] < 64, peaks
    assert peaks["decompress"] < 64, peaks


class _Dict:
    """A TensorSource over a dict of numpy arrays, counting reads."""

    def __init__(self, tensors):
        self.tensors = tensors
        self.entries = [(k, str(v.dtype), v.shape) for k, v in tensors.items()]
        self.reads = []

    def read(self, i):
        self.reads.append(i)
        return list(self.tensors.values())[i]


@pytest.mark.parametrize("how", ["policy", "shared", "dithered"])
def test_reported_errors_are_those_of_the_decoded_tensors(how):
    """encode's per-tensor errors are read from the encoder's own IDs and levels (EncodedGroup.lookup),
    not from a decode: they must still be each decoded tensor's true ||decode - x|| / ||x||.  Streamed
    per-tensor groups (bfloat16 records as their bits: the error before the record's rounding, as
    mucsc.decode returns it), a shared group of several tensors, and a decode that is no lookup."""
    x = model(3, rows=400)
    floats = [k for k, v in x.items() if v.dtype == np.float32 and v.any()]
    if how == "policy":
        src = _Dict({k: bf16_bits(v) if k in BF16 else v for k, v in x.items()})
        src.entries = [(k, "bfloat16" if k in BF16 else d, s) for k, d, s in src.entries]
        out = io.BytesIO()
        stats = mucsc.encode_to(out, src, mucsc.get_codec("mucsc", rounding="nearest"),
                                policy=mucsc.Policy(max_error=0.01))
        blob = out.getvalue()
    else:
        codec = mucsc.get_codec("mucsc", z=16, **({"rounding": "dithered"} if how == "dithered" else {}))
        blob, stats = mucsc.encode_with_stats({k: x[k] for k in floats}, codec, shared=how == "shared")
    got = mucsc.decode(blob)
    coded = [t for t in stats.tensors if t.codec == "mucsc"]
    assert len(coded) >= (3 if how == "policy" else len(floats))
    for t in coded:
        v = x[t.name].astype(np.float64).ravel()
        err = float(np.linalg.norm(np.asarray(got[t.name], np.float64).ravel() - v))
        assert err > 0 and t.abs_error == pytest.approx(err, rel=1e-9), t.name
        assert t.rel_error == pytest.approx(err / float(np.linalg.norm(v)), rel=1e-9), t.name


def test_compress_decodes_nothing_to_measure_its_errors(tmp_path, monkeypatch):
    """A streamed compress checks and reports each tensor's error from the encoder's IDs: no group is
    decoded (a decode beside the tensor was the compress's peak and a third of its time)."""
    from mucsc.codec.codecs.mucsc import Mucsc

    src = write_safetensors(tmp_path / "m.safetensors", model(5, rows=3000))
    decodes = []
    real = Mucsc.decode_array.__func__
    monkeypatch.setattr(Mucsc, "decode_array", classmethod(lambda cls, *a: decodes.append(a[0]) or real(cls, *a)))
    run(["compress", src, "-o", tmp_path / "m.mucsc", "-q"])
    assert decodes == []
    assert mucsc.decode((tmp_path / "m.mucsc").read_bytes()) and decodes  # the counter does count


def test_bfloat16_groups_decode_to_their_rounded_bits(tmp_path):
    """mucsc.open / decompress round a bfloat16 group on the codec's table (Codec.decode_mapped): the
    same bits as rounding the decoded float32 values, for each ID coding (packed, rANS, lanes)."""
    x = model(4, rows=3000)
    src = _Dict({k: bf16_bits(x[k]) for k in BF16})
    src.entries = [(k, "bfloat16", s) for k, _, s in src.entries]
    for coding in ("packed", "rans", "lanes"):
        path = tmp_path / f"{coding}.mucsc"
        with open(path, "wb") as f:
            mucsc.encode_to(f, src, mucsc.get_codec("mucsc", z=16, id_coding=coding), policy=mucsc.Policy())
        full = mucsc.decode(path.read_bytes())  # bfloat16 records: float32 before the rounding
        with mucsc.open(path) as f:
            for k in BF16:
                want = (bf16_bits(full[k]).astype(np.uint32) << 16).view(np.float32)
                assert np.array_equal(f.get_tensor(k), want), (coding, k)


def test_budget_hook_two_passes():
    """The hook a budget planner plugs into: a codec with a message-wide budget is refused without
    ``choose``; a planner reads every tensor (pass 1), then ``choose`` gives each its fixed codec and
    encode_to reads each once more and encodes it once (pass 2), group i with group i's generator."""
    from mucsc.codec.api.policy import Planned

    x = model()
    src = _Dict(x)
    policy = mucsc.Policy()
    budget = mucsc.get_codec("mucsc", bits=4)
    assert not mucsc.streamable(budget) and mucsc.streamable(mucsc.get_codec("mucsc", z=16))
    with pytest.raises(ParameterError, match="choose="):
        mucsc.encode_to(io.BytesIO(), src, budget, policy=policy)
    summaries = {i: float(np.abs(np.asarray(src.read(i), np.float64)).max()) for i in range(len(src.entries))}
    z = {i: 8 if summaries[i] > 0.1 else 4 for i in summaries}  # a toy plan from the summaries

    def choose(i, t):
        if not t.is_float or summaries[i] == 0:
            return "raw"
        return Planned(mucsc.get_codec("mucsc", z=z[i]), (i,))

    src.reads.clear()
    out = io.BytesIO()
    mucsc.encode_to(out, src, budget, policy=policy, choose=choose)
    assert sorted(src.reads) == list(range(len(x)))  # pass 2 read each tensor once
    info = mucsc.inspect(out.getvalue())
    got = mucsc.decode(out.getvalue())
    assert list(got) == list(x)
    for g in info.groups:
        if g.codec == "mucsc":
            (name,) = g.records
            assert g.params["z"] == z[list(x).index(name)]
    again = io.BytesIO()
    mucsc.encode_to(again, _Dict(x), budget, policy=policy, choose=choose)
    assert again.getvalue() == out.getvalue()
