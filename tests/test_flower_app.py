"""examples/flower as its users run it: the README's first code block (`flwr run .` on a local
simulation of 10 supernodes) in a fresh FLWR_HOME, offline, with 1 round: exit 0, the byte summary
printed, per-round byte metrics in Flower's own results, and no deprecation warning."""

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

pytest.importorskip("flwr", reason="Flower not installed (pip install 'mucsc[flower]')")
pytest.importorskip("ray")
pytest.importorskip("torch")
pytest.importorskip("sklearn")

APP = Path(__file__).resolve().parents[1] / "examples" / "flower"
BIN = str(Path(sys.executable).parent)  # this environment's flwr and flower-superlink, activated or not


def _first_block() -> str:
    return re.search(r"```\n(.*?)```", (APP / "README.md").read_text(), re.S).group(1)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _superlinks(home: str) -> list[int]:
    """Process ids of the local SuperLink this test's `flwr run` started (its database is under home)."""
    out = subprocess.run(["ps", "-ww", "-eo", "pid=,args="], capture_output=True, text=True).stdout
    return [int(line.split()[0]) for line in out.splitlines() if home in line and "flower-superlink" in line]


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("flwr", path=BIN) is None, reason="no flwr command beside this Python")
def test_readme_first_block_runs_flwr_run_offline():
    block = _first_block()
    assert "flwr run ." in block
    tmp = tempfile.mkdtemp(prefix="flwr", dir="/tmp")  # short: Ray's socket paths must stay < 108 bytes
    env = dict(os.environ, FLWR_LOCAL_SUPERLINK_HTTP_API_PORT=str(_free_port()),
               FLWR_LOCAL_CONTROL_API_PORT=str(_free_port()), TMPDIR=tmp,
               PATH=os.pathsep.join([BIN, os.environ.get("PATH", "")]),
               PYTHONPATH=os.pathsep.join([str(APP.parents[1]), os.environ.get("PYTHONPATH", "")]))
    # the block as written, with one round so that the test stays short
    script = block.replace("--stream", "--stream -c num-server-rounds=1")
    try:
        proc = subprocess.run(["bash", "-ec", script], cwd=APP, env=env, capture_output=True, text=True,
                              timeout=400)
    finally:
        for pid in _superlinks(tmp):  # mktemp -d puts FLWR_HOME under TMPDIR
            os.killpg(pid, signal.SIGTERM)
        shutil.rmtree(tmp, ignore_errors=True)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "deprecat" not in out.lower(), out[-4000:]
    assert "(10 simulated SuperNodes)" in out
    m = re.search(r"mucsc train uplink: ([\d,]+) B in (\d+) messages \(([\d.]+)x smaller", out)
    assert m, out[-4000:]
    assert int(m.group(1).replace(",", "")) > 0 and int(m.group(2)) == 5 and float(m.group(3)) > 5
    assert "'mucsc-bytes-up'" in out and "'mucsc-ratio-down'" in out and "'mucsc-rejected'" in out
