"""The installed ``mucsc`` command in real processes: pipes, ``python -m mucsc.cli``, exit statuses,
terminal refusal, and that the common paths never import torch."""

from __future__ import annotations

import os
import pty
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mucsc import tensorfiles as tf

EXE = Path(sys.executable).with_name("mucsc")
MUCSC = [str(EXE)] if EXE.exists() else [sys.executable, "-m", "mucsc.cli"]


def mucsc(*args, stdin=None, input=None, code=0):
    r = subprocess.run([*MUCSC, *map(str, args)], stdin=stdin, input=input, capture_output=True,
                       timeout=120)
    assert r.returncode == code, (r.returncode, r.stderr.decode())
    assert b"Traceback" not in r.stderr
    return r


@pytest.fixture
def npz(tmp_path):
    rng = np.random.default_rng(0)
    p = tmp_path / "m.npz"
    tf.save(p, {"w": rng.normal(size=(64, 32)).astype(np.float32), "b": rng.normal(size=32).astype(np.float16),
                "steps": np.array(9, dtype=np.int64)})
    return p


def test_pipeline_through_stdin_and_stdout(tmp_path, npz):
    with open(npz, "rb") as f:
        blob = mucsc("compress", "-", "--z", "16", "-q", stdin=f).stdout
    r = mucsc("decompress", "-", "-F", "npz", "-q", input=blob)
    (tmp_path / "back.npz").write_bytes(r.stdout)
    back, want = tf.load(tmp_path / "back.npz").tensors, tf.load(npz).tensors
    assert {k: (v.dtype, v.shape) for k, v in back.items()} == {k: (v.dtype, v.shape) for k, v in want.items()}
    assert int(back["steps"]) == 9
    # a shell pipeline, as a user would type it
    sh = shutil.which("sh")
    if sh:
        cmd = f"{' '.join(MUCSC)} compress - < {npz} | {' '.join(MUCSC)} test -"
        r = subprocess.run([sh, "-c", cmd], capture_output=True, timeout=120)
        assert r.returncode == 0 and r.stdout == b"<stdin>: OK\n", r.stderr


def test_python_dash_m_and_exit_statuses(tmp_path, npz):
    r = subprocess.run([sys.executable, "-m", "mucsc.cli", "--version"], capture_output=True, timeout=60)
    assert r.returncode == 0 and r.stdout.startswith(b"mucsc ")
    r = mucsc("compress", npz, "--codec", "mucsc", "--keep", "0.1", code=2)
    assert b"--keep: not a parameter of codec 'mucsc'" in r.stderr
    r = mucsc("compress", tmp_path / "missing.npz", code=1)
    assert r.stderr.decode().strip().endswith("missing.npz: No such file or directory")
    mucsc("compress", npz, "-q")
    (tmp_path / "cut.mucsc").write_bytes((tmp_path / "m.npz.mucsc").read_bytes()[:100])
    r = mucsc("decompress", tmp_path / "cut.mucsc", "-o", tmp_path / "o.npz", code=1)
    assert r.stderr.count(b"\n") == 1 and b"cut.mucsc: " in r.stderr and b"truncated" in r.stderr
    assert not (tmp_path / "o.npz").exists()


def test_broken_pipe_is_quiet(tmp_path, npz):
    big = tmp_path / "big.npy"
    np.save(big, np.zeros(1 << 20, dtype=np.float32))
    p = subprocess.Popen([*MUCSC, "compress", big, "-o", "-", "--codec", "raw", "--compress", "off"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdout.read(10)
    p.stdout.close()
    err = p.stderr.read()
    assert p.wait(timeout=60) == 1
    assert err == b""  # no traceback, no "Exception ignored", no message: the reader chose to stop
    r = subprocess.run(f"{' '.join(map(str, MUCSC))} rate | head -1", shell=True, capture_output=True, timeout=60)
    assert r.returncode == 0 and r.stderr == b"" and r.stdout.count(b"\n") == 1


def test_refuses_binary_to_a_terminal(npz):
    leader, follower = pty.openpty()
    try:
        with open(npz, "rb") as f:
            r = subprocess.run([*MUCSC, "compress", "-"], stdin=f, stdout=follower, stderr=subprocess.PIPE,
                               timeout=60)
        assert r.returncode == 2 and b"refusing to write binary data to a terminal" in r.stderr
        r = subprocess.run([*MUCSC, "decompress", "-"], stdin=follower, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, timeout=60)
        assert r.returncode == 2 and b"refusing to read binary data from a terminal" in r.stderr
    finally:
        os.close(leader)
        os.close(follower)


@pytest.mark.parametrize("args", [["--help"], ["compress", "{npz}", "-o", "{out}", "-q"],
                                  ["info", "{msg}"], ["decompress", "{msg}", "-o", "{dec}", "-q"]])
def test_common_paths_do_not_import_torch(tmp_path, npz, args):
    msg = tmp_path / "pre.mucsc"
    mucsc("compress", npz, "-o", msg, "-q")
    filled = [a.format(npz=npz, out=tmp_path / "x.mucsc", msg=msg, dec=tmp_path / "d.npz") for a in args]
    code = ("import sys\nfrom mucsc.cli.main import main\n"
            f"try:\n    main({filled!r}, prog_name='mucsc')\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
            "assert 'torch' not in sys.modules, 'torch was imported'\n")
    env = {k: v for k, v in os.environ.items() if k != "MUCSC_BACKEND"}  # torch backend imports torch
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr.decode()
