"""``mucsc compress`` defaults by use (model / update / --shared), per-tensor quality in the report,
and the JSON keys shared by ``compress --json`` and ``info --json``."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest

import mucsc
from mucsc import tensorfiles as tf
from mucsc import progress
from mucsc.progress import StageProgress
from clitools import run


def model(seed=0):
    rng = np.random.default_rng(seed)
    return {"conv.weight": (rng.standard_t(4, size=(32, 16, 3, 3)) * 0.05).astype(np.float32),
            "conv.bias": (rng.normal(size=32) * 0.01 + 0.5).astype(np.float32),
            "fc.weight": (rng.normal(size=(128, 256)) * 0.02).astype(np.float32),
            "fc.bias": np.zeros(128, np.float32), "steps": np.array([5], np.int64)}


@pytest.fixture
def ckpt(tmp_path):
    path = tmp_path / "m.safetensors"
    tf.save(path, model())
    return path


def rel(a, b):
    return np.linalg.norm(np.asarray(a, np.float64) - b) / np.linalg.norm(np.asarray(b, np.float64))


def test_model_default_keeps_every_tensor_within_one_percent(ckpt, tmp_path):
    r = run(["compress", ckpt])
    assert "model mode (no --base)" in r.stderr and "1% relative error" in r.stderr
    assert "worst tensors by relative error" in r.stderr and "warning" not in r.stderr
    run(["decompress", f"{ckpt}.mucsc", "-o", tmp_path / "r.safetensors"])
    out, sd = tf.load(tmp_path / "r.safetensors").tensors, model()
    for k, v in sd.items():
        if v.dtype.kind == "f" and np.any(v):
            assert rel(out[k], v) <= 0.01, k
        else:
            assert np.array_equal(out[k], v), k


def test_max_error_option_and_its_usage_errors(ckpt, tmp_path):
    r = run(["compress", ckpt, "-o", tmp_path / "a.mucsc", "--max-error", "5%", "--json"])
    rep = json.loads(r.stdout)
    assert rep["mode"] == "model" and rep["max_error"] == pytest.approx(0.05)
    assert all(t["rel_error"] <= 0.05 for t in rep["tensors"])
    for bad in ("0", "150%", "abc"):
        assert run(["compress", ckpt, "-o", tmp_path / "b.mucsc", "--max-error", bad], code=2)
    assert "give one of z" in run(["compress", ckpt, "-o", tmp_path / "b.mucsc", "--max-error", "1%", "--z",
                                   "16"], code=2).stderr
    assert "not a parameter of codec 'qsgd'" in run(["compress", ckpt, "-o", tmp_path / "b.mucsc", "--max-error",
                                                     "1%", "-c", "qsgd"], code=2).stderr
    # --shared: the bound holds for the one flattened vector (the codec's own max_error)
    r = run(["compress", ckpt, "-o", tmp_path / "s.mucsc", "--max-error", "2%", "--shared", "--json"])
    assert json.loads(r.stdout)["relative_error_expected"] <= 0.02


def test_shared_on_a_model_warns_and_names_the_worst_tensor(ckpt, tmp_path):
    r = run(["compress", ckpt, "-o", tmp_path / "s.mucsc", "--shared", "--z", "16"])
    assert "--shared: all float tensors as one vector, one codebook" in r.stderr
    warn = [ln for ln in r.stderr.splitlines() if ln.startswith("mucsc: warning:")]
    assert len(warn) == 1 and "fc.bias" in warn[0] and "10% relative error" in warn[0]


def test_update_mode_default_and_no_warning(ckpt, tmp_path):
    new = {k: (v + np.float32(1e-3) * np.random.default_rng(1).normal(size=v.shape).astype(np.float32)
               if v.dtype.kind == "f" and k != "fc.bias" else v) for k, v in model().items()}
    tf.save(tmp_path / "new.safetensors", new)
    r = run(["compress", tmp_path / "new.safetensors", "--base", ckpt, "-o", tmp_path / "u.mucsc", "--json"])
    rep = json.loads(r.stdout)
    assert rep["mode"] == "update" and "update mode (--base given)" in rep["mode_reason"]
    assert rep["warning"] is None and rep["ratio"] >= 8
    info = mucsc.inspect((tmp_path / "u.mucsc").read_bytes())
    assert {g.params.get("z") for g in info.groups if g.codec == "mucsc"} == {16}
    by = {t["name"]: t for t in rep["tensors"]}
    assert by["fc.bias"]["rel_error"] == 0.0  # an all-zero update: exact


def test_codec_without_codebook_is_not_called_a_codebook(ckpt, tmp_path):
    for codec in ("fp16", "qsgd"):
        r = run(["compress", ckpt, "-o", tmp_path / f"{codec}.mucsc", "-c", codec, "--shared"])
        body = r.stderr.split("\n", 1)[1]  # not the first line: it holds the file names
        assert "codebook" not in body and "one group" in body
        r = run(["compress", ckpt, "-o", tmp_path / f"{codec}2.mucsc", "-c", codec])
        body = r.stderr.split("\n", 1)[1]
        assert "codebook" not in body and "one group per tensor" in body


def test_compress_and_info_json_share_keys(ckpt, tmp_path):
    rep = json.loads(run(["compress", ckpt, "-o", tmp_path / "m.mucsc", "--json"]).stdout)
    info = json.loads(run(["info", tmp_path / "m.mucsc", "--json"]).stdout)
    for key in ("original_bytes", "compressed_bytes", "elements", "ratio", "ratio_basis", "bits_per_element",
                "saved_percent"):
        assert rep[key] == info[key], key
    assert "tensor bytes" in rep["ratio_basis"]
    assert [t["name"] for t in rep["tensors"]] == [t["name"] for t in info["tensors"]] == list(model())
    for a, b in zip(rep["tensors"], info["tensors"]):
        assert set(a) == set(b)
        assert {k: a[k] for k in ("name", "dtype", "shape", "codec", "group")} == \
               {k: b[k] for k in ("name", "dtype", "shape", "codec", "group")}
        assert a["bits_per_element"] == pytest.approx(b["bits_per_element"])
        assert b["rel_error"] is None  # a message alone cannot know the error


def test_progress_line_with_a_terminal_reporting_zero_columns(monkeypatch):
    monkeypatch.setattr(progress.os, "get_terminal_size", lambda fd: __import__("os").terminal_size((0, 0)))
    monkeypatch.delenv("COLUMNS", raising=False)

    class Tty(io.StringIO):
        def fileno(self):
            return 2

    p = StageProgress(True, Tty(), total=10, clock=lambda: 0.0)
    assert p.columns == 80
    p.phase("loading model.safetensors", 5)
    assert "loading model.safetensors..." in p.render()
    p.done()


def test_decompress_refuses_a_wrong_base_naming_both_fingerprints(ckpt, tmp_path):
    new = {k: (v + np.float32(0.01) if v.dtype.kind == "f" else v) for k, v in model().items()}
    tf.save(tmp_path / "new.safetensors", new)
    run(["compress", tmp_path / "new.safetensors", "--base", ckpt, "-o", tmp_path / "u.mucsc", "-q"])
    meta = mucsc.inspect((tmp_path / "u.mucsc").read_bytes()).meta
    assert meta["mucsc.base_fingerprint"] == mucsc.fingerprint(model())
    other = {k: (v * 2 if v.dtype.kind == "f" else v) for k, v in model().items()}  # same layout, other values
    tf.save(tmp_path / "other.safetensors", other)
    r = run(["decompress", tmp_path / "u.mucsc", "--base", tmp_path / "other.safetensors", "-o",
             tmp_path / "r.safetensors"], code=1)
    err = r.stderr.strip()
    assert len(err.splitlines()) == 1 and "not the base" in err
    assert mucsc.fingerprint(other) in err and meta["mucsc.base_fingerprint"] in err
    assert not (tmp_path / "r.safetensors").exists()
    r = run(["decompress", tmp_path / "u.mucsc", "--base", tmp_path / "other.safetensors", "-o",
             tmp_path / "r.safetensors", "--ignore-base-mismatch"])
    assert "differs" in r.stderr and (tmp_path / "r.safetensors").exists()
    # the right base, read from another file format, matches
    tf.save(tmp_path / "old.npz", model())
    run(["decompress", tmp_path / "u.mucsc", "--base", tmp_path / "old.npz", "-o", tmp_path / "ok.safetensors"])


def test_fingerprint_is_order_and_format_independent():
    sd = model()
    assert mucsc.fingerprint(sd) == mucsc.fingerprint(dict(reversed(list(sd.items()))))
    assert mucsc.fingerprint(sd).startswith("blake2b-256:") and len(mucsc.fingerprint(sd)) == 12 + 64
    changed = dict(sd, steps=np.array([6], np.int64))
    assert mucsc.fingerprint(changed) != mucsc.fingerprint(sd)
    renamed = {("x" + k if k == "steps" else k): v for k, v in sd.items()}
    assert mucsc.fingerprint(renamed) != mucsc.fingerprint(sd)
    reshaped = dict(sd, **{"fc.weight": sd["fc.weight"].reshape(256, 128)})
    assert mucsc.fingerprint(reshaped) != mucsc.fingerprint(sd)


def test_model_keeps_1d_tensors_within_a_tenth_of_a_percent_and_lossless_globs(ckpt, tmp_path):
    r = run(["compress", ckpt, "-o", tmp_path / "a.mucsc", "--lossless", "conv.w*", "--json"])
    rep = json.loads(r.stdout)
    by = {t["name"]: t for t in rep["tensors"]}
    assert by["conv.bias"]["codec"] == "fp16" and by["conv.bias"]["rel_error"] <= 0.001
    assert by["conv.weight"]["codec"] == "raw" and by["conv.weight"]["rel_error"] == 0
    assert "conv.w*" in rep["mode_reason"]
    assert "not with --shared" in run(["compress", ckpt, "-o", tmp_path / "b.mucsc", "--shared", "--lossless",
                                       "x"], code=2).stderr


def test_model_bits_budget_caps_errors_and_json_warnings_go_to_stderr_too(tmp_path):
    rng = np.random.default_rng(1)
    sd = {"big.weight": rng.standard_t(4, (512, 512)).astype(np.float32),
          "key.weight": (1e-3 * rng.standard_normal((32, 64))).astype(np.float32),
          "ln.weight": np.ones(512, np.float32) + 0.01}
    path = tmp_path / "m.safetensors"
    tf.save(path, sd)
    rep = json.loads(run(["compress", path, "-o", tmp_path / "a.mucsc", "--bits", "4.5", "--json"]).stdout)
    assert max(t["rel_error"] for t in rep["tensors"]) <= 0.10 and rep["warning"] is None
    r = run(["compress", path, "-o", tmp_path / "b.mucsc", "--bits", "1.2", "--json"])
    rep = json.loads(r.stdout)
    assert rep["warning"] and "below the smallest message that keeps every tensor within 10%" in rep["warning"]
    assert f"mucsc: warning: {rep['warning']}" in r.stderr and "big.weight" in rep["warning"]


def test_help_states_model_modes_real_defaults():
    text = " ".join(run(["compress", "-h"]).stdout.split())
    assert "defaults: model mode (no --base): 1% per tensor" in text
    assert "--lossless PATTERN" in text
