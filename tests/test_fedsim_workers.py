"""``--workers auto``: the decision rule (pure), explicit counts winning, and results that do not
depend on the count the rule picks (nothing here is timed: the rule's inputs are given)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from mucsc.errors import InputError
from mucsc.fedsim import parallel, simulation
from mucsc.fedsim.cli import sim
from mucsc.fedsim.config import SimConfig, make_config
from simtools import DIGITS, tiny


def test_no_trial_below_the_minimum_client_time_or_with_one_core():
    t = parallel.MIN_CLIENT_S
    assert not parallel.needs_trial(2, t * 0.99) and parallel.needs_trial(2, t) and parallel.needs_trial(8, 3.0)
    assert not parallel.needs_trial(1, 3.0)
    short = parallel.auto_choice(2, 0.003)
    assert short.workers == 1 and "3 ms" in short.reason and f"{t * 1e3:.0f} ms" in short.reason
    one = parallel.auto_choice(1, 5.0, 0.1)  # one core: nothing to gain, whatever was measured
    assert one.workers == 1 and "side by side" in one.reason
    # a trial result given for a client too short to warrant one does not start workers
    assert parallel.auto_choice(2, t / 2, t / 100).workers == 1


def test_workers_kept_only_when_the_trial_is_fast_enough():
    s = parallel.MIN_SPEEDUP
    kept = parallel.auto_choice(2, 0.8, 0.8 / s)
    assert kept.workers == 2 and f"{s:.2f}x" in kept.reason and "800 ms" in kept.reason
    assert parallel.auto_choice(4, 1.0, 0.3).workers == 4
    slow = parallel.auto_choice(2, 0.8, 0.8 / (s - 0.01))
    assert slow.workers == 1 and "cores busy" in slow.reason
    assert parallel.auto_choice(2, 0.8, 1.6).workers == 1  # slower than one process


def test_workers_setting_accepts_auto_and_counts_only():
    assert SimConfig().workers == "auto" and SimConfig(workers=None).workers == "auto"
    assert SimConfig(workers=3).workers == 3
    for bad in (0, -1, "two", 1.5, True):
        with pytest.raises(InputError, match="workers"):
            SimConfig(workers=bad)
    assert make_config(workers="auto").workers == "auto"


def test_explicit_count_wins_over_auto():
    cfg = tiny()
    setup = simulation.prepare(cfg, DIGITS)
    ex, choice = parallel.start_executor(cfg, setup, 1)
    assert isinstance(ex, simulation.InProcess) and choice == parallel.WorkerChoice(1, "--workers 1")
    ex, choice = parallel.start_executor(tiny(workers=2), setup)
    try:
        assert isinstance(ex, parallel.WorkerPool) and ex.workers == 2 and choice.reason == "--workers 2"
    finally:
        ex.close()
    with pytest.raises(InputError):
        parallel.start_executor(cfg, setup, 0)


def test_one_client_and_one_run_need_no_probe(monkeypatch):
    monkeypatch.setattr(parallel, "default_workers", lambda device: 4)
    monkeypatch.setattr(parallel, "probe_tasks", lambda *a: pytest.fail("probed with nothing to parallelise"))
    cfg = tiny(per_round=1)
    ex, choice = parallel.start_executor(cfg, simulation.prepare(cfg, DIGITS), runs=1)
    assert isinstance(ex, simulation.InProcess) and choice.workers == 1 and "side by side" in choice.reason


def _run(cfg, setup, executor):
    try:
        return simulation.run(cfg, "mucsc", setup, executor=executor)
    finally:
        executor.close()


@pytest.mark.parametrize("speedup, kept", [(0.0, True), (float("inf"), False)])
def test_auto_gives_the_results_of_one_worker(monkeypatch, speedup, kept):
    """The probe trains real clients of round 1 (in this process, then in a trial pool) and throws the
    updates away: whichever executor it leaves, the run is byte for byte that of --workers 1."""
    cfg = tiny(partition="noniid", noniid_min=10, noniid_max=40, codecs=("mucsc",))
    setup = simulation.prepare(cfg, DIGITS)
    ref = _run(cfg, setup, parallel.start_executor(cfg, setup, 1)[0])
    monkeypatch.setattr(parallel, "default_workers", lambda device: 2)  # two cores even on a 1-core runner
    monkeypatch.setattr(parallel, "MIN_CLIENT_S", 0.0)                   # every client long enough for a trial
    monkeypatch.setattr(parallel, "MIN_SPEEDUP", speedup)                # the trial passes, or fails
    ex, choice = parallel.start_executor(cfg, setup)
    assert choice.workers == (2 if kept else 1) and isinstance(ex, parallel.WorkerPool) == kept
    res = _run(cfg, setup, ex)
    assert [r.up_bytes for r in res.records] == [r.up_bytes for r in ref.records]
    assert [r.down_msg_bytes for r in res.records] == [r.down_msg_bytes for r in ref.records]
    assert [r.accuracy for r in res.records] == [r.accuracy for r in ref.records]
    for k in ref.weights:
        np.testing.assert_array_equal(res.weights[k], ref.weights[k])


def test_cli_reports_the_choice_and_why(tmp_path):
    args = ["--model", "logreg", "-N", "6", "-K", "3", "-E", "2", "-B", "4", "--rounds", "1", "--target", "0",
            "--samples-per-client", "20", "--codecs", "none", "-o", str(tmp_path)]
    r = CliRunner().invoke(sim, args + ["--workers", "auto"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    head = r.stderr.splitlines()[0]
    assert "device cpu, 1 worker process (auto: " in head  # a logistic regression client: far under 50 ms
    machine = json.loads((tmp_path / "summary.json").read_text())["machine"]
    assert machine["workers"] == 1 and machine["workers_reason"].startswith("auto: ")
    r = CliRunner().invoke(sim, args + ["--workers", "0"])
    assert r.exit_code == 2 and "--workers" in r.output and "Traceback" not in r.output
