"""`mucsc sim` through click's CliRunner: outputs, determinism, clear failures that keep results."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

import mucsc
import mucsc.codec.api.state
from mucsc.errors import ParameterError
from mucsc.fedsim.cli import sim

TINY = ["--model", "logreg", "-N", "6", "-K", "3", "-E", "2", "-B", "4", "--rounds", "2", "--target", "0",
        "--eval-every", "1", "--samples-per-client", "20"]


def _run(args):
    return CliRunner().invoke(sim, TINY + args, catch_exceptions=False)


@pytest.fixture(autouse=True)
def _results_under_tmp(tmp_path, monkeypatch):
    """A sweep without -o writes ./mucsc-sim/<date>-<time>/: here, under the test's own folder."""
    monkeypatch.chdir(tmp_path)


def test_outputs_and_table(tmp_path):
    r = _run(["--codecs", "none,mucsc", "-o", str(tmp_path)])
    assert r.exit_code == 0, r.output
    # not a TTY: no bar, but the data line and one line per evaluation (round 1, 2 of each run)
    err = r.stderr.splitlines()
    assert "\r" not in r.stderr and len(err) == 1 + 2 * 2
    assert err[0].startswith("digits: 1438 train / 359 test samples, 10 classes") and "d = 650" in err[0]
    assert "device cpu" in err[0]
    heads = sorted(line.split(" acc ")[0] for line in err[1:])  # concurrent runs interleave
    assert heads == ["run 1/2 none round 1/2", "run 1/2 none round 2/2", "run 2/2 mucsc round 1/2",
                     "run 2/2 mucsc round 2/2"]
    assert "traffic MiB" in r.stdout and "mucsc" in r.stdout and "100.00%" in r.stdout
    assert r.stdout.splitlines()[-1] == f"results in {tmp_path}/"
    for codec in ("none", "mucsc"):
        lines = (tmp_path / codec / "rounds.csv").read_text().splitlines()
        assert len(lines) == 3 and lines[0].startswith("round,iteration,lr,accuracy")
        doc = json.loads((tmp_path / codec / "rounds.json").read_text())
        assert len(doc["rounds"]) == 2 and len(doc["rounds"][0]["uplink"]) == 3 and doc["error"] is None
    for name in ("summary.txt", "summary.json", "summary.csv", "accuracy_vs_rounds.png",
                 "accuracy_vs_traffic.png"):
        assert (tmp_path / name).stat().st_size > 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["data"]["train_samples"] == 1438 and summary["data"]["test_samples"] == 359
    assert summary["data"]["classes"] == 10 and summary["data"]["d"] == 650 and summary["data"]["clients"] == 6
    assert summary["machine"]["device"] == "cpu"
    rows = summary["runs"]
    assert rows[1]["rate_paper"] == pytest.approx(2 * 4 * rows[1]["d"] / (  # MUCSC's rate formula
        sum(b / 8 * rows[1]["d"] + 4 * z for b, z in ((2, 4), (3, 8), (4, 16))) / 3 * 0.5
        + 4 * 16 + 0.5 * rows[1]["d"]), rel=1e-7)  # files keep 8 significant digits


def test_quiet_prints_only_the_table_and_where():
    r = _run(["--codecs", "none", "-q"])
    assert r.exit_code == 0 and r.stderr == "" and "traffic MiB" in r.stdout
    assert r.stdout.splitlines()[-1].startswith("results in mucsc-sim/")


def test_without_out_the_results_stay_on_disk_under_shell_safe_names(tmp_path):
    """No -o: a new ./mucsc-sim/<date>-<time>/ per sweep (the cwd is tmp_path here), printed after the
    table; run folders carry no parentheses, commas or '=' (a shell takes them unquoted); the codec
    spec itself is in summary.json and rounds.json."""
    dithered = "mucsc(rounding=dithered,bits=6)"
    r = _run(["--codecs", f"none,{dithered}", "-q"])
    assert r.exit_code == 0, r.output
    last = r.stdout.splitlines()[-1]
    assert re.fullmatch(r"results in mucsc-sim/\d{4}-\d\d-\d\d-\d{6}/", last), last
    out = tmp_path / last.removeprefix("results in ")
    for name in ("summary.txt", "summary.json", "summary.csv", "accuracy_vs_rounds.png", "accuracy_vs_traffic.png"):
        assert (out / name).stat().st_size > 0, name
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == ["mucsc-rounding-dithered-bits-6", "none"]
    summary = json.loads((out / "summary.json").read_text())
    assert [row["codec"] for row in summary["runs"]] == ["none", dithered]
    assert summary["folders"] == {"none": "none", dithered: "mucsc-rounding-dithered-bits-6"}
    assert json.loads((out / "mucsc-rounding-dithered-bits-6" / "rounds.json").read_text())["codec"] == dithered
    again = _run(["--codecs", "none", "-q"])  # a second sweep never writes into the first one's folder
    second = tmp_path / again.stdout.splitlines()[-1].removeprefix("results in ")
    assert again.exit_code == 0 and second != out and (second / "summary.csv").is_file()
    assert sorted(p.name for p in (tmp_path / "mucsc-sim").iterdir()) == sorted([out.name, second.name])


def test_folder_names_are_shell_safe_and_distinct():
    from mucsc.fedsim.config import folder_name

    assert folder_name("mucsc(rounding=dithered,bits=1)") == "mucsc-rounding-dithered-bits-1"
    assert folder_name("mucsc( z = 4 , solver=dp )") == "mucsc-z-4-solver-dp"
    assert folder_name("stc(keep=0.01)") == "stc-keep-0.01" and folder_name("qsgd") == "qsgd"
    assert folder_name("mucsc(z=-1)") != folder_name("mucsc(z=1)")
    r = _run(["--codecs", "mucsc(z=4),mucsc( z=4)"])  # two spellings of one experiment: one folder
    assert r.exit_code == 2 and "would share the results folder 'mucsc-z-4'" in r.stderr
    assert not (Path.cwd() / "mucsc-sim").exists()  # a usage error leaves nothing on disk


def test_legend_explains_columns_and_traffic_above_nc():
    from mucsc.fedsim import report
    from mucsc.fedsim.config import SimConfig

    base = dict(comm_min=1.0, comp_min=0.1, total_min=1.1, pct_nc_time=100.0, final_acc=0.9, codec_share=0.1,
                ratio=1.0, rate_measured=1.8, rate_paper=None, T=10, reached=True, uplink="x", up_MB=0.0,
                train_s=1.0, encode_s=0.1, decode_s=0.1, best_acc=0.9, mean_up_bytes=1.0, mean_down_bytes=1.0,
                d=10, auth_MB=0.0, auth_bytes_per_msg=0, auth_up_bytes_per_msg=0.0)
    nc = report.SummaryRow(**base, codec="none", downlink="none", rounds=2, traffic_MB=10.0, down_MB=9.0,
                           pct_nc_traffic=100.0)
    up_only = report.SummaryRow(**base, codec="dgc", downlink="none", rounds=4, traffic_MB=19.5, down_MB=18.0,
                                pct_nc_traffic=195.0)
    both = report.SummaryRow(**base, codec="mucsc", downlink="mucsc(z=16)", rounds=2, traffic_MB=1.0,
                             down_MB=0.5, pct_nc_traffic=10.0)
    text = " ".join(report.format_table([nc, up_only, both], SimConfig()).split())
    for words in ("% NC = share of the uncompressed run (codec none)", "E = 5 local SGD iterations", "in MiB",
                  "in minutes", "ratio = float32 bytes / message bytes", "rate = the paper's compression rate",
                  "Full legend: docs/fedsim.md, section \"Reading the table\""):
        assert words in text
    legend = report.legend([both], SimConfig())
    assert len(legend) <= 6  # short; the full legend is in the docs
    assert "Reading the table" in (__import__("pathlib").Path(__file__).parents[1] / "docs" / "fedsim.md").read_text()
    assert "dgc used 195 % of NC's traffic: it compresses only the uplink" in text
    assert "92 % of its traffic" in text and "it ran 4 rounds to NC's 2" in text
    assert "mucsc used" not in text
    assert "below 1" not in text  # NC's ratio is 1.0 here
    small = __import__("dataclasses").replace(nc, ratio=0.91, mean_up_bytes=4 * 650 + 260, d=650)
    text = " ".join(report.format_table([small, both], SimConfig()).split())
    assert "none's ratio 0.91x is below 1 because every message adds the container's framing" in text
    assert "260 B here" in text


def significant_digits(cell: str) -> int:
    """Significant digits of a number as written ("0.0940" -> 3, "100.0" -> 1, "1.5e-05" -> 2)."""
    mantissa = cell.lstrip("+-").lower().split("e")[0].replace(".", "")
    return len(mantissa.strip("0")) or 1


def floats_in(value) -> list[str]:
    """Every float of a parsed JSON document, as the text json wrote it."""
    if isinstance(value, float):
        return [json.dumps(value)]
    if isinstance(value, dict):
        return [f for v in value.values() for f in floats_in(v)]
    if isinstance(value, list):
        return [f for v in value for f in floats_in(v)]
    return []


def png_text(path) -> dict[str, str]:
    """The tEXt chunks of a PNG file (matplotlib writes savefig's metadata there)."""
    import struct
    import zlib

    data, pos, out = path.read_bytes(), 8, {}
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        if kind == b"tEXt":
            key, _, text = body.partition(b"\0")
            out[key.decode("latin-1")] = text.decode("latin-1")
        elif kind == b"zTXt":
            key, _, rest = body.partition(b"\0")
            out[key.decode("latin-1")] = zlib.decompress(rest[1:]).decode("latin-1")
        pos += 12 + n
    return out


def test_files_are_rounded_and_plots_titled(tmp_path):
    import csv

    r = _run(["--codecs", "none,mucsc,stc", "--seed", "5", "-o", str(tmp_path)])
    assert r.exit_code == 0, r.output
    tables = [tmp_path / "summary.csv"] + [tmp_path / c / f for c in ("none", "mucsc", "stc")
                                          for f in ("rounds.csv", "timing.csv")]
    cells = [cell for path in tables for row in csv.reader(path.open()) for cell in row[1:]]
    numbers = [c for c in cells if c.replace(".", "", 1).replace("e-", "").replace("-", "").isdigit()]
    assert len(numbers) > 100 and any("." in c for c in numbers)
    wide = [c for c in numbers if ("." in c or "e" in c) and significant_digits(c) > 8]
    assert not wide, wide[:5]
    for doc in [tmp_path / "summary.json"] + [tmp_path / c / "rounds.json" for c in ("none", "mucsc", "stc")]:
        wide = [f for f in floats_in(json.loads(doc.read_text())) if significant_digits(f) > 8]
        assert not wide, (doc, wide[:5])
    for name in ("accuracy_vs_rounds.png", "accuracy_vs_traffic.png"):
        meta = png_text(tmp_path / name)
        assert meta["Title"] == "digits, N = 6 clients, K = 3 per round, seed 5", meta

def test_same_seed_same_csv(tmp_path):
    for sub, seed in (("a", "3"), ("b", "3"), ("c", "4")):
        assert _run(["--codecs", "qsgd,stc", "--seed", seed, "-o", str(tmp_path / sub)]).exit_code == 0
    for codec in ("qsgd", "stc"):
        a, b, c = ((tmp_path / s / codec / "rounds.csv").read_bytes() for s in "abc")
        assert a == b and a != c


def test_bad_options_are_usage_errors():
    r = _run(["--codecs", "none,bogus"])
    assert r.exit_code == 2 and "unknown codec 'bogus'" in r.stderr
    r = _run(["--codecs", "stc", "-p", "stc.keep=7"])
    assert r.exit_code == 2 and "keep" in r.stderr
    r = _run(["-K", "9"])
    assert r.exit_code == 2 and "cannot exceed" in r.stderr
    r = CliRunner().invoke(sim, ["--dataset", "cifar10"])
    assert r.exit_code == 1 and "--data-dir" in r.stderr


def _fail_signsgd_in_round_2(monkeypatch):
    """Make signsgd's encoder raise from its fifth message on: the second round of a K = 3 run."""
    real = mucsc.encode
    calls = {"n": 0}

    def failing(data, codec="mucsc", *a, **kw):
        if getattr(codec, "name", codec) == "signsgd":  # a name or a mucsc.Codec
            calls["n"] += 1
            if calls["n"] > 4:
                raise ParameterError("simulated codec failure")
        return real(data, codec, *a, **kw)
    monkeypatch.setattr(mucsc, "encode", failing)
    monkeypatch.setattr(mucsc.codec.api.state, "encode", failing)


def test_codec_failure_stops_and_keeps_results(tmp_path, monkeypatch):
    _fail_signsgd_in_round_2(monkeypatch)
    r = _run(["--codecs", "none,signsgd,stc", "-o", str(tmp_path), "--workers", "1"])  # runs one by one
    assert r.exit_code == 1
    assert "run 'signsgd' failed after 1 rounds" in r.stderr and "simulated codec failure" in r.stderr
    assert len((tmp_path / "none" / "rounds.csv").read_text().splitlines()) == 3
    assert len((tmp_path / "signsgd" / "rounds.csv").read_text().splitlines()) == 2  # round 1 kept
    assert "simulated codec failure" in json.loads((tmp_path / "signsgd" / "rounds.json").read_text())["error"]
    assert not (tmp_path / "stc").exists()
    assert "none" in (tmp_path / "summary.txt").read_text()


def test_codec_failure_with_concurrent_runs(tmp_path, monkeypatch):
    _fail_signsgd_in_round_2(monkeypatch)
    r = _run(["--codecs", "none,signsgd", "-o", str(tmp_path), "--workers", "2"])
    assert r.exit_code == 1 and "run 'signsgd' failed after 1 rounds" in r.stderr
    assert len((tmp_path / "signsgd" / "rounds.csv").read_text().splitlines()) == 2
    error = json.loads((tmp_path / "none" / "rounds.json").read_text())["error"]
    assert error is None or error.startswith("stopped: run 'signsgd' failed")


def test_workers_give_identical_rounds_csv(tmp_path):
    for w in ("1", "2", "3"):  # the digits CNN: convolutions over (n, 1, 8, 8) images
        r = _run(["--codecs", "none,mucsc,dgc", "--seed", "5", "--workers", w, "--model", "cnn",
                  "-o", str(tmp_path / w)])
        assert r.exit_code == 0, r.output
        assert f"device cpu, {w} worker process" in r.stderr
        assert json.loads((tmp_path / w / "summary.json").read_text())["machine"]["workers"] == int(w)
    for codec in ("none", "mucsc", "dgc"):
        one, two, three = ((tmp_path / w / codec / "rounds.csv").read_bytes() for w in "123")
        assert one == two == three


def test_device_choice():
    r = _run(["--codecs", "none", "--device", "cpu", "-q"])
    assert r.exit_code == 0
    import torch

    if not torch.cuda.is_available():
        r = _run(["--codecs", "none", "--device", "cuda"])
        assert r.exit_code == 1 and "Traceback" not in r.output
        assert r.stderr.strip().splitlines() == [r.stderr.strip()] and "--device cuda: no GPU available" in r.stderr


def test_seeds_sweep_equals_single_seed_runs(tmp_path):
    r = _run(["--codecs", "none,stc", "--seeds", "1,2", "--workers", "2", "-o", str(tmp_path / "many")])
    assert r.exit_code == 0, r.output
    assert "seed 1\n" in r.stdout and "seed 2\n" in r.stdout and "across seeds 1, 2:" in r.stdout
    assert [line.split(":")[0] for line in r.stderr.splitlines()[:2]] == ["seed 1", "seed 2"]
    assert "across seeds 1, 2:" in (tmp_path / "many" / "summary.txt").read_text()
    for seed in ("1", "2"):
        assert _run(["--codecs", "none,stc", "--seed", seed, "--workers", "1", "-o", str(tmp_path / seed)]).exit_code == 0
        for codec in ("none", "stc"):
            alone = (tmp_path / seed / codec / "rounds.csv").read_bytes()
            assert (tmp_path / "many" / f"seed{seed}" / codec / "rounds.csv").read_bytes() == alone
        assert json.loads((tmp_path / "many" / f"seed{seed}" / "summary.json").read_text())["config"]["seed"] == int(seed)
    assert (tmp_path / "many" / "seed1" / "none" / "rounds.csv").read_bytes() != \
        (tmp_path / "many" / "seed2" / "none" / "rounds.csv").read_bytes()


def test_options_come_from_simconfig_fields_with_their_types_and_ranges():
    """Every SimConfig setting is an option with the field's choices, range and help (no hand list)."""
    from mucsc.fedsim.config import SimConfig, settings

    names = {p.name: p for p in sim.params}
    for st in settings():  # params: -p CODEC.KEY=VALUE, parsed by hand
        assert st.name in names and (st.cli or st.name == "params"), st.name
    assert names["dataset"].type.choices == ("digits", "synthetic", "cifar10", "femnist", "mnist")
    assert names["clients"].type.min == 1 and names["target"].type.max == 1
    assert names["save_slots"].opts == ["--save-clients"] and names["clients"].opts == ["-N", "--clients"]
    assert names["save_rounds"].type.convert("1,20", None, None) == (1, 20)
    r = CliRunner().invoke(sim, ["-N", "0"])
    assert r.exit_code == 2 and "-N" in r.output and "x>=1" in r.output
    with pytest.raises(mucsc.InputError, match="clients per round must be >= 1"):
        SimConfig(per_round=0)
    with pytest.raises(mucsc.InputError, match="sampling must be one of uniform, weighted"):
        SimConfig(sampling="random")
