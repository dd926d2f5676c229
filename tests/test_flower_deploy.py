"""examples/flower/deploy_local.py: a SuperLink and 3 SuperNodes as separate processes over TLS on
loopback, with SuperNode authentication, 2 rounds of `flwr run`: exit 0, both rounds' uplink under a
quarter of the uncompressed bytes, and every process it started gone (about 90 s on 2 cores)."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("flwr", reason="Flower not installed (pip install 'mucsc[flower]')")
pytest.importorskip("torch")
pytest.importorskip("sklearn")
pytest.importorskip("cryptography")

ROOT = Path(__file__).resolve().parents[1]
BIN = str(Path(sys.executable).parent)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("flower-superlink", path=BIN) is None, reason="no Flower commands beside this Python")
def test_deploy_local_three_supernodes_two_rounds_over_tls(tmp_path):
    out = tmp_path / "deploy.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "flower" / "deploy_local.py"),
                           "--supernodes", "3", "--rounds", "2", "--json", str(out), "--timeout", "400"],
                          env=env, capture_output=True, text=True, timeout=500)
    report = json.loads(out.read_text())
    assert proc.returncode == 0, (proc.stderr[-3000:], report)
    assert report["tls"] is True and report["supernode_auth"] is True
    assert report["superlink"].startswith("127.0.0.1:")
    assert [r["round"] for r in report["rounds"]] == [1, 2]
    for r in report["rounds"]:
        assert 0 < r["bytes_up"] < r["bytes_up_uncompressed"] / 4, r
        assert r["bytes_down"] > 0
    assert len(report["pids"]) == 4 and report["left_behind"] == []
    for pid in report["pids"]:
        assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split(") ")[-1][:1]
    assert any("mucsc train uplink" in line for line in report["summary"])
