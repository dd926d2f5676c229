"""Whether sampled bytes show structure zstd could code below their order-0 entropy (FORMAT.md 4.6,
informative): the fixed-Z default's cheap test before its zstd trial.

An order-0 coder (IDSL's rANS) reaches the bytes' order-0 entropy; zstd beats it only through what
order-0 misses: repeats (LZ matches of 5 bytes or more: runs, tiles, smooth data) or a byte
distribution that changes along the data (its Huffman tables are per block).  :func:`screen`
looks for both on a few slices: every position of a window against sparse anchors for repeats, the
lanes' rate against the windows' own order-0 entropy.  One compiled call (``_kernels.byte_screen``);
the numpy twin here counts the same.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from mucsc.codec import kernels

__all__ = ["KEY", "STRIDE", "WINDOW", "MAX_SLICE", "Screen", "screen", "slice_stats"]

KEY = 5  # bytes per repeat key: zstd level 3's shortest match
STRIDE = 16  # an anchor every STRIDE bytes of a slice: a repeat of >= STRIDE + KEY - 1 bytes holds one
WINDOW = 1 << 12  # each slice's last bytes: every position probed, the bytes counted
TABLE_BITS = 14  # the anchors' hash table (the earliest anchor of each hash)
MUL = np.uint64(0x9E3779B97F4A7C15)
MAX_SLICE = 1 << 16
ENTROPY_MARGIN = 0.02  # the coded rate may exceed the windows' own order-0 entropy by this share
HIT_SHARE = 1 / 1024  # repeats in more than this share of the probes: structure
_XLOGX = np.arange(WINDOW + 1) * np.log2(np.maximum(np.arange(WINDOW + 1), 1))  # c log2 c of a window's counts


def _keys(s: np.ndarray) -> np.ndarray:
    """The KEY bytes at every position j <= len(s) - KEY, little-endian."""
    n = max(s.size - KEY + 1, 0)
    k = np.zeros(n, np.uint64)
    for j in range(KEY):
        k |= s[j:j + n].astype(np.uint64) << np.uint64(8 * j)
    return k


def _slice_hits(s: np.ndarray, stride: int, window: int) -> int:
    """The numpy twin of one slice's hits (``_kernels.byte_screen``)."""
    keys = _keys(s)
    p0 = min(max(s.size - window, 0), keys.size)
    with np.errstate(over="ignore"):
        h = ((keys * MUL) >> np.uint64(64 - TABLE_BITS)).astype(np.int64)
    table = np.full(1 << TABLE_BITS, keys.size, np.int64)  # keys.size: no anchor
    anchors = np.arange(0, keys.size, stride)
    np.minimum.at(table, h[anchors], anchors)
    a = table[h[p0:]]
    ok = (a < keys.size) & (a != np.arange(p0, keys.size))
    return int((keys[np.where(ok, a, 0)] == keys[p0:])[ok].sum())


def slice_stats(buf: np.ndarray, starts: np.ndarray, length: int, stride: int = STRIDE,
                window: int = WINDOW) -> tuple[int, np.ndarray]:
    """(hits, histograms) of the slices ``buf[s, s + length)`` (``buf``: contiguous uint8; ``starts``:
    int64; ``length`` <= 2^16, clipped to buf):
    the windows' (each slice's last ``window`` bytes) key positions whose hash's anchor (the earliest
    of the slice's positions 0, stride, ... with that hash) is another position with the same key,
    summed, and each window's byte counts -- compiled where built (``_kernels.byte_screen``)."""
    hist = np.zeros((starts.size, 256), np.int64)
    byte_screen = kernels.compiled("byte_screen")
    if byte_screen is not None:  # the kernel checks the slices against the buffer
        return int(byte_screen(buf, starts, length, stride, window, hist)), hist
    if not 0 <= length <= MAX_SLICE or np.any(starts < 0) or np.any(starts > buf.size):
        raise ValueError(f"slice_stats: slices of at most {MAX_SLICE} bytes inside the buffer")
    hits = 0
    for i, a in enumerate(starts.tolist()):
        s = buf[a: a + length]
        hits += _slice_hits(s, stride, window)
        hist[i] += np.bincount(s[max(s.size - window, 0):], minlength=256)
    return hits, hist


@dataclasses.dataclass(frozen=True)
class Screen:
    """The screen's counts of a sample: its windows' repeat hits (summed) and byte histograms."""

    hits: int
    hist: np.ndarray  # one row of 256 counts per slice's window

    def order0_suffices(self, coded: int, size: int) -> bool:
        """Whether the sample (of ``size`` packed bytes) shows none of the structure zstd could use,
        so that ``coded`` order-0-coded bytes are not meaningfully larger than its frame: repeats in
        at most HIT_SHARE of the probes, and the coded rate within ENTROPY_MARGIN of the windows' own
        order-0 entropy (zstd's literals cost at least that)."""
        n = self.hist.sum(axis=1).tolist()
        total = sum(n)
        if total == 0:
            return False
        # sum over windows of c log2(n / c): each window's empirical order-0 entropy, in bits
        bound = sum(k * math.log2(k) for k in n if k) - float(_XLOGX[self.hist].sum())
        probes = sum(max(k - KEY + 1, 0) for k in n)  # the windows' key positions
        return 8.0 * coded * total / size <= (1 + ENTROPY_MARGIN) * bound and self.hits <= HIT_SHARE * probes


def screen(buf: np.ndarray, starts: np.ndarray, length: int) -> Screen:
    """The :class:`Screen` of the slices ``buf[s, s + length)`` (as :func:`slice_stats`)."""
    return Screen(*slice_stats(buf, starts, length))
