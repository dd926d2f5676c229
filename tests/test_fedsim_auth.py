"""mucsc sim --auth: every message tagged by its sender and verified against that sender only."""

from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner

import mucsc
from mucsc.fedsim import simulation, transport
from mucsc.fedsim.cli import sim
from simtools import DIGITS, tiny

pytest.importorskip("cryptography")


@pytest.fixture(autouse=True)
def _results_under_tmp(tmp_path, monkeypatch):
    """A sweep without -o writes ./mucsc-sim/<date>-<time>/: here, under the test's own folder."""
    monkeypatch.chdir(tmp_path)


@pytest.mark.parametrize("alg, tag", [("blake2b", 32), ("ed25519", 64)])
def test_auth_adds_exactly_the_trailers_and_changes_nothing_else(alg, tag):
    plain_cfg, auth_cfg = tiny(codecs=("mucsc",)), tiny(codecs=("mucsc",), auth=alg)
    setup = simulation.prepare(plain_cfg, DIGITS)
    plain = simulation.run(plain_cfg, "mucsc", setup)
    authed = simulation.run(auth_cfg, "mucsc", setup)
    for p, a in zip(plain.records, authed.records):
        trailers = [4 + len(f"client-{c}") + tag for c in a.participants]
        assert a.up_bytes == [b + t for b, t in zip(p.up_bytes, trailers)]
        assert a.auth_up_bytes == sum(trailers) and a.auth_down_msg_bytes == 4 + len("server") + tag
        assert a.down_msg_bytes == p.down_msg_bytes + a.auth_down_msg_bytes
        assert a.accuracy == p.accuracy  # the same model: tags change no value
    for n in plain.weights:
        np.testing.assert_array_equal(plain.weights[n], authed.weights[n])


def test_contexts_bind_run_round_direction_and_sender():
    auth = transport.Authenticator("blake2b", 0, "mucsc-seed0")
    blob = mucsc.encode(np.ones(8, np.float32), "none")
    sent = auth.seal(blob, "client-3", 5, "up")
    mucsc.decode(sent.blob, **sent.check)
    wrong = [auth.seal(blob, "client-3", 6, "up").check,        # another round
             auth.seal(blob, "client-3", 5, "down").check,      # another direction
             auth.seal(blob, "client-4", 5, "up").check,        # another client's key
             transport.Authenticator("blake2b", 0, "mucsc-seed1").seal(blob, "client-3", 5, "up").check]
    for check in wrong:
        with pytest.raises(mucsc.AuthError):
            mucsc.decode(sent.blob, **check)


def test_cli_reports_the_tag_bytes():
    args = ["--dataset", "digits", "--model", "logreg", "-N", "6", "-K", "3", "-E", "1", "-B", "4",
            "--rounds", "1", "--target", "0", "--samples-per-client", "20", "--codecs", "mucsc", "-q",
            "--auth", "ed25519"]
    r = CliRunner().invoke(sim, args, catch_exceptions=False)
    assert r.exit_code == 0, r.output
    out = " ".join(r.output.split())  # the legend is wrapped
    assert "authentication (ed25519, 64 B tag" in out and "+76 B/uplink msg, +74 B/downlink msg" in out
    r = CliRunner().invoke(sim, args[:-1] + ["rsa"])
    assert r.exit_code == 2
