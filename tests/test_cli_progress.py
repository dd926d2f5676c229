"""The progress bar of ``mucsc compress``: rendering, the ticker thread, the byte-counting reader, and
the real command with the bar forced on (same bytes out as without it, line cleared at the end)."""

from __future__ import annotations

import io
import re
import threading
import time

import numpy as np
import pytest
from click.testing import CliRunner

from mucsc import tensorfiles as tf
from mucsc.cli import main as cli_main
from mucsc.progress import StageProgress
from mucsc.cli.main import CountingReader, main

CLEAR = "\r\x1b[2K"


class FakeClock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def percents(text: str) -> list[int]:
    return [int(p) for p in re.findall(r"(\d+)% \[", text)]


def ticker_alive() -> bool:
    return any(t.name == "mucsc-progress" for t in threading.enumerate())


def test_bar_moves_through_stage_shares_and_is_cleared():
    buf, clock = io.StringIO(), FakeClock()
    p = StageProgress(True, buf, total=400, interval=60, columns=100, clock=clock)
    p.phase("loading new.pt", 100, measured=True)
    for _ in range(4):
        clock.t += 1.0
        p.advance(25)
        p.draw()
    p.phase("loading old.pt", 100, measured=True)
    p.advance(50)
    clock.t += 1.0
    p.draw()
    p.phase("encoding with mucsc", 200)
    clock.t += 5.0
    p.draw()
    p.phase("writing out.mucsc")
    p.done()
    out = buf.getvalue()
    seen = percents(out)
    assert seen == sorted(seen) and seen[0] == 0 and seen[-1] == 100
    assert 37 in seen  # old.pt half read: (100 + 50) / 400
    assert "mucsc: encoding with mucsc...  50% [##########..........] 10.0 s" in out
    assert "stage ETA 1 s" in out  # 50 bytes in the 2 s after the first read: 25 more take 1 s
    last = out.rsplit("\r", 1)[1]
    assert "ETA" not in out.split("mucsc: encoding")[1]  # no ETA where nothing is measured
    assert out.endswith(CLEAR) and last == "\x1b[2K"
    assert all(len(line) <= 99 for line in out.split(CLEAR))
    assert p._thread is None and not ticker_alive()


def test_eta_is_timed_from_the_first_read():
    buf, clock = io.StringIO(), FakeClock()
    p = StageProgress(True, buf, total=100, interval=60, clock=clock)
    p.phase("loading big.pt", 100, measured=True)
    clock.t += 30.0  # e.g. importing torch: no bytes read yet, no ETA
    p.draw()
    p.advance(10)
    clock.t += 0.5
    p.draw()
    assert "ETA" not in buf.getvalue()  # under a second of reading: no ETA yet
    p.advance(10)
    clock.t += 0.5
    p.draw()
    p.done()
    assert buf.getvalue().count("ETA") == 1 and "stage ETA 8 s" in buf.getvalue()  # 10 B/s, 80 B left


def test_cleared_and_ticker_stopped_on_an_exception():
    buf = io.StringIO()
    p = StageProgress(True, buf, total=10, interval=0.01)
    with pytest.raises(RuntimeError):
        try:
            p.phase("encoding with mucsc", 10)
            time.sleep(0.1)
            raise RuntimeError("boom")
        finally:
            p.done()
    out = buf.getvalue()
    assert out.endswith(CLEAR)
    assert out.count(CLEAR) >= 3  # the ticker redrew the line while "encoding" ran
    assert not ticker_alive()
    time.sleep(0.05)
    assert buf.getvalue() == out  # nothing drawn after done()


def test_elapsed_time_ticks_while_a_stage_has_no_measure():
    buf = io.StringIO()
    p = StageProgress(True, buf, total=10, interval=0.02)
    try:
        p.phase("encoding with mucsc", 10)
        time.sleep(0.3)
    finally:
        p.done()
    times = [float(t) for t in re.findall(r"\] (\d+\.\d) s", buf.getvalue())]
    assert len(times) >= 3 and times == sorted(times) and times[-1] > times[0]


def test_nothing_drawn_before_the_delay():
    buf, clock = io.StringIO(), FakeClock()
    p = StageProgress(True, buf, total=10, delay=1.0, interval=60, clock=clock)
    p.phase("loading x", 10, measured=True)
    p.advance(5)
    p.draw()
    assert buf.getvalue() == ""  # a quick run leaves no trace, not even the clearing
    clock.t += 1.0
    p.draw()
    assert "mucsc: loading x...  50% [" in buf.getvalue()
    p.done()
    assert buf.getvalue().endswith(CLEAR)
    quick = StageProgress(True, io.StringIO(), total=10, delay=1.0, interval=60, clock=FakeClock())
    quick.phase("loading y", 10)
    quick.done()
    assert quick.stream.getvalue() == ""


def test_hook_moves_the_stage_by_the_api_fraction():
    buf, clock = io.StringIO(), FakeClock()
    p = StageProgress(True, buf, total=40, interval=60, clock=clock)
    p.phase("loading x", 10, measured=True)
    p.advance(10)
    p.phase("encoding", 30, measured=True)
    hook = p.hook()
    hook(50, 100)
    assert p.fraction() == pytest.approx((10 + 15) / 40)
    hook(100, 100)
    assert p.fraction() == 1.0
    p.done()


def test_disabled_writes_nothing_and_starts_no_thread():
    buf = io.StringIO()
    p = StageProgress(False, buf, total=10, interval=0.01)
    p.phase("loading x", 10, measured=True)
    p.advance(5)
    p.done()
    assert buf.getvalue() == "" and p._thread is None and not ticker_alive()


def test_long_names_fit_the_terminal():
    p = StageProgress(True, io.StringIO(), total=10, columns=60)
    p.text = "loading " + "x" * 200 + ".safetensors"
    line = p.render()
    assert len(line) == 59 and line.startswith("mucsc: loading xxx") and "0% [" in line


# ---- the counting reader -------------------------------------------------------------------------

def test_counting_reader_passes_reads_and_seeks_through():
    data = bytes(range(256)) * 100_000  # 25.6 MB: more than one readinto slice
    counts = []
    r = CountingReader(io.BytesIO(data), counts.append)
    assert r.readable() and r.seekable()
    assert r.read(10) == data[:10] and r.tell() == 10
    buf = bytearray(len(data) - 10)
    assert r.readinto(buf) == len(buf) and bytes(buf) == data[10:]
    assert len(counts) >= 1 + len(buf) // CountingReader.CHUNK  # the big read was reported in slices
    assert r.seek(-5, 2) == len(data) - 5 and r.read() == data[-5:] and r.read(3) == b""
    assert r.seek(7) == 7 and r.read(None) == data[7:]
    assert sum(counts) == 10 + len(buf) + 5 + len(data) - 7


@pytest.mark.parametrize("suffix", [".npz", ".safetensors", ".npy"])
def test_counting_load_equals_load(tmp_path, suffix):
    rng = np.random.default_rng(1)
    tensors = {"w": rng.standard_normal((300, 9000), dtype=np.float32),  # 10.8 MB
               "b": rng.standard_normal(9).astype(np.float16), "n": np.arange(3, dtype=np.int64)}
    path = tmp_path / f"m{suffix}"
    tf.save(path, tensors if suffix != ".npy" else tensors["w"])
    counts = []
    got = cli_main._load_counting(str(path), counts.append)
    want = tf.load(path)
    assert (got.format, got.bare, got.notes, list(got.tensors)) == \
        (want.format, want.bare, want.notes, list(want.tensors))
    for k in want.tensors:
        assert got.tensors[k].dtype == want.tensors[k].dtype
        np.testing.assert_array_equal(got.tensors[k], want.tensors[k])
    assert sum(counts) >= path.stat().st_size  # every byte went through the reader (zip re-reads some)


def test_counting_load_errors_match_load(tmp_path):
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{}")
    (tmp_path / "d.npz").mkdir()
    for path in (bad, tmp_path / "missing.npz", tmp_path / "d.npz"):
        with pytest.raises(tf.TensorFileError) as want:
            tf.load(path)
        with pytest.raises(tf.TensorFileError) as got:
            cli_main._load_counting(str(path), lambda n: None)
        assert str(got.value) == str(want.value)


# ---- the command ---------------------------------------------------------------------------------

def compress(args, code=0):
    r = CliRunner().invoke(main, ["compress", *map(str, args)])
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        raise r.exception
    assert r.exit_code == code, (r.exit_code, r.stderr)
    return r


@pytest.mark.parametrize("suffix", [".safetensors", ".npz", ".pt"])
def test_compress_with_the_bar_forced_on(tmp_path, monkeypatch, suffix):
    monkeypatch.chdir(tmp_path)  # short names: the line is cut to the terminal's width
    tmp_path = tmp_path.relative_to(tmp_path)
    rng = np.random.default_rng(2)
    new = {"w": rng.standard_normal((200, 300), dtype=np.float32), "n": np.arange(4, dtype=np.int64)}
    old = {"w": rng.standard_normal((200, 300), dtype=np.float32), "n": np.arange(4, dtype=np.int64)}
    if suffix == ".pt":
        torch = pytest.importorskip("torch")
        for name, t in (("new", new), ("old", old)):
            torch.save({k: torch.from_numpy(v) for k, v in t.items()}, tmp_path / f"{name}{suffix}")
    else:
        tf.save(tmp_path / f"new{suffix}", new)
        tf.save(tmp_path / f"old{suffix}", old)
    src, base = tmp_path / f"new{suffix}", tmp_path / f"old{suffix}"
    plain = compress([src, "--base", base, "-o", tmp_path / "plain.mucsc"])
    assert "% [" not in plain.stderr and CLEAR not in plain.stderr  # CliRunner: not a terminal

    monkeypatch.setattr(cli_main, "_is_terminal", lambda stream: True)
    monkeypatch.setattr(cli_main, "PROGRESS_DELAY_S", 0)
    moves, advance = [], StageProgress.advance
    monkeypatch.setattr(StageProgress, "advance", lambda self, n: (moves.append((self.text, n)), advance(self, n)))
    r = compress([src, "--base", base, "-o", tmp_path / "bar.mucsc"])
    assert (tmp_path / "bar.mucsc").read_bytes() == (tmp_path / "plain.mucsc").read_bytes()
    bar, report_text = r.stderr.rsplit(CLEAR, 1)
    assert report_text == plain.stderr.replace("plain.mucsc", "bar.mucsc")  # cleared, then the report
    assert f"mucsc: loading {src}... " in bar and f"mucsc: loading {base}... " in bar
    assert "mucsc: encoding with mucsc... " in bar and re.search(r"\d+% \[#+\.*\] \d+\.\d s", bar)
    if suffix == ".pt":  # importing torch is a stage of its own, shown before any byte is read
        assert bar.index("mucsc: importing torch") < bar.index("mucsc: loading")
    # the API's progress hook moves the bar through the whole encoding stage
    assert sum(n for text, n in moves if text.startswith("encoding")) == pytest.approx(cli_main.ENCODE_WEIGHT * src.stat().st_size)
    seen = percents(bar)
    assert seen == sorted(seen) and seen[-1] == 100 and len(set(seen)) >= 3
    assert not ticker_alive()
    assert compress([src, "-o", tmp_path / "q.mucsc", "-q"]).stderr == ""


def test_compress_error_with_the_bar_clears_it_first(tmp_path, monkeypatch):
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{}")
    plain = compress([bad, "--shared"], code=1)  # loaded whole: the bar is up when the error comes
    monkeypatch.setattr(cli_main, "_is_terminal", lambda stream: True)
    monkeypatch.setattr(cli_main, "PROGRESS_DELAY_S", 0)
    streamed = compress([bad], code=1)  # streamed: the header is read before any bar
    assert streamed.stderr == plain.stderr and CLEAR not in streamed.stderr
    r = compress([bad, "--shared"], code=1)
    bar, message = r.stderr.rsplit(CLEAR, 1)
    assert message == plain.stderr and message.startswith(f"mucsc: error: {bad}: ")
    assert "mucsc: loading" in bar and not ticker_alive()
    assert not list(tmp_path.glob("*.mucsc*"))


# ---- mucsc sim: the sweep's progress (many runs, round by round) -------------------------------------

class Rec:
    def __init__(self, round, accuracy=None, loss=None):
        self.round, self.accuracy, self.loss = round, accuracy, loss


def test_sweep_progress_eta_bar_and_log_lines():
    from mucsc.progress import SweepProgress

    buf, clock = io.StringIO(), FakeClock()
    p = SweepProgress(True, ("none", "mucsc"), 10, stream=buf, columns=200, clock=clock)
    p.start_run(0)
    assert "round    0/10 acc   -   0:00 ETA --:--" in buf.getvalue()  # no round done: no ETA
    for r in range(1, 6):
        clock.t += 2.0
        p.round(0, Rec(r, 0.5 + r / 100))
    # 5 of 20 rounds in 10 s: 15 left at 2 s each
    assert p.eta() == (0.25, 30.0)
    line = p.render(0)
    assert line.startswith("[######                  ] run 1/2 none") and "round    5/10 acc 0.550 0:10 ETA 0:30" in line
    p.end_run(0)  # stopped early (a target accuracy): the next run is expected to take 5 rounds too
    assert p.eta()[1] == 10.0
    p.close()
    assert buf.getvalue().count(CLEAR) == 6 and buf.getvalue().endswith("\n")

    log, quiet = io.StringIO(), io.StringIO()
    p = SweepProgress(False, ("none",), 10, log=True, stream=log, clock=clock)
    p.round(0, Rec(1))  # no evaluation this round: no line
    p.round(0, Rec(2, 0.75, 0.5))
    p.close()
    assert log.getvalue() == "run 1/1 none round 2/10 acc 0.7500 loss 0.5000 elapsed 0:00\n"
    p = SweepProgress(False, ("none",), 10, stream=quiet)
    p.start_run(0)
    p.round(0, Rec(1, 0.5))
    p.close()
    assert quiet.getvalue() == ""


def test_decompress_shows_decoding_progress_on_a_terminal(tmp_path, monkeypatch):
    src = tmp_path / "m.npz"
    tf.save(src, {"a": np.linspace(-1, 1, 5000, dtype=np.float32), "b": np.ones(300, np.float32)})
    compress([src, "-o", tmp_path / "m.mucsc", "-q"])
    plain = CliRunner().invoke(main, ["decompress", str(tmp_path / "m.mucsc"), "-o", str(tmp_path / "a.npz")])
    assert plain.exit_code == 0 and CLEAR not in plain.stderr
    monkeypatch.setattr(cli_main, "_is_terminal", lambda stream: True)
    monkeypatch.setattr(cli_main, "PROGRESS_DELAY_S", 0)
    moves, advance = [], StageProgress.advance
    monkeypatch.setattr(StageProgress, "advance", lambda self, n: (moves.append((self.text, n)), advance(self, n)))
    r = CliRunner().invoke(main, ["decompress", str(tmp_path / "m.mucsc"), "-o", str(tmp_path / "b.npz")])
    assert r.exit_code == 0, r.stderr
    bar, report_text = r.stderr.rsplit(CLEAR, 1)
    assert "mucsc: decoding " in bar and report_text == plain.stderr.replace("a.npz", "b.npz")
    assert sum(n for text, n in moves if text.startswith("decoding")) == pytest.approx(1.0)
    assert not ticker_alive()
