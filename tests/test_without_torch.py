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
    assert "4.0" in r.stdout and "ERR PyTorch is needed for as_torch=True" in r.stdout


def test_cli_commands_that_need_torch_say_so(tmp_path):
    np.save(tmp_path / "a.npy", np.ones(3, np.float32))
    r = run(CLI, "compress", "a.npy", "-q", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    r = run(CLI, "decompress", "a.npy.mucsc", "-o", "a.pt", cwd=tmp_path)
    assert r.returncode == 1 and "PyTorch is needed for .pt files" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "a.pt").exists()
    r = run(CLI, "sim", "-q", cwd=tmp_path)
    assert r.returncode == 1 and "mucsc sim needs torch" in r.stderr and "Traceback" not in r.stderr


def test_require_torch_names_the_need_and_refuses_an_old_torch(monkeypatch, tmp_path):
    import types

    import pytest

    from mucsc import tensorfiles
    from mucsc.errors import ParameterError
    from mucsc.optional import require_torch

    monkeypatch.setitem(sys.modules, "torch", None)  # import torch raises ImportError
    with pytest.raises(ParameterError, match="PyTorch is needed for as_torch=True but is not installed"):
        require_torch("as_torch=True")
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(__version__="2.5.1+cpu"))
    assert require_torch("x").__version__ == "2.5.1+cpu"  # no minimum asked
    assert require_torch("x", min_version=(2, 5)).__version__ == "2.5.1+cpu"
    (tmp_path / "a.pt").write_bytes(b"\x80\x02")
    with pytest.raises(tensorfiles.TensorFileError, match=r"torch 2\.5\.1\+cpu is too old .* >= 2\.6 .*CVE-2025-32434"):
        tensorfiles.load(str(tmp_path / "a.pt"))
