"""Progress lines on stderr for the two kinds of long work mucsc does.

:class:`StageProgress` follows ONE job through stages of known weight (``mucsc compress``: reading the
input bytes, encoding, writing), redrawn by a ticker thread while a stage gives no progress hook.
:class:`SweepProgress` follows MANY runs that advance concurrently round by round (``mucsc sim``: one
run per codec and seed), with an ETA from the rounds done and a plain log line per evaluation when
stderr is not a terminal.  They are two classes because their inputs differ (bytes of stages against
rounds of concurrent runs) and neither needs the other's; they share how a line is drawn: redrawn in
place with ``\r`` + erase-line, fitted to the terminal's width, cleared or ended when done.

A utility module of no layer: the CLI and the simulator both import it.
"""

from __future__ import annotations

import os
import shutil
import sys
import threading
import time
from collections.abc import Callable
from typing import IO

_ERASE = "\r\x1b[2K"  # back to the line's start, then erase it


def _redraw(stream: IO[str], text: str) -> None:
    """Replace the current terminal line by ``text`` (nothing: clear it)."""
    stream.write(_ERASE + text)
    stream.flush()


def _fit(head: str, tail: str, columns: int) -> str:
    """``head + tail`` within ``columns - 1`` characters: the head is shortened (with "..."), never
    the tail, which holds the numbers."""
    room = max(columns - 1 - len(tail), 12)
    if len(head) > room:
        head = head[: room - 3] + "..."
    return head + tail


def _bar(fraction: float, width: int, empty: str) -> str:
    filled = int(min(max(fraction, 0.0), 1.0) * width)
    return "#" * filled + empty * (width - filled)


def clock_text(seconds: float) -> str:
    """Seconds as m:ss ("--:--" when unknown, i.e. NaN)."""
    if seconds != seconds:  # nan
        return "--:--"
    s = int(round(seconds))
    return f"{s // 60:d}:{s % 60:02d}"


class StageProgress:
    """The progress of ONE job made of stages (``mucsc compress``): "mucsc: STAGE... 42% [#####...] 3.1 s".

    The job is a sequence of stages, each a share (``weight``) of ``total``; a stage with a real measure
    (bytes read; elements encoded, from the API's ``progress`` hook via :meth:`hook`) moves the bar
    through its share and shows an ETA for that stage; a stage without one (importing torch) holds the
    bar at its start while the elapsed time keeps ticking, redrawn every ``interval`` seconds by a
    daemon thread, so the user sees it is alive.  Nothing is drawn before ``delay`` seconds have
    passed (a quick job leaves no trace).  The line is redrawn with \\r and cleared by :meth:`done`
    (call it in a ``finally``).  Disabled (not a terminal, -q): writes nothing and starts no thread.
    """

    def __init__(self, enabled: bool, stream: IO[str] | None = None, *, total: float = 0.0,
                 interval: float = 0.2, delay: float = 0.0, columns: int | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.enabled = enabled
        self.delay = delay
        self.stream = stream or sys.stderr
        self.total = float(total)
        self.interval = interval
        self.columns = columns or _columns(self.stream)
        self.clock = clock
        self.t0 = clock()
        self.text = ""
        self.start = 0.0     # units done before the current stage
        self.weight = 0.0    # the current stage's share of ``total``
        self.measured = False
        self.count = 0.0     # units done inside the current stage (measured stages only)
        self.mark: tuple[float, float] | None = None  # (time, count) at the stage's first read
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.shown = False  # drawn at least once (then done() clears the line)

    def phase(self, text: str, weight: float = 0.0, measured: bool = False) -> None:
        """Start a stage (the previous one counts as complete) taking ``weight`` units of the total."""
        with self._lock:  # the ticker never draws a half-updated stage
            self.start = min(self.start + self.weight, self.total)
            self.text, self.weight, self.measured, self.count = text, float(weight), measured, 0.0
            self.mark = None
        if self.enabled:
            self.draw()
            if self._thread is None:
                self._thread = threading.Thread(target=self._tick, name="mucsc-progress", daemon=True)
                self._thread.start()

    def advance(self, n: float) -> None:
        """``n`` more units of the current (measured) stage are done; drawn by the ticker."""
        self.count += n
        if self.mark is None:  # the rate is timed from the first read on (not from e.g. importing torch)
            self.mark = (self.clock(), self.count)

    def hook(self) -> Callable[[int, int], None]:
        """A ``progress(done, total)`` callable (the API's hook) that moves the current stage's share."""
        def on_progress(done: int, total: int) -> None:
            self.advance(self.weight * (done / total if total else 1.0) - self.count)
        return on_progress

    def fraction(self) -> float | None:
        """Share of the whole job done, 0..1 (None without a total)."""
        if self.total <= 0:
            return None
        inside = min(self.count, self.weight) if self.measured else 0.0
        return min((self.start + inside) / self.total, 1.0)

    def render(self) -> str:
        """The line as drawn (without the leading carriage return), fitted to the terminal width."""
        now = self.clock()
        tail = f" {now - self.t0:.1f} s"
        if self.measured and self.mark is not None and self.count < self.weight:
            t1, c1 = self.mark
            if now - t1 >= 1 and self.count > c1:  # an ETA only from a second of measured reading
                left = (now - t1) * (self.weight - self.count) / (self.count - c1)
                tail += f", stage ETA {left:.0f} s"
        frac = self.fraction()
        if frac is not None:
            tail = f" {int(100 * frac):3d}% [{_bar(frac, 20, '.')}]" + tail
        return _fit(f"mucsc: {self.text}...", tail, self.columns)

    def draw(self) -> None:
        if self.enabled and self.clock() - self.t0 >= self.delay:
            with self._lock:
                if not self._stop.is_set():
                    _redraw(self.stream, self.render())
                    self.shown = True

    def _tick(self) -> None:
        while not self._stop.wait(self.interval):
            self.draw()

    def done(self) -> None:
        """Stop the ticker and clear the line (on success and on error alike)."""
        if not self.enabled:
            return
        with self._lock:
            self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self.shown:
            _redraw(self.stream, "")


def _columns(stream: IO[str]) -> int:
    """The width of the terminal ``stream`` writes to (stdout may be a pipe while stderr is not)."""
    try:
        cols = os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, ValueError, OSError):
        cols = 0
    # some terminals (serial consoles, CI ptys) report 0 columns: use $COLUMNS or 80
    return cols if cols > 0 else (shutil.get_terminal_size((80, 24)).columns or 80)


class SweepProgress:
    """The progress of MANY runs advancing concurrently, round by round (``mucsc sim``): on a terminal
    one line "[####    ] run 2/7 mucsc round 12/50 acc 0.913 0:41 ETA 2:10" for the run that moved
    last; ``log`` (stderr piped), one plain line per evaluation instead; disabled (-q) it writes
    nothing.  Runs may stop early (a target accuracy), so the ETA counts the finished runs' mean
    rounds for the runs not yet started."""

    def __init__(self, enabled: bool, runs: tuple[str, ...], rounds_limit: int, log: bool = False,
                 stream: IO[str] | None = None, columns: int | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.enabled, self.runs, self.limit, self.log = enabled, runs, rounds_limit, log
        self.stream = stream or sys.stderr
        self.columns = columns or (_columns(self.stream) if enabled else 80)
        self.clock = clock
        self.t0 = clock()
        self.rounds: dict[int, int] = {}      # run index -> rounds done
        self.finished: set[int] = set()
        self.acc: dict[int, float] = {}

    def start_run(self, idx: int) -> None:
        self.rounds[idx] = 0
        self.draw(idx)

    def round(self, idx: int, rec) -> None:
        """Run ``idx`` finished the round of ``rec`` (a RoundRecord: round, accuracy, loss)."""
        self.rounds[idx] = rec.round
        if rec.accuracy is not None:
            self.acc[idx] = rec.accuracy
            if self.log:  # not a terminal: one plain line per evaluation instead of the bar
                loss = "nan" if rec.loss is None else f"{rec.loss:.4f}"
                self.stream.write(f"run {idx + 1}/{len(self.runs)} {self.runs[idx]} round {rec.round}/{self.limit} "
                                  f"acc {rec.accuracy:.4f} loss {loss} "
                                  f"elapsed {clock_text(self.clock() - self.t0)}\n")
                self.stream.flush()
        self.draw(idx)

    def end_run(self, idx: int) -> None:
        self.finished.add(idx)

    def rounds_of(self, idx: int) -> int:
        return self.rounds.get(idx, 0)

    def eta(self) -> tuple[float, float]:
        """(fraction of all rounds done, seconds left; NaN before the first round)."""
        elapsed = self.clock() - self.t0
        done = sum(self.rounds.values())
        fin = [self.rounds[i] for i in self.finished]
        per_run = sum(fin) / len(fin) if fin else self.limit
        left = sum(max(self.limit - r, 0) for i, r in self.rounds.items() if i not in self.finished)
        left += per_run * (len(self.runs) - len(self.rounds))
        return min(done / max(done + left, 1), 1.0), (elapsed / done * left if done else float("nan"))

    def render(self, idx: int) -> str:
        """The line for run ``idx`` (without the leading erase)."""
        fraction, left = self.eta()
        acc = self.acc.get(idx)
        acc_s = "  -  " if acc is None else f"{acc:.3f}"
        head = f"[{_bar(fraction, 24, ' ')}] run {idx + 1}/{len(self.runs)} {self.runs[idx]:<8}"
        tail = (f" round {self.rounds.get(idx, 0):>4}/{self.limit} acc {acc_s} "
                f"{clock_text(self.clock() - self.t0)} ETA {clock_text(left)}")
        return _fit(head, tail, self.columns)

    def draw(self, idx: int) -> None:
        if self.enabled:
            _redraw(self.stream, self.render(idx))

    def close(self) -> None:
        """End the line, leaving the last state visible above what follows."""
        if self.enabled:
            self.stream.write("\n")
            self.stream.flush()
