"""Without torch installed (simulated by blocking its import), the codec works and everything that
needs torch says so in one line instead of a traceback."""

import os
import subprocess
import sys

import numpy as np

BLOCK = "import sys; sys.modules['torch'] = None; "


def run(code: str, *args: str, cwd=None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "MUCSC_BACKEND"}  # the default backend
    return subprocess.run([sys.executable, "-c", BLOCK + code, *args], capture_output=True, text=True,
                          cwd=cwd, timeout=120, env=env)


CLI = "from mucsc.cli.main import main; sys.argv = ['mucsc'] + sys.argv[1:]; main()"


def test_codec_and_as_torch_without_torch():
    r = run("import numpy as np, mucsc; b = mucsc.encode(np.ones(4, 'f4')); print(mucsc.decode(b).sum());"
            "\ntry:\n    mucsc.decode(b, as_torch=True)\nexcept mucsc.ParameterError as e:\n    print('ERR', e)")
    assert r.returncode == 0, r.stderr
    assert "4.0" in r.stdout and "ERR as_torch=True needs PyTorch" in r.stdout


def test_cli_commands_that_need_torch_say_so(tmp_path):
    np.save(tmp_path / "a.npy", np.ones(3, np.float32))
    r = run(CLI, "compress", "a.npy", "-q", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    r = run(CLI, "decompress", "a.npy.mucsc", "-o", "a.pt", cwd=tmp_path)
    assert r.returncode == 1 and "torch is needed" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "a.pt").exists()
    r = run(CLI, "sim", "-q", cwd=tmp_path)
    assert r.returncode == 1 and "mucsc sim needs torch" in r.stderr and "Traceback" not in r.stderr
