"""The dithered layout of ``mucsc`` (``rounding="dithered"``, spec/FORMAT.md 4.5, format 1.2): a
uniform grid with subtractive dither (:mod:`mucsc.codec.numerics.dither`), the indices rANS-coded per
context, the tails escaped.  Sections ``GRID`` (step, offset, share of the dither subtracted, lowest
index, dither key), ``QIDX``
(the coded indices) and ``QESC`` (escaped indices).  :class:`DitherTrials` is the measuring protocol
rate control drives for a goal (the search over the step: :mod:`mucsc.codec.ratecontrol.dither_search`).
Private to the ``mucsc`` codec: not a codec itself.
"""

from __future__ import annotations

import dataclasses
import math
import struct
from collections.abc import Callable, Iterator, Mapping
from typing import Any, NamedTuple

import numpy as np

from mucsc.codec import kernels
from mucsc.codec.codecs.base import Section, param_int, section
from mucsc.codec.numerics import dither, quantize
from mucsc.codec.numerics.centroids import _sample_sorted
from mucsc.codec.wire import rans
from mucsc.errors import FormatError, ParameterError

FORMAT_MINOR = 2
GRID = struct.Struct("<dddqQ")  # step, offset, share, q_lo, dither key
CONTEXTS = struct.Struct("<B")
LENGTH = struct.Struct("<I")
TINY = 2.0**-60  # a constant vector's step, relative to its value: every index 0, the error negligible


@dataclasses.dataclass(frozen=True)
class Grid:
    """One dithered encoding's grid: the step and the offset (rate control's choice) and the share of
    the dither the receiver subtracts (None: the share minimising J, :func:`dither.best_share`)."""

    step: float
    offset: float
    share: float | None = None
    params: tuple = ()  # the header params it produced (an allocate.Option key carries them)

    def settings(self) -> dict[str, Any]:
        """The codec parameters that fix this grid (what the planner resolves a goal to)."""
        return {"grid": (self.step, self.offset)}


def check_grid(p: Any) -> None:
    """Validate (and normalise to a tuple of floats) the explicit ``grid`` (step, offset[, share]) of
    mucsc's parameters: dithered rounding only, finite, a positive step, a share in [0, 1] (without
    it: the share minimising J), and not together with a goal."""
    if p.grid is None:
        return
    if p.rounding != "dithered":
        raise ParameterError(f"grid is the dithered rounding's: it excludes rounding={p.rounding!r}")
    if p.target != "z":
        raise ParameterError(f"grid fixes the encoding: it excludes {p.target}=")
    try:
        vals = tuple(float(v) for v in p.grid)
    except (TypeError, ValueError):
        vals = ()
    if len(vals) not in (2, 3):
        raise ParameterError(f"grid must be (step, offset) or (step, offset, share), numbers, got {p.grid!r}")
    step, offset = vals[:2]
    if not (math.isfinite(step) and step > 0 and math.isfinite(offset)):
        raise ParameterError(f"grid: step {step!r} must be finite and positive, offset {offset!r} finite")
    if len(vals) == 3 and not 0.0 <= vals[2] <= 1.0:
        raise ParameterError(f"grid: share {vals[2]!r} (of the dither subtracted) must be in [0, 1]")
    object.__setattr__(p, "grid", vals)


def fixed_grid(x: np.ndarray, z: int) -> Grid:
    """The grid of a fixed ``z``: z points across [min x, max x] (step (max - min) / (z - 1)), offset 0;
    a constant vector gets offset = its value and a negligible step (every index 0)."""
    if x.size == 0:
        return Grid(1.0, 0.0)
    lo, hi = float(x.min()), float(x.max())
    if hi == lo:
        return Grid(max(abs(lo), 2.0**-900) * TINY, lo)
    return Grid(max((hi - lo) / (z - 1), min_step(x, 0.0)), 0.0)


def min_step(x: np.ndarray, offset: float, bounds: tuple[float, float] | None = None) -> float:
    """The smallest step keeping every |q| below dither.MAX_INDEX / 4.  The largest |x - offset| (in
    float64) is at x's minimum or maximum (``bounds`` where the caller has them): float64
    subtraction rounds monotonically."""
    lo, hi = bounds or ((float(x.min()), float(x.max())) if x.size else (0.0, 0.0))
    big = max(abs(lo - offset), abs(hi - offset)) if x.size else 0.0
    return big * 4.0 / dither.MAX_INDEX if big else 0.0


def encode(x: np.ndarray, rng: np.random.Generator, grid: Grid, estimate: bool = False, cache: dict | None = None,
           bounds: tuple[float, float] | None = None) -> tuple[dict, tuple[Section, ...], Callable[[], float]]:
    """(header params, sections, J) of x on ``grid``: one draw from ``rng`` (the dither key).
    ``estimate``: QIDX and QESC as zeros of their estimated sizes (rate control; never sent).
    ``cache``: kept by a caller that encodes x again with the same key (a goal's search).
    ``bounds``: (min x, max x) where the caller has them."""
    n = x.size
    key = quantize.draw_key(rng)
    if cache is not None and cache.get("key") == key:
        t = cache["t"]
    else:
        t = dither.stream(key, n)
        if cache is not None:
            cache.update(key=key, t=t)
    if n and bounds is None:
        bounds = (float(x.min()), float(x.max()))
    q, straddled, hist = dither.rounded(x, grid.step, grid.offset, t, grid.share != 1.0, bounds)
    alpha, c, est, counts = dither.chosen_alphabet(q, t, hist)
    params = _params(alpha)
    share = dither.best_share(n, straddled) if grid.share is None else grid.share
    head = Section("GRID", GRID.pack(grid.step, grid.offset, share, alpha.q_lo, key))
    if estimate:
        sections = (head, Section("QIDX", bytes(int(est))))
    else:
        by_context, esc = dither.symbols_by_context(alpha, q, t, c, counts)
        parts = [CONTEXTS.pack(c)]
        for part, part_counts in zip(by_context, counts):
            coded = rans.encode(part, alpha.symbols, counts=part_counts)
            parts += [LENGTH.pack(len(coded)), coded]
        sections = (head, Section("QIDX", b"".join(parts)))
        if alpha.escape:
            sections += (Section("QESC", dither.zigzag_varints(esc - alpha.q_lo)),)
    J = dither.variance(n, grid.step, share, straddled)
    return params, sections, lambda: J


def _params(alpha: dither.Alphabet) -> dict:
    """The header params of a dithered group with this index alphabet."""
    return {"escape": alpha.escape, "rounding": "dithered", "symbols": alpha.symbols}


CHUNK = 1 << 18  # elements per decoding pass: the scratch is ~40 bytes an element, whatever n is


def decode(n: int, params: Mapping[str, Any], sections: Mapping[str, memoryview], dtype: np.dtype) -> np.ndarray:
    """Inverse of :func:`encode`, validating the untrusted header and sections (FORMAT.md 4.5).
    Every length is checked against n before the output is allocated (:class:`_Indices`); with the
    compiled kernels the group is decoded in one fused pass (:func:`_fused`, no scratch), else the
    passes of :func:`decode_parts` are written into the output."""
    head = _open(n, params, sections)
    y = kernels.output_array(n, dtype)  # reserved (not written) before the counting pass; huge pages
    if _fused(head.indices, head.q_lo, head.k, head.escape, sections, head.step, head.offset, head.share, y):
        return y
    at = 0
    for part in _passes(head, n, dtype):
        y[at: at + part.size] = part
        at += part.size
    return y


def decode_parts(n: int, params: Mapping[str, Any], sections: Mapping[str, memoryview], dtype: np.dtype
                 ) -> Iterator[np.ndarray]:
    """:func:`decode`'s values in passes of ``CHUNK`` elements (``Codec.decode_parts``).  Every
    length is checked against n before the first pass (:class:`_Indices`); the dither is regenerated
    for each pass from its position in the counter stream, so the working memory is a fixed scratch."""
    yield from _passes(_open(n, params, sections), n, dtype)


class _Head(NamedTuple):
    """A dithered group's checked header: its alphabet, GRID and the readers of QIDX / QESC."""
    k: int
    escape: bool
    step: float
    offset: float
    share: float
    q_lo: int
    key: int
    indices: "_Indices"
    esc: Any


def _open(n: int, params: Mapping[str, Any], sections: Mapping[str, memoryview]) -> _Head:
    """The untrusted header and GRID checked, the index stream's lengths checked against n."""
    k = param_int(params, "symbols", 1, dither.MAX_SYMBOLS)
    escape = params.get("escape")
    if not isinstance(escape, bool) or (escape and k < 2):
        raise FormatError(f"header parameter 'escape' must be true or false (true needs 2 symbols), got {escape!r}")
    step, offset, share, q_lo, key = GRID.unpack(bytes(section(sections, "GRID", GRID.size)))
    if not (math.isfinite(step) and step > 0 and math.isfinite(offset)):
        raise FormatError(f"GRID: step {step!r} must be finite and positive, offset {offset!r} finite")
    if not 0.0 <= share <= 1.0:
        raise FormatError(f"GRID: share {share!r} must be in [0, 1]")
    if abs(q_lo) > dither.MAX_INDEX or q_lo + k - 1 > dither.MAX_INDEX:
        raise FormatError(f"GRID: lowest index {q_lo} out of range")
    indices = _Indices(n, k, key, section(sections, "QIDX"))
    esc = dither.ZigzagReader(section(sections, "QESC"), 2 * dither.MAX_INDEX) if escape else None
    return _Head(k, escape, step, offset, share, q_lo, key, indices, esc)


def _passes(head: _Head, n: int, dtype: np.dtype) -> Iterator[np.ndarray]:
    """The values ``CHUNK`` at a time, each pass's dither regenerated from the counter stream."""
    k, step, offset, share, q_lo, key, indices, esc = (head.k, head.step, head.offset, head.share, head.q_lo,
                                                        head.key, head.indices, head.esc)
    indices.count()
    for a in range(0, n, CHUNK):
        t = dither.stream(key, min(CHUNK, n - a), a)
        sym = indices.take(t)
        q = sym.astype(np.int64) + q_lo
        if esc is not None:
            _unescape(q, sym == k - 1, esc, q_lo, k)
        with np.errstate(over="ignore", invalid="ignore"):
            part = dither.dequantize(q, step, offset, dither.uniforms(t), dtype, share)
        if not np.all(np.isfinite(part)):
            raise FormatError(f"the grid (step {step:g}, offset {offset:g}) decodes beyond the range of {dtype}")
        yield part
    indices.finish()
    if esc is not None and (left := esc.finish()):
        raise FormatError(f"QESC: {left}")


def _fused(indices: "_Indices", q_lo: int, k: int, escape: bool, sections: Mapping[str, memoryview], step: float,
           offset: float, share: float, y: np.ndarray) -> bool:
    """Decode the whole group into ``y`` in one compiled pass (``dither_decode``: the stream, the
    contexts, every context's rANS lanes, the escapes and the dequantisation element by element, no
    scratch; each context's slot lookup a few KiB) -> True; False where the kernels are not built,
    y is not float32/float64, or the pass met anything wrong (a stream ending early, a bad
    escape, a value not finite, escape bytes left over): the chunked path then decodes the group
    from the start and names the problem as it always did.  After the pass it checks the lanes'
    final states (:meth:`_Indices.finish`, what the chunked path checks last)."""
    states = [lanes.decoder() for lanes in indices.lanes]
    qesc = section(sections, "QESC") if escape else b""
    done = dither.fused_decode(indices.key, indices.c, tuple(states), q_lo, k, escape, qesc, step, offset, share, y)
    if done is None:
        return False
    code, read, counts = done
    if code or read != len(qesc):
        return False
    indices.count(counts)
    for lanes, state, count in zip(indices.lanes, states, counts):
        lanes.resume(state, count)
    indices.finish()
    return True


def _unescape(q: np.ndarray, out: np.ndarray, esc: dither.ZigzagReader, q_lo: int, k: int) -> None:
    """Put the escaped indices of one pass (where ``out``) into q, the next ones from QESC, checked:
    outside the alphabet's inner range and |q| <= MAX_INDEX."""
    got = esc.take(int(out.sum()))
    if isinstance(got, str):
        raise FormatError(f"QESC: {got}")
    if got.size:
        got += q_lo
        if (np.any(got > dither.MAX_INDEX) or np.any(got < -dither.MAX_INDEX)
                or np.any((got >= q_lo) & (got < q_lo + k - 1))):
            raise FormatError("QESC: an escaped index is out of range or inside the alphabet")
        q[out] = got


TABLES = 32 << 20  # bytes of the contexts' rANS slot tables kept between passes (else rebuilt each pass)


class _Indices:
    """The n symbols of QIDX, a pass at a time: per context, an IDSA payload (FORMAT.md 4.4) of that
    context's symbols in element order.  The constructor parses every context's payload and checks
    that together they can code n symbols at their tables' probabilities (:meth:`rans.Lanes.capacity`);
    :meth:`count` counts each context's elements and checks each payload against its count; then
    :meth:`take` routes the next symbols of each context to their elements."""

    def __init__(self, n: int, k: int, key: int, buf: memoryview):
        b = bytes(buf)
        if len(b) < 1:
            raise FormatError("QIDX: empty section")
        (c,) = CONTEXTS.unpack_from(b, 0)
        if not 1 <= c <= dither.MAX_CONTEXTS:
            raise FormatError(f"QIDX: {c} contexts (1..{dither.MAX_CONTEXTS})")
        self.n, self.key, self.c, self.lanes = n, key, c, []
        pos = 1
        for j in range(c):
            if pos + LENGTH.size > len(b):
                raise FormatError("QIDX: a context's length runs past the end of the section")
            (length,) = LENGTH.unpack_from(b, pos)
            pos += LENGTH.size
            if pos + length > len(b):
                raise FormatError("QIDX: a context's stream runs past the end of the section")
            try:
                self.lanes.append(rans.Lanes(memoryview(b)[pos: pos + length], None if c > 1 else n, k))
            except FormatError as exc:
                raise FormatError(f"QIDX context {j}: {exc}") from None
            pos += length
        if pos != len(b):
            raise FormatError(f"QIDX: {len(b) - pos} bytes after the last context")
        caps = [lanes.capacity() for lanes in self.lanes]
        if None not in caps and n > sum(caps):
            raise FormatError(f"QIDX: {n} indices cannot be coded in {len(b)} bytes with these tables")
        kept = 0
        for lanes in self.lanes:  # up to 64 contexts of 2^22-slot tables: those that fit TABLES are kept
            kept += lanes.table_bytes()
            lanes.keep_table = kept <= TABLES

    def count(self, counts: list[int] | None = None) -> None:
        """Count each context's elements (one pass over the dither stream, in chunks; ``counts``:
        those a fused pass counted) and check each context's payload against its count (FORMAT.md
        4.4's bounds; one context was checked against n when it was parsed)."""
        if self.c == 1:
            return
        if counts is None:
            counts = np.zeros(self.c, np.int64)
            for a in range(0, self.n, CHUNK):
                counts += dither.context_counts(dither.stream(self.key, min(CHUNK, self.n - a), a), self.c)
        for j, lanes in enumerate(self.lanes):
            try:
                lanes.expect(int(counts[j]))
            except FormatError as exc:
                raise FormatError(f"QIDX context {j}: {exc}") from None

    def take(self, t: np.ndarray) -> np.ndarray:
        """The symbols (uint32) of the next t.size elements, whose dither stream is ``t``."""
        c = self.c
        per = dither.context_counts(t, c) if c > 1 else (t.size,)
        parts = []
        for j in range(c):
            try:
                parts.append(self.lanes[j].take(int(per[j])))
            except FormatError as exc:
                raise FormatError(f"QIDX context {j}: {exc}") from None
        return dither.from_contexts(np.concatenate(parts) if c > 1 else parts[0], t, c)

    def finish(self) -> None:
        for j, lanes in enumerate(self.lanes):
            try:
                lanes.finish()
            except FormatError as exc:
                raise FormatError(f"QIDX context {j}: {exc}") from None


def format_minor(params: Mapping[str, Any]) -> int:
    return FORMAT_MINOR


class DitherTrials:
    """Trial encodings of one vector on dithered grids, measured by rate control (the measuring
    protocol: :mod:`mucsc.codec.ratecontrol.dither_search` decides which steps to try).  Every trial
    draws the same dither key from a fresh copy of the group's generator: the stream is made once."""

    def __init__(self, x: np.ndarray):
        self.x = x
        self._stream: dict = {}
        self._sample: tuple[np.ndarray, np.ndarray | None] | None = None  # the summary (:meth:`expected`)
        self._bounds: tuple[float, float] | None = None

    def bounds(self) -> tuple[float, float] | None:
        """(min x, max x), found once (None for an empty x)."""
        if self._bounds is None and self.x.size:
            self._bounds = (float(self.x.min()), float(self.x.max()))
        return self._bounds

    def encode(self, grid: Grid, rng: np.random.Generator, estimate: bool = True
               ) -> tuple[dict, tuple[Section, ...], Callable[[], float]]:
        """(header params, sections, J) of x on ``grid`` (``estimate``: index bytes estimated)."""
        return encode(self.x, rng, grid, estimate, self._stream, self.bounds())

    def expected(self, grid: Grid) -> tuple[dict, tuple[Section, ...], float] | None:
        """(header params, sections, J) x is expected to get on ``grid`` (offset 0, the J-minimising
        share), from its sorted summary without drawing the dither: QIDX as zeros of the estimated
        bytes (:func:`dither.expected_choice`), J estimated (exact when the summary is all of x).
        None where the model does not apply (a grid too fine for it): encode instead."""
        if self._sample is None:
            self._sample = _sample_sorted(self.x, *self.bounds())
        xs, w = self._sample
        got = dither.expected_choice(xs, w, grid.step)
        if got is None:
            return None
        alpha, _, est, straddled = got
        n = self.x.size
        J = dither.variance(n, grid.step, dither.best_share(n, straddled), straddled)
        sections = (Section("GRID", bytes(GRID.size)), Section("QIDX", bytes(int(est))))
        return _params(alpha), sections, J
