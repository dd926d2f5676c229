"""`mucsc sim --save-updates`: raw client updates U_i on disk, bounded, with a manifest."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

import mucsc
from mucsc.fedsim import updates
from mucsc.fedsim.cli import sim

TINY = ["--model", "logreg", "-N", "6", "-K", "3", "-E", "2", "-B", "4", "--rounds", "3", "--target", "0",
        "--eval-every", "1", "--samples-per-client", "20", "--workers", "1", "-q"]


def _run(args):
    return CliRunner().invoke(sim, TINY + args, catch_exceptions=False)


@pytest.fixture(autouse=True)
def _results_under_tmp(tmp_path, monkeypatch):
    """A sweep without -o writes ./mucsc-sim/<date>-<time>/: here, under the test's own folder."""
    monkeypatch.chdir(tmp_path)


def test_saves_the_selected_rounds_and_clients_with_a_manifest(tmp_path):
    out = tmp_path / "u"
    r = _run(["--codecs", "none,mucsc", "--save-updates", str(out), "--save-rounds", "1,3,9", "--save-clients", "2"])
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in out.iterdir()) == ["mucsc-seed0", "none-seed0"]
    man = json.loads((out / "none-seed0" / "manifest.json").read_text())
    assert man["format"] == updates.FORMAT and man["model"] == "logreg" and man["dataset"] == "digits"
    assert man["codec"] == "none" and man["seed"] == 0 and man["d"] == 650
    # rounds 1 and 3 (9 is beyond the run), the first two participants of each
    assert [(f["round"], f["slot"]) for f in man["files"]] == [(1, 0), (1, 1), (3, 0), (3, 1)]
    assert sorted(p.name for p in (out / "none-seed0").iterdir()) == sorted(
        ["manifest.json"] + [f["file"] for f in man["files"]])
    saved = list(updates.read_updates(out))
    assert len(saved) == 8 and all(u.flat().dtype == np.float32 and u.flat().size == 650 for u in saved)
    assert list(saved[0].tensors) == man["names"]  # parameter order, as the model lists them
    by = {(u.entry["codec"], u.entry["round"], u.entry["slot"]): u.flat() for u in saved}
    # round 1 starts from the same model in every run: the raw updates are identical (pre-compression)
    assert np.array_equal(by[("none", 1, 0)], by[("mucsc", 1, 0)])
    assert not np.array_equal(by[("none", 3, 0)], by[("mucsc", 3, 0)])
    # a saved file is an ordinary tensor file: mucsc compresses it
    f = out / "none-seed0" / man["files"][0]["file"]
    x = mucsc.tensorfiles.load(f).tensors
    assert set(x) == set(man["names"]) and all(a.dtype == np.float32 for a in x.values())


def test_the_same_run_saves_the_same_updates(tmp_path):
    for d in ("a", "b"):
        assert _run(["--codecs", "none", "--save-updates", str(tmp_path / d)]).exit_code == 0
    a, b = (list(updates.read_updates(tmp_path / d)) for d in ("a", "b"))
    assert len(a) == 1 and np.array_equal(a[0].flat(), b[0].flat())


def test_refusals_before_any_training(tmp_path, monkeypatch):
    out = tmp_path / "u"
    assert _run(["--codecs", "none", "--save-updates", str(out)]).exit_code == 0
    r = CliRunner().invoke(sim, TINY + ["--codecs", "none", "--save-updates", str(out)])
    assert r.exit_code == 2 and "exists and is not empty" in r.output
    monkeypatch.setattr(updates, "MAX_BYTES", 10_000)  # 2 rounds x 2 clients x 650 float32 + headers > 10 kB
    r = CliRunner().invoke(sim, TINY + ["--codecs", "none", "--save-updates", str(tmp_path / "v"),
                                        "--save-rounds", "1,2", "--save-clients", "2"])
    assert r.exit_code == 2 and "over the limit" in r.output and "--save-rounds" in r.output
    assert not (tmp_path / "v").exists()
    r = CliRunner().invoke(sim, TINY + ["--codecs", "none", "--save-updates", str(tmp_path / "w"),
                                        "--save-rounds", "0"])
    assert r.exit_code == 2 and "save rounds must be >= 1" in r.output


def test_reading_a_directory_without_a_manifest_is_a_clear_error(tmp_path):
    with pytest.raises(mucsc.InputError, match="manifest.json"):
        list(updates.read_updates(tmp_path))


def test_run_folders_are_shell_safe():
    assert updates.run_dir("u", "mucsc(rounding=dithered,bits=1)", 3).name == "mucsc-rounding-dithered-bits-1-seed3"
    assert updates.run_dir("u", "none", 0).name == "none-seed0"
