"""The CLI and file loading misused on purpose (issue 9, items 10-12): signals clean up temporary
outputs, loading a file is bounded by default, write errors name the file, --base IN IN is noted."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

from mucsc import tensorfiles as tf
from clitools import run

ROOT = Path(__file__).resolve().parent.parent


# ---- 10. SIGTERM / SIGHUP while writing ---------------------------------------------------------------

SIGNAL_SCRIPT = """
import os, signal, sys
sig = getattr(signal, sys.argv[1])
os.fsync = lambda fd: os.kill(os.getpid(), sig)  # the signal arrives while OUT.tmpXXXX exists
from mucsc.cli.main import main
main(sys.argv[2:], prog_name="mucsc")
"""


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGHUP"])
@pytest.mark.parametrize("cmd", ["compress", "decompress"])
def test_signal_while_writing_leaves_no_temporary_file(tmp_path, sig, cmd):
    import signal

    src = tmp_path / "x.npy"
    np.save(src, np.arange(1000, dtype=np.float32))
    if cmd == "compress":
        args = ["compress", str(src), "-o", str(tmp_path / "x.mucsc")]
    else:
        run(["compress", src, "-o", tmp_path / "x.mucsc"])
        args = ["decompress", str(tmp_path / "x.mucsc"), "-o", str(tmp_path / "y.npy")]
    before = set(os.listdir(tmp_path))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.run([sys.executable, "-c", SIGNAL_SCRIPT, sig, *args], env=env, capture_output=True,
                       timeout=120)
    assert p.returncode == -getattr(signal, sig), (p.returncode, p.stderr.decode())
    assert set(os.listdir(tmp_path)) == before  # no OUT, no OUT.tmpXXXX
    assert b"Traceback" not in p.stderr


# ---- 11. bounded loading --------------------------------------------------------------------------------

def test_load_limit_numbers(monkeypatch):
    monkeypatch.setattr(tf, "default_max_bytes", lambda: 1 << 40)
    assert tf.load_limit(1000) == 256 << 20
    assert tf.load_limit(1 << 30) == 32 << 30
    monkeypatch.setattr(tf, "default_max_bytes", lambda: 1 << 30)
    assert tf.load_limit(1 << 30) == 1 << 30


def _npz_bomb(path: Path, declared: int) -> None:
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        with zf.open("w.npy", "w", force_zip64=True) as m:
            np.lib.format.write_array(m, np.zeros(declared // 4, dtype=np.float32))


def test_npz_bomb_refused_by_default_with_a_way_out(tmp_path, monkeypatch):
    monkeypatch.setattr(tf, "LOAD_FLOOR_BYTES", 1 << 20)
    bomb = tmp_path / "bomb.npz"
    _npz_bomb(bomb, 8 << 20)  # 8 MiB from ~8 KB: 1000x
    assert bomb.stat().st_size < 64 << 10
    with pytest.raises(tf.TensorFileError, match="--max-memory") as e:
        tf.load(bomb)
    assert "default limit" in str(e.value) and "zip bomb" in str(e.value)
    r = run(["compress", bomb], code=1)
    assert "--max-memory" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "bomb.npz.mucsc").exists()
    run(["compress", "--max-memory", "none", bomb])
    run(["compress", "--max-memory", "16M", bomb, "-o", tmp_path / "b2.mucsc"])
    r = run(["compress", "--max-memory", "1M", bomb, "-o", tmp_path / "b3.mucsc"], code=1)
    assert "the limit given" in r.stderr


def test_torch_views_larger_than_their_storage(tmp_path):
    torch = pytest.importorskip("torch")
    p = tmp_path / "views.pt"
    torch.save({"w": torch.zeros(1).expand(100_000_000)}, p)  # 400 MB of tensor over one float
    assert p.stat().st_size < 4096
    with pytest.raises(tf.TensorFileError, match="the tensors take 400000000 bytes"):
        tf.load(p)
    r = run(["compress", p], code=1)
    assert "--max-memory" in r.stderr
    small = tmp_path / "ok.pt"
    torch.save({"w": torch.ones(10).expand(4, 10)}, small)  # a small view: under the floor
    assert tf.load(small).tensors["w"].shape == (4, 10)


def test_max_memory_rejects_bad_sizes(tmp_path):
    np.save(tmp_path / "a.npy", np.ones(3, np.float32))
    r = run(["compress", "--max-memory", "lots", tmp_path / "a.npy"], code=2)
    assert "not a size" in r.stderr


# ---- 12. ENOSPC names the file; --base IN IN is noted -------------------------------------------------

def test_no_space_left_names_the_file(tmp_path, monkeypatch):
    np.save(tmp_path / "a.npy", np.ones(100, np.float32))

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    out = tmp_path / "a.mucsc"
    r = run(["compress", tmp_path / "a.npy", "-o", out], code=1)
    assert f"{out}: No space left on device" in r.stderr
    assert os.listdir(tmp_path) == ["a.npy"]
    monkeypatch.undo()
    run(["compress", tmp_path / "a.npy", "-o", out])
    monkeypatch.setattr(os, "fsync", full)
    r = run(["decompress", out, "-o", tmp_path / "b.npy"], code=1)
    assert f"{tmp_path / 'b.npy'}: No space left on device" in r.stderr
    assert sorted(os.listdir(tmp_path)) == ["a.mucsc", "a.npy"]


def test_base_equal_to_input_is_noted(tmp_path):
    np.save(tmp_path / "a.npy", np.arange(10, dtype=np.float32))
    r = run(["compress", tmp_path / "a.npy", "--base", tmp_path / "a.npy", "-o", tmp_path / "u.mucsc"])
    assert "note: --base" in r.stderr and "update is zero" in r.stderr
    np.save(tmp_path / "b.npy", np.arange(10, dtype=np.float32))
    r = run(["compress", tmp_path / "a.npy", "--base", tmp_path / "b.npy", "-o", tmp_path / "v.mucsc"])
    assert "hold the same float values" in r.stderr
    np.save(tmp_path / "c.npy", np.arange(10, dtype=np.float32) + 1)
    r = run(["compress", tmp_path / "a.npy", "--base", tmp_path / "c.npy", "-o", tmp_path / "w.mucsc"])
    assert "update is zero" not in r.stderr and "same float values" not in r.stderr
