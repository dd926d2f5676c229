"""A codec published by another package, registered only by its entry point (group mucsc.codecs),
works everywhere a built-in does.  The plugin is docs/plugins.md's example, written into a temporary
directory with a hand-made dist-info (never installed into the environment) and put on PYTHONPATH of
subprocesses."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import mucsc

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = re.search(r"`mucsc_int8/__init__.py`.*?```python\n(.*?)```", (ROOT / "docs" / "plugins.md").read_text(),
                    re.S).group(1)


def _install(where: Path, name: str, module: str, source: str, target: str) -> None:
    """A package ``module`` with an entry point ``name = target`` in group mucsc.codecs."""
    (where / module).mkdir()
    (where / module / "__init__.py").write_text(source)
    info = where / f"{module}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module.replace('_', '-')}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[mucsc.codecs]\n{name} = {target}\n")


@pytest.fixture(scope="module")
def plugin_path(tmp_path_factory):
    where = tmp_path_factory.mktemp("plugins")
    _install(where, "int8", "mucsc_int8", EXAMPLE, "mucsc_int8:Int8")
    # broken plugins must not break the library: one that fails to import, one that is no codec
    _install(where, "broken", "mucsc_broken", "raise ImportError('needs a missing library')\n", "mucsc_broken:X")
    _install(where, "notacodec", "mucsc_notacodec", "class X:\n    name = 'notacodec'\n", "mucsc_notacodec:X")
    _install(where, "raw", "mucsc_fake_raw", EXAMPLE.replace('name = "int8"', 'name = "raw"'),
             "mucsc_fake_raw:Int8")  # a plugin cannot replace a built-in
    return where


def _env(plugin_path: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(plugin_path), str(ROOT), env.get("PYTHONPATH", "")])
    env["PYTHONWARNINGS"] = "ignore::RuntimeWarning"
    return env


def _run(plugin_path: Path, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], env=_env(plugin_path), cwd=cwd, capture_output=True,
                          text=True, timeout=300)


def test_not_visible_without_the_path():
    assert "int8" not in mucsc.available_codecs()


def test_library_api(plugin_path):
    code = textwrap.dedent("""
        import warnings
        import numpy as np
        warnings.simplefilter("error", RuntimeWarning)
        import mucsc, mucsc.testing
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            names = mucsc.available_codecs()
        assert "int8" in names and "broken" not in names and "notacodec" not in names, names
        assert mucsc.codec_class("raw").__module__ == "mucsc.codec.codecs.raw"
        msgs = sorted(str(w.message) for w in caught)
        assert len(msgs) == 3 and all(w.category is RuntimeWarning for w in caught), msgs
        try:
            mucsc.get_codec("broken")
        except mucsc.UnknownCodecError as exc:
            assert "needs a missing library" in str(exc), exc
        else:
            raise AssertionError("broken plugin found")
        x = np.random.default_rng(0).standard_normal(1000).astype(np.float32)
        codec = mucsc.get_codec("int8", levels="15")
        blob = mucsc.encode(x, codec, seed=1)
        assert blob == mucsc.encode(x, "int8", seed=1, levels=15)
        y = mucsc.decode(blob)
        assert y.shape == x.shape and np.abs(y - x).max() <= np.abs(x).max() / 15 * 1.0001
        info = mucsc.inspect(blob)
        assert info.groups[0].codec == "int8" and info.groups[0].params == {"levels": 15}
        mucsc.verify(blob)
        mucsc.testing.check_codec(codec)
        c = mucsc.Compressor("int8")
        assert not c.error_feedback  # declared unbiased
        print("ok")
    """)
    r = _run(plugin_path, "-c", code)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


def test_command_line(plugin_path, tmp_path):
    import numpy as np
    np.save(tmp_path / "x.npy", np.random.default_rng(0).standard_normal((30, 40)).astype(np.float32))
    cli = ["-m", "mucsc.cli"]
    r = _run(plugin_path, *cli, "compress", "--help")
    assert r.returncode == 0 and "int8:" in r.stdout and "--levels" in r.stdout, r.stdout + r.stderr
    r = _run(plugin_path, *cli, "compress", "x.npy", "--codec", "int8", "--levels", "7", cwd=tmp_path)
    assert r.returncode == 0 and "codec int8 levels=7" in r.stderr, r.stderr
    r = _run(plugin_path, *cli, "info", "x.npy.mucsc", cwd=tmp_path)
    assert r.returncode == 0 and "int8" in r.stdout and "levels=7" in r.stdout, r.stdout + r.stderr
    r = _run(plugin_path, *cli, "test", "x.npy.mucsc", cwd=tmp_path)
    assert r.returncode == 0 and "OK" in r.stdout, r.stdout + r.stderr
    r = _run(plugin_path, *cli, "decompress", "x.npy.mucsc", "-o", "y.npy", cwd=tmp_path)
    assert r.returncode == 0 and (tmp_path / "y.npy").exists(), r.stderr
    r = _run(plugin_path, *cli, "compress", "x.npy", "--codec", "int8", "--levels", "200", "-f", cwd=tmp_path)
    assert r.returncode == 2 and "levels" in r.stderr and "Traceback" not in r.stderr, r.stderr
    r = _run(ROOT, *cli, "test", str(tmp_path / "x.npy.mucsc"))  # without the plugin: a clear error
    assert r.returncode == 1 and "int8" in r.stderr and "Traceback" not in r.stderr, r.stderr
    # mucsc rate --baselines takes its rows from the registry: the plugin has one, its stated
    # payload (1000 levels + the float32 scale) next to the measured message sizes
    r = _run(plugin_path, *cli, "rate", "--dim", "1000", "--baselines", cwd=tmp_path)
    assert r.returncode == 0 and re.search(r"^int8 +1,004 +[\d,]+ +[\d,]+ ", r.stdout, re.M), r.stdout + r.stderr


def test_simulator(plugin_path, tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("sklearn")
    r = _run(plugin_path, "-m", "mucsc.cli", "sim", "--codecs", "none,int8", "--model", "logreg", "-N", "4",
             "-K", "2", "-E", "1", "-B", "4", "--rounds", "1", "--target", "0", "--eval-every", "1",
             "--samples-per-client", "10", "-q", "-o", str(tmp_path / "out"), cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert re.search(r"^int8 ", r.stdout, re.M), r.stdout
    assert (tmp_path / "out" / "int8" / "rounds.csv").exists()
