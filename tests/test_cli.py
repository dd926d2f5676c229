"""The ``mucsc`` command through click's CliRunner: round trips in every format, --base, reports,
exit codes and one-line messages for every kind of bad input, atomic outputs."""

from __future__ import annotations

import io
import json
import os
import sys
import zipfile

import numpy as np
import pytest
from click.testing import CliRunner

import mucsc
from mucsc import tensorfiles as tf
from mucsc.cli import report
from mucsc.progress import StageProgress
from mucsc.cli.main import main

torch = pytest.importorskip("torch")


def run(args, code=0, input=None):
    """Invoke the command; assert the exit code and that no Python exception escaped."""
    result = CliRunner().invoke(main, [str(a) for a in args], input=input)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    assert result.exit_code == code, (result.exit_code, result.stdout, result.stderr)
    return result


def one_line_error(result, *fragments):
    err = result.stderr.strip()
    assert "Traceback" not in err
    assert len(err.splitlines()) == 1, err
    assert err.startswith("mucsc: error: ")
    for f in fragments:
        assert f in err, (f, err)
    return err


def checkpoint(seed=0):
    """A small state_dict: float32, float16, bfloat16, an int buffer."""
    g = torch.Generator().manual_seed(seed)
    return {
        "conv.weight": torch.randn(8, 3, 3, 3, generator=g),
        "conv.bias": torch.randn(8, generator=g).half(),
        "fc.weight": torch.randn(10, 40, generator=g).to(torch.bfloat16),
        "bn.num_batches_tracked": torch.tensor(17),
    }


def write_ckpt(path, tensors):
    """Write a torch state_dict in the format named by the suffix (bf16 -> float32 for npz)."""
    if path.suffix == ".pt":
        torch.save(tensors, path)
    else:
        conv = {k: (v.float() if v.dtype == torch.bfloat16 and path.suffix == ".npz" else v)
                for k, v in tensors.items()}
        tf.save(path, conv)
    return path


def as_float64(t):
    return (t.double().numpy() if isinstance(t, torch.Tensor) else np.asarray(t, np.float64))


def dtype_of(t):
    return str(t.dtype).removeprefix("torch.")


# ---- help, version -------------------------------------------------------------------------------

def test_help_version_and_exit_codes_documented():
    for flag in ("-h", "--help"):
        out = run([flag]).stdout
        assert "compress" in out and "decompress" in out and "Exit codes" in out
    from importlib.metadata import version
    assert run(["--version"]).stdout.strip() == f"mucsc {version('mucsc')}"
    out = run(["compress", "-h"]).stdout
    for opt in ("--z", "--keep", "--solver", "--s", "--bucket", "--base", "--per-tensor", "--json"):
        assert opt in out
    assert "mucsc:" in out and "bmucsc:" in out  # the codec list


# ---- round trips ---------------------------------------------------------------------------------

@pytest.mark.parametrize("suffix", [".safetensors", ".pt", ".npz"])
def test_lossless_round_trip_every_input_format(tmp_path, suffix):
    src = write_ckpt(tmp_path / f"m{suffix}", checkpoint())
    before = src.read_bytes()
    run(["compress", src, "--codec", "raw", "-q"])
    msg = tmp_path / f"m{suffix}.mucsc"
    assert msg.exists() and src.read_bytes() == before  # input kept, untouched
    out = tmp_path / f"back{suffix}"
    run(["decompress", msg, "-o", out, "-q"])
    a, b = tf.load(src).tensors, tf.load(out).tensors
    assert list(a) == list(b)
    for k in a:
        assert dtype_of(a[k]) == dtype_of(b[k]) and tuple(a[k].shape) == tuple(b[k].shape), k
        assert np.array_equal(as_float64(a[k]), as_float64(b[k])), k


def test_npy_in_npy_out(tmp_path):
    x = np.random.default_rng(1).normal(size=(50, 20)).astype(np.float32)
    np.save(tmp_path / "w.npy", x)
    run(["compress", tmp_path / "w.npy", "--codec", "mucsc", "--z", "256"])
    assert isinstance(mucsc.decode((tmp_path / "w.npy.mucsc").read_bytes()), np.ndarray)  # bare array
    run(["decompress", tmp_path / "w.npy.mucsc", "-o", tmp_path / "back.npy", "-q"])
    y = np.load(tmp_path / "back.npy")
    assert y.shape == x.shape and y.dtype == x.dtype
    assert np.linalg.norm(y - x) / np.linalg.norm(x) < 0.05  # Z = 256 on Gaussian data: ~1% expected


@pytest.mark.parametrize("out_suffix", [".safetensors", ".pt", ".npz"])
def test_lossy_round_trip_to_every_output_format(tmp_path, out_suffix):
    src = write_ckpt(tmp_path / "m.safetensors", checkpoint())
    run(["compress", src, "-o", tmp_path / "m.mucsc", "--z", "16", "-q"])
    run(["decompress", tmp_path / "m.mucsc", "-o", tmp_path / f"d{out_suffix}", "-q"])
    a, b = tf.load(src).tensors, tf.load(tmp_path / f"d{out_suffix}").tensors
    for k in a:
        want = "float32" if out_suffix == ".npz" and dtype_of(a[k]) == "bfloat16" else dtype_of(a[k])
        assert dtype_of(b[k]) == want and tuple(b[k].shape) == tuple(a[k].shape), k
        x, y = as_float64(a[k]), as_float64(b[k])
        assert np.linalg.norm(y - x) <= 0.6 * np.linalg.norm(x), k  # Z = 16: ~15% expected
    assert int(b["bn.num_batches_tracked"]) == 17  # carried losslessly


def test_default_output_name_and_decompress_name(tmp_path):
    src = write_ckpt(tmp_path / "m.safetensors", checkpoint())
    run(["compress", src, "-q"])
    os.replace(src, tmp_path / "orig.safetensors")
    run(["decompress", tmp_path / "m.safetensors.mucsc", "-q"])
    assert (tmp_path / "m.safetensors").exists()
    r = run(["decompress", tmp_path / "m.safetensors.mucsc"], code=1)  # exists now
    one_line_error(r, "m.safetensors: already exists (-f overwrites it; -o OTHER writes another file)")


def test_deterministic_and_seeded(tmp_path):
    src = write_ckpt(tmp_path / "m.npz", checkpoint())
    # --z 16: at the model default this small checkpoint is all lossless (nothing random to seed);
    # --rounding stochastic: model mode rounds to nearest, where the seed draws nothing
    out = {}
    for name, seed, rounding in [("a", 3, "stochastic"), ("b", 3, "stochastic"), ("c", 4, "stochastic"),
                                 ("n3", 3, "nearest"), ("n4", 4, "nearest")]:
        run(["compress", src, "-o", tmp_path / f"{name}.mucsc", "-q", "--seed", str(seed), "--z", "16",
             "--rounding", rounding])
        out[name] = (tmp_path / f"{name}.mucsc").read_bytes()
    assert out["a"] == out["b"] and out["a"] != out["c"]
    assert out["n3"] == out["n4"]  # nearest rounding is deterministic whatever the seed


def test_per_tensor_and_codec_parameters_reach_the_message(tmp_path):
    src = write_ckpt(tmp_path / "m.pt", checkpoint())
    run(["compress", src, "-o", tmp_path / "p.mucsc", "--per-tensor", "--codec", "bmucsc", "--keep", "0.25",
         "--z", "8", "-q"])
    info = mucsc.inspect((tmp_path / "p.mucsc").read_bytes())
    lossy = [g for g in info.groups if g.codec == "bmucsc"]
    assert [g.records for g in lossy] == [("conv.weight",), ("fc.weight",)] and all(g.params["z"] == 8 for g in lossy)
    # the 8-element float16 bias is smaller stored as it is than coded (issue 10: per-tensor falls back)
    assert [g.codec for g in info.groups if "conv.bias" in g.records] == ["raw"]
    run(["compress", src, "-o", tmp_path / "s.mucsc", "--shared", "--z", "4", "--compress", "off", "-q"])
    info = mucsc.inspect((tmp_path / "s.mucsc").read_bytes())
    assert [g.codec for g in info.groups] == ["mucsc", "raw"] and info.groups[0].params["z"] == 4
    assert all(s.encoding == "raw" for s in info.sections if s.group is not None)


# ---- reports -------------------------------------------------------------------------------------

def test_human_report_totals_line(tmp_path):
    src = write_ckpt(tmp_path / "m.pt", checkpoint())
    r = run(["compress", src, "--z", "16"])
    assert r.stdout == ""  # the report is on stderr, like zstd
    size = (tmp_path / "m.pt.mucsc").stat().st_size
    original = sum(t.numel() * t.element_size() for t in checkpoint().values())
    total = [ln for ln in r.stderr.splitlines() if "total:" in ln][0]
    assert f"{original:,} -> {size:,} bytes, {original / size:.2f}x smaller (original/compressed)" in total
    assert f"{100 * (1 - size / original):.1f}% saved" in total
    assert "bits/element" in total and "J = " in total and "expected relative error" in total


def test_json_reports(tmp_path):
    src = write_ckpt(tmp_path / "m.npz", checkpoint())
    r = run(["compress", src, "--json", "--z", "4"])
    rep = json.loads(r.stdout)
    size = (tmp_path / "m.npz.mucsc").stat().st_size
    assert rep["compressed_bytes"] == size and rep["codec"] == "mucsc" and rep["params"]["z"] == 4
    assert rep["ratio"] == pytest.approx(rep["original_bytes"] / size)
    assert rep["bits_per_element"] == pytest.approx(8 * size / rep["elements"])
    assert rep["J"] > 0 and 0 < rep["relative_error_expected"] < 1
    info = json.loads(run(["info", tmp_path / "m.npz.mucsc", "--json"]).stdout)
    assert info["size"] == size and len(info["records"]) == 4
    t = json.loads(run(["test", tmp_path / "m.npz.mucsc", "--json"]).stdout)
    assert t == [{"file": str(tmp_path / "m.npz.mucsc"), "ok": True, "error": None}]


def test_info_human(tmp_path):
    src = write_ckpt(tmp_path / "m.pt", checkpoint())
    run(["compress", src, "-q", "--z", "16"])
    out = run(["info", tmp_path / "m.pt.mucsc"]).stdout
    assert "conv.weight" in out and "8x3x3x3" in out and "bfloat16" in out
    assert "x smaller (original/compressed)" in out and "CENT" in out


def test_report_helpers():
    assert report.ratio_phrase(1000, 250) == "4.00x smaller (original/compressed), 75.0% saved"
    assert report.ratio_phrase(100, 125) == "1.25x larger (compressed/original), 25.0% more"
    assert report.relative_error(4.0, 100.0) == pytest.approx(0.2)
    assert report.relative_error(None, 1.0) is None
    buf = io.StringIO()
    p = StageProgress(True, buf)
    p.phase("encoding")
    p.done()
    assert "mucsc: encoding..." in buf.getvalue()
    quiet = io.StringIO()
    StageProgress(False, quiet).phase("x")
    assert quiet.getvalue() == ""


# ---- --base --------------------------------------------------------------------------------------

def test_base_round_trip_is_exact_with_a_lossless_codec(tmp_path):
    old = {"w": torch.arange(12, dtype=torch.float32).reshape(3, 4) / 4, "h": torch.arange(6).half() / 2,
           "b": (torch.arange(5) / 8).to(torch.bfloat16), "step": torch.tensor(5)}
    new = {"w": old["w"] + 0.125, "h": old["h"] - 0.5, "b": old["b"] + 0.25, "step": torch.tensor(6)}
    torch.save(old, tmp_path / "old.pt")
    torch.save(new, tmp_path / "new.pt")
    r = run(["compress", tmp_path / "new.pt", "--base", tmp_path / "old.pt", "-o", tmp_path / "u.mucsc",
             "--codec", "raw"])
    assert "update relative to" in r.stderr
    upd = mucsc.decode((tmp_path / "u.mucsc").read_bytes())
    assert np.all(upd["w"] == 0.125) and np.all(upd["h"] == -0.5) and np.all(upd["b"] == 0.25)
    assert int(upd["step"]) == 6  # non-float tensors carried as the NEW values
    run(["decompress", tmp_path / "u.mucsc", "--base", tmp_path / "old.pt", "-o", tmp_path / "r.pt", "-q"])
    back = torch.load(tmp_path / "r.pt", weights_only=True)
    for k in new:
        assert back[k].dtype == new[k].dtype and torch.equal(back[k], new[k]), k
    r = run(["decompress", tmp_path / "u.mucsc", "-o", tmp_path / "u.npz"])
    assert "holds an update relative to 'old.pt'; use --base OLD" in r.stderr


def test_base_lossy_update(tmp_path):
    old = checkpoint(0)
    new = {k: (v + (0.01 * torch.randn(v.shape)).to(v.dtype) if v.is_floating_point() else v + 3)
           for k, v in old.items()}
    write_ckpt(tmp_path / "old.safetensors", old)
    write_ckpt(tmp_path / "new.safetensors", new)
    run(["compress", tmp_path / "new.safetensors", "--base", tmp_path / "old.safetensors",
         "-o", tmp_path / "u.mucsc", "--z", "16", "-q"])
    run(["decompress", tmp_path / "u.mucsc", "--base", tmp_path / "old.safetensors",
         "-o", tmp_path / "r.safetensors", "-q"])
    back = tf.load(tmp_path / "r.safetensors").tensors
    for k, v in new.items():
        x, y, o = as_float64(v), as_float64(back[k]), as_float64(old[k])
        assert dtype_of(back[k]) == dtype_of(v)
        if v.is_floating_point():  # the error is that of the small update, not of the weights
            assert np.linalg.norm(y - x) <= 0.6 * np.linalg.norm(x - o) + 0.01 * np.linalg.norm(x), k
        else:
            assert np.array_equal(x, y)


@pytest.mark.parametrize("change, message", [
    (lambda d: d.update({"conv.bias": torch.zeros(9).half()}), "tensor 'conv.bias' has shape [9]"),
    (lambda d: d.update({"conv.bias": torch.zeros(8)}), "tensor 'conv.bias' is float32"),
    (lambda d: d.pop("conv.bias"), "'conv.bias' only in"),
    (lambda d: d.update({"extra": torch.zeros(1)}), "'extra' only in"),
])
def test_base_mismatch(tmp_path, change, message):
    new = checkpoint()
    old = checkpoint(1)
    change(old)
    torch.save(new, tmp_path / "new.pt")
    torch.save(old, tmp_path / "old.pt")
    r = run(["compress", tmp_path / "new.pt", "--base", tmp_path / "old.pt", "-o", tmp_path / "u.mucsc"],
            code=1)
    one_line_error(r, "old.pt: ", message)
    assert not (tmp_path / "u.mucsc").exists()
    # and when adding back
    torch.save(new, tmp_path / "old_ok.pt")
    run(["compress", tmp_path / "new.pt", "--base", tmp_path / "old_ok.pt", "-o", tmp_path / "u.mucsc", "-q"])
    r = run(["decompress", tmp_path / "u.mucsc", "--base", tmp_path / "old.pt", "-o", tmp_path / "r.pt"],
            code=1)
    one_line_error(r, message)
    assert not (tmp_path / "r.pt").exists()


# ---- bad input: one line, the right exit code, nothing written ------------------------------------

def test_missing_file(tmp_path):
    for args in (["compress", tmp_path / "nope.pt"], ["decompress", tmp_path / "nope.mucsc"],
                 ["info", tmp_path / "nope.mucsc"], ["test", tmp_path / "nope.mucsc"]):
        r = run(args, code=1)
        one_line_error(r, "nope.", "No such file or directory")
    assert os.listdir(tmp_path) == []


def test_unknown_suffix_is_a_usage_error(tmp_path):
    (tmp_path / "m.h5").write_bytes(b"x")
    r = run(["compress", tmp_path / "m.h5"], code=2)
    one_line_error(r, "m.h5: unknown suffix '.h5'", ".safetensors")
    write_ckpt(tmp_path / "m.pt", checkpoint())
    run(["compress", tmp_path / "m.pt", "-q"])
    r = run(["decompress", tmp_path / "m.pt.mucsc", "-o", tmp_path / "out.h5"], code=2)
    one_line_error(r, "out.h5: unknown suffix")
    r = run(["decompress", tmp_path / "m.pt", "-q"], code=2)
    one_line_error(r, "does not end in .mucsc")
    assert sorted(os.listdir(tmp_path)) == ["m.h5", "m.pt", "m.pt.mucsc"]


class _Evil:
    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):  # unpickling would create the marker file
        return (open, (self.marker, "w"))


def test_pickle_that_runs_code_is_refused(tmp_path):
    marker = tmp_path / "PWNED"
    torch.save({"w": torch.ones(3), "payload": _Evil(marker)}, tmp_path / "evil.pt")
    r = run(["compress", tmp_path / "evil.pt"], code=1)
    one_line_error(r, "evil.pt: refused", "weights_only=True")
    assert not marker.exists() and not (tmp_path / "evil.pt.mucsc").exists()
    arr = np.empty(1, dtype=object)
    arr[0] = _Evil(marker)
    np.save(tmp_path / "evil.npy", arr, allow_pickle=True)
    one_line_error(run(["compress", tmp_path / "evil.npy"], code=1), "evil.npy", "not plain numbers")
    assert not marker.exists()


def test_checkpoint_with_non_tensor_entries(tmp_path):
    torch.save({"w": torch.ones(2), "lr": 0.1}, tmp_path / "c.pt")
    one_line_error(run(["compress", tmp_path / "c.pt"], code=1), "c.pt: not a state_dict of tensors",
                   "'lr' (float)")
    torch.save({"state_dict": {"w": torch.ones(2)}, "epoch": 4}, tmp_path / "d.pt")
    r = run(["compress", tmp_path / "d.pt"])
    assert "note: " in r.stderr and "skipped 'epoch'" in r.stderr


def test_zip_bomb_npz(tmp_path, monkeypatch):
    monkeypatch.setattr(tf, "default_max_bytes", lambda: 1 << 20)
    with zipfile.ZipFile(tmp_path / "bomb.npz", "w", compression=zipfile.ZIP_DEFLATED) as zf:
        with zf.open("w.npy", "w") as m:
            np.lib.format.write_array(m, np.zeros(1 << 20, dtype=np.float32))  # 4 MiB declared
    r = run(["compress", tmp_path / "bomb.npz"], code=1)
    one_line_error(r, "bomb.npz: ", "zip bomb")
    assert not (tmp_path / "bomb.npz.mucsc").exists()


def _message(tmp_path):
    write_ckpt(tmp_path / "m.pt", checkpoint())
    run(["compress", tmp_path / "m.pt", "-o", tmp_path / "good.mucsc", "-q"])
    return (tmp_path / "good.mucsc").read_bytes()


@pytest.mark.parametrize("damage, words", [
    (lambda b: b[: len(b) // 2], "truncated"),
    (lambda b: b[:40] + bytes([b[40] ^ 0x10]) + b[41:], "corrupt"),
    (lambda b: b"definitely not a message, just some text", "not a mucsc message"),
    (lambda b: b"", "truncated"),
])
def test_truncated_or_corrupt_message(tmp_path, damage, words):
    (tmp_path / "bad.mucsc").write_bytes(damage(_message(tmp_path)))
    for cmd in (["decompress", tmp_path / "bad.mucsc", "-o", tmp_path / "out.safetensors"],
                ["info", tmp_path / "bad.mucsc"], ["test", tmp_path / "bad.mucsc"]):
        r = run(cmd, code=1)
        one_line_error(r, "bad.mucsc: ", words)
    assert not (tmp_path / "out.safetensors").exists()
    assert sorted(os.listdir(tmp_path)) == ["bad.mucsc", "good.mucsc", "m.pt"]


def test_test_command_several_files(tmp_path):
    good = _message(tmp_path)
    (tmp_path / "bad.mucsc").write_bytes(good[:-1])
    r = run(["test", tmp_path / "good.mucsc", tmp_path / "bad.mucsc"], code=1)
    assert r.stdout == f"{tmp_path / 'good.mucsc'}: OK\n"
    one_line_error(r, "bad.mucsc", "truncated")
    assert run(["test", "-q", tmp_path / "good.mucsc"]).stdout == ""


def test_nan_input_leaves_no_file(tmp_path):
    np.save(tmp_path / "n.npy", np.array([1.0, np.nan], dtype=np.float32))
    one_line_error(run(["compress", tmp_path / "n.npy"], code=1), "n.npy: ", "NaN")
    assert sorted(os.listdir(tmp_path)) == ["n.npy"]


def test_failure_while_writing_leaves_no_partial_file(tmp_path, monkeypatch):
    write_ckpt(tmp_path / "m.pt", checkpoint())
    run(["compress", tmp_path / "m.pt", "-q"])

    def broken(f, tensors):
        f.write(b"half a file")
        raise OSError(28, "No space left on device")

    monkeypatch.setitem(tf._WRITERS, "safetensors", broken)  # the loaded path (stdin)
    monkeypatch.setattr(tf.safetensors.Writer, "write", lambda self, name, values: broken(self._f, None))
    r = run(["decompress", tmp_path / "m.pt.mucsc", "-o", tmp_path / "o.safetensors"], code=1)  # streamed
    one_line_error(r, "No space left on device")
    assert sorted(os.listdir(tmp_path)) == ["m.pt", "m.pt.mucsc"]
    r = run(["decompress", "-", "-o", tmp_path / "o.safetensors"], code=1,
            input=(tmp_path / "m.pt.mucsc").read_bytes())
    one_line_error(r, "No space left on device")
    assert sorted(os.listdir(tmp_path)) == ["m.pt", "m.pt.mucsc"]


def test_overwrite_refused_without_force(tmp_path):
    write_ckpt(tmp_path / "m.npz", checkpoint())
    (tmp_path / "m.npz.mucsc").write_bytes(b"precious")
    one_line_error(run(["compress", tmp_path / "m.npz"], code=1), "already exists (-f overwrites it")
    assert (tmp_path / "m.npz.mucsc").read_bytes() == b"precious"
    run(["compress", tmp_path / "m.npz", "-f", "-q"])
    mucsc.verify((tmp_path / "m.npz.mucsc").read_bytes())
    # never the input itself, even with -f
    r = run(["compress", tmp_path / "m.npz", "-o", tmp_path / "m.npz", "-f"], code=1)
    one_line_error(r, "is also an input")
    assert tf.load(tmp_path / "m.npz").tensors.keys() == checkpoint().keys()


@pytest.mark.parametrize("args, words", [
    (["--codec", "mucsc", "--keep", "0.1"], "--keep: not a parameter of codec 'mucsc'"),
    (["--codec", "nosuch"], "unknown codec 'nosuch'"),
    (["--z", "1"], "z"),
    (["--z", "many"], "'many' is not a valid integer"),
    (["--compress", "sometimes"], "compress must be"),
    (["--seed", "-1"], "seed"),
    (["--bogus"], "No such option"),
])
def test_usage_errors_exit_2(tmp_path, args, words):
    write_ckpt(tmp_path / "m.npz", checkpoint())
    r = run(["compress", tmp_path / "m.npz", *args], code=2)
    assert words in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "m.npz.mucsc").exists()


# ---- stdin / stdout ------------------------------------------------------------------------------

def test_stdin_to_stdout_and_back(tmp_path):
    src = write_ckpt(tmp_path / "m.npz", checkpoint())
    r = run(["compress", "-", "--codec", "raw", "-q"], input=src.read_bytes())
    blob = r.stdout_bytes
    mucsc.verify(blob)
    r = run(["decompress", "-", "-F", "npz", "-q"], input=blob)
    back = tf.load(io.BytesIO(r.stdout_bytes)).tensors
    want = tf.load(src).tensors
    assert list(back) == list(want) and all(np.array_equal(back[k], want[k]) for k in want)
    r = run(["decompress", "-", "-q"], input=blob)  # default stdout format: safetensors
    assert tf.load(io.BytesIO(r.stdout_bytes)).format == "safetensors"
    assert run(["info", "-"], input=blob).stdout.startswith("<stdin>: mucsc message")
    assert run(["test", "-"], input=blob).stdout == "<stdin>: OK\n"
    r = run(["test", "-"], input=blob[:-3], code=1)
    one_line_error(r, "<stdin>: ", "truncated")


def test_json_and_stdout_conflict(tmp_path):
    src = write_ckpt(tmp_path / "m.npz", checkpoint())
    r = run(["compress", src, "-o", "-", "--json"], code=2)
    assert "--json" in r.stderr


# ---- lazy subcommands ----------------------------------------------------------------------------

def _lazy_group(tmp_path, monkeypatch, body):
    from mucsc.cli.lazy import LazyGroup

    pkg = tmp_path / "lazypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "good.py").write_text("import click\nMARK = 1\n@click.command()\ndef hello():\n"
                                 "    click.echo('hello from lazy')\n")
    (pkg / "broken.py").write_text(body)
    monkeypatch.syspath_prepend(str(tmp_path))
    for m in ("lazypkg", "lazypkg.good", "lazypkg.broken"):
        sys.modules.pop(m, None)
    return LazyGroup(name="g", lazy_subcommands={
        "hello": ("lazypkg.good:hello", "Say hello."),
        "broken": ("lazypkg.broken:cmd", "Broken."),
        "absent": ("lazypkg.absent:cmd", "Not there."),
    })


def test_lazy_group(tmp_path, monkeypatch):
    group = _lazy_group(tmp_path, monkeypatch, "import not_a_module_anywhere\n")
    runner = CliRunner()
    r = runner.invoke(group, ["--help"])
    assert r.exit_code == 0 and "Say hello." in r.stdout and "Broken." in r.stdout
    assert "absent" not in r.stdout and "lazypkg.good" not in sys.modules  # help imports nothing
    r = runner.invoke(group, ["hello"])
    assert r.exit_code == 0 and r.stdout == "hello from lazy\n"
    r = runner.invoke(group, ["broken"])
    assert r.exit_code == 2 and "the 'broken' command is not available" in r.stderr
    assert "not_a_module_anywhere" in r.stderr and "Traceback" not in r.stderr
    r = runner.invoke(group, ["absent"])
    assert r.exit_code == 2 and "No such command 'absent'" in r.stderr


def test_lazy_attribute_missing(tmp_path, monkeypatch):
    group = _lazy_group(tmp_path, monkeypatch, "x = 1\n")
    r = CliRunner().invoke(group, ["broken"])
    assert r.exit_code == 2 and "has no 'cmd'" in r.stderr


def test_progress_only_on_a_terminal_for_runs_over_the_delay(tmp_path, monkeypatch):
    from mucsc.cli import main as cli_main

    src = write_ckpt(tmp_path / "m.npz", checkpoint())
    r = run(["compress", src, "-o", tmp_path / "a.mucsc"])
    assert "loading" not in r.stderr  # CliRunner's stderr is not a terminal
    monkeypatch.setattr(cli_main, "_is_terminal", lambda stream: True)
    monkeypatch.setattr(cli_main, "PROGRESS_DELAY_S", 3600)
    r = run(["compress", src, "-o", tmp_path / "b.mucsc"])
    assert "loading" not in r.stderr and "\x1b" not in r.stderr  # a terminal, but done before the delay
    monkeypatch.setattr(cli_main, "PROGRESS_DELAY_S", 0)
    r = run(["compress", src, "-o", tmp_path / "c.mucsc"])  # streamed: one stage, read and encoded
    assert "mucsc: compressing with mucsc" in r.stderr and "\r\x1b[2K" in r.stderr
    r = run(["compress", src, "-o", tmp_path / "e.mucsc", "--shared"])  # loaded whole, then encoded
    assert "mucsc: loading" in r.stderr and "mucsc: encoding with mucsc" in r.stderr
    assert "\r\x1b[2K" in r.stderr
    assert "loading" not in run(["compress", src, "-o", tmp_path / "d.mucsc", "-q"]).stderr


def test_bits_max_error_and_size_options(tmp_path):
    src = write_ckpt(tmp_path / "m.npz", checkpoint())
    n = sum(np.asarray(v).size for v in np.load(src).values())
    run(["compress", src, "-o", tmp_path / "b.mucsc", "--bits", "12", "-q"])
    blob = (tmp_path / "b.mucsc").read_bytes()
    assert 8 * len(blob) <= 12 * n and isinstance(mucsc.inspect(blob).groups[0].params["z"], int)
    run(["compress", src, "-o", tmp_path / "s.mucsc", "--size", str(len(blob) + 100), "-q"])
    assert len((tmp_path / "s.mucsc").read_bytes()) <= len(blob) + 100
    run(["compress", src, "-o", tmp_path / "e.mucsc", "--max-error", "0.1", "--per-tensor", "-q"])
    err = run(["compress", src, "-o", tmp_path / "x.mucsc", "--bits", "2", "--z", "8"], code=2).stderr
    assert "give one of z, bits" in err and "Traceback" not in err


def test_compress_reports_the_resolved_parameters(tmp_path):
    """The report's codec line shows what was written: "auto" choices resolved (id_packing by the
    container, id_coding by each group) and a goal's z per group; never "=auto"."""
    rng = np.random.default_rng(3)
    src = tmp_path / "m.npz"
    tf.save(src, {"a": rng.standard_normal((200, 100)).astype(np.float32),  # 2-D: a model's 1-D
                  "b": (8 * rng.standard_normal((50, 100))).astype(np.float32)})  # tensors go fp16
    r = run(["compress", src, "-f", "--z", "8"])
    # the 20,000-element group's IDs are lane-coded (IDSL smaller than zstd on them), the 5,000-element
    # group's stay packed (IDSL's table does not pay there)
    assert ("codec mucsc z=8 solver=optimal centroid_dtype=float32 id_packing=aligned id_coding=lanes/packed "
            "(per group)") in r.stderr
    r = run(["compress", src, "-f", "--z", "8", "--compress", "off", "--json"])
    assert {"z": 8, "solver": "optimal", "centroid_dtype": "float32", "id_packing": "tight",
            "id_coding": "packed", "rounding": "nearest"}.items() <= json.loads(r.stdout)["params"].items()
    r = run(["compress", src, "-f", "--z", "8", "--rounding", "stochastic", "--json"])  # the user's choice wins
    assert json.loads(r.stdout)["params"]["rounding"] == "stochastic"
    r = run(["compress", src, "-f", "--bits", "2", "--json"])
    params = json.loads(r.stdout)["params"]
    info = mucsc.inspect((tmp_path / "m.npz.mucsc").read_bytes())
    zs = sorted(g.params["z"] for g in info.groups if g.codec == "mucsc")
    assert len(zs) == 2 and params["bits"] == 2.0
    assert params["z"] == (f"{zs[0]}..{zs[1]} (per group)" if zs[0] != zs[1] else zs[0])
    assert params["id_coding"] in ("packed", "rans", "packed/rans (per group)")
    r = run(["compress", src, "-f", "--codec", "bmucsc"])  # model mode: z and max_error per tensor
    line = next(l for l in r.stderr.splitlines() if l.startswith("  codec "))
    assert "auto" not in line and "positions=" in line and "z=" not in line and "max_error" not in line
    r = run(["compress", src, "-f", "--codec", "bmucsc", "--z", "64"])
    assert "bmucsc, one codebook per tensor, Z = 64" in r.stderr and "keep=0.01 z=64" in r.stderr
    r = run(["compress", src, "-f", "--codec", "bmucsc", "--shared"])
    assert "keep=0.01 z=256" in r.stderr


def test_codec_options_are_typed_from_the_params_fields():
    """--positions is a Choice (the union over the codecs), --z an IntRange, --keep a FloatRange with the
    fields' help; a value outside them is a usage error before any file is read."""
    from mucsc.cli.main import compress

    opts = {p.name: p for p in compress.params}
    assert {"golomb", "bitmap", "auto"} <= set(opts["codec_param_positions"].type.choices)
    assert (opts["codec_param_z"].type.min, opts["codec_param_z"].type.max) == mucsc.Z_RANGE
    assert opts["codec_param_keep"].type.min_open and "Fraction of the elements kept" in opts["codec_param_keep"].help
    r = CliRunner().invoke(main, ["compress", "missing.npy", "--codec", "topk", "--positions", "nope"])
    assert r.exit_code == 2 and "--positions" in r.output
    r = CliRunner().invoke(main, ["compress", "missing.npy", "--z", "1"])
    assert r.exit_code == 2 and "--z" in r.output


def test_every_codec_option_has_help_and_rounding_is_a_choice():
    """Every generated option says what it is (no bare 'defaults' line); --rounding lists mucsc's three
    roundings and the model mode's own default; --error-cap takes a percentage like --max-error; the
    levels rate control resolves a goal to are not options."""
    from mucsc.cli.codec_options import CodecParam
    from mucsc.cli.main import CODEC_PARAMS, compress

    opts = {p.name: p for p in compress.params}
    for p in CODEC_PARAMS.values():
        assert isinstance(p, CodecParam) and not opts[p.dest].help.startswith("Defaults"), p.flag
    rounding = opts["codec_param_rounding"]
    assert list(rounding.type.choices) == ["stochastic", "nearest", "dithered"]
    assert "unbiased" in rounding.help and "model mode (no --base): nearest" in rounding.help
    assert opts["codec_param_error_cap"].type.convert("5%", opts["codec_param_error_cap"], None) == 0.05
    assert not {"levels", "levels_by", "grid"} & set(CODEC_PARAMS)
    r = CliRunner().invoke(main, ["compress", "missing.npy", "--rounding", "up"])
    assert r.exit_code == 2 and "--rounding" in r.output and "stochastic" in r.output
    r = CliRunner().invoke(main, ["compress", "missing.npy", "--error-cap", "150%"])
    assert r.exit_code == 2 and "--error-cap" in r.output
