"""What the user reads when something goes wrong: one prefix for every error (``mucsc: error:``, click's
own usage errors included), the exit codes README.md states (usage 2; bad data, I/O and an existing
output 1), and a hint naming the flag that fixes it."""

from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner

import mucsc
from mucsc import tensorfiles as tf
from mucsc.cli.main import main

PREFIX = "mucsc: error: "


def run(args, code):
    r = CliRunner().invoke(main, [str(a) for a in args])
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        raise r.exception
    assert r.exit_code == code, (r.exit_code, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr and "Error:" not in r.stderr  # never click's own prefix
    errors = [line for line in r.stderr.splitlines() if PREFIX in line]
    assert len(errors) == 1 and errors[0].startswith(PREFIX), r.stderr
    return errors[0]


@pytest.fixture
def files(tmp_path):
    x = tmp_path / "x.npz"
    tf.save(x, {"w": np.linspace(-1, 1, 300, dtype=np.float32)})
    (tmp_path / "x.npz.mucsc").write_bytes(mucsc.encode({"w": np.ones(4, "f4")}))
    (tmp_path / "junk.mucsc").write_bytes(b"not a message at all")
    return tmp_path


@pytest.mark.parametrize("args, words", [
    (["--bogus"], "No such option"),                                  # the group's own options
    (["nosuch"], "No such command 'nosuch'"),
    (["compress", "--bogus", "x.npz"], "No such option"),
    (["compress", "{d}/x.npz", "-c", "nope"], "unknown codec 'nope'"),  # a library ParameterError
    (["compress", "{d}/x.npz", "--seed", "-1"], "--seed"),            # click's BadParameter
    (["compress", "{d}/x.foo"], "unknown suffix '.foo'"),
    (["decompress", "{d}/x.npz"], "give the output name with -o"),
    (["rate", "--kn", "2"], "--kn"),
    (["sim", "--workers", "0"], "--workers"),
    (["info"], "Missing argument"),
])
def test_usage_errors_exit_2_with_the_one_prefix(files, args, words):
    line = run([a.format(d=files) for a in args], code=2)
    assert words in line


@pytest.mark.parametrize("args, words", [
    (["info", "{d}/junk.mucsc"], "junk.mucsc: not a mucsc message"),
    (["test", "{d}/junk.mucsc"], "junk.mucsc: not a mucsc message"),
    (["decompress", "{d}/junk.mucsc", "-o", "{d}/out.npz"], "junk.mucsc: not a mucsc message"),
    (["compress", "{d}/missing.npz", "-o", "{d}/m.mucsc"], "missing.npz"),
])
def test_bad_data_and_io_errors_exit_1_with_the_one_prefix(files, args, words):
    assert words in run([a.format(d=files) for a in args], code=1)


def test_an_existing_output_exits_1_and_names_both_flags(files):
    line = run(["compress", files / "x.npz"], code=1)  # x.npz.mucsc exists
    assert line == f"{PREFIX}{files / 'x.npz.mucsc'}: already exists (-f overwrites it; -o OTHER writes another file)"
    assert (files / "x.npz.mucsc").read_bytes() == mucsc.encode({"w": np.ones(4, "f4")})  # untouched
    # the case: decompress model.pt.mucsc refuses because model.pt (the original) is there
    tf.save(files / "model.npz", {"w": np.ones(4, "f4")})
    (files / "model.npz.mucsc").write_bytes(mucsc.encode({"w": np.ones(4, "f4")}))
    line = run(["decompress", files / "model.npz.mucsc"], code=1)
    assert "model.npz: already exists" in line and "-o OTHER" in line and "-f " in line
    CliRunner().invoke(main, ["decompress", str(files / "model.npz.mucsc"), "-o", str(files / "back.npz")])
    assert (files / "back.npz").exists()


def test_the_group_help_states_the_exit_codes():
    text = CliRunner().invoke(main, ["-h"]).stdout
    assert "1 bad or unreadable data, I/O error, an existing output (without -f)" in " ".join(text.split())
    assert "2 usage error" in text
