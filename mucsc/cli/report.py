"""What the commands print: size tables with an unambiguous ratio line, and plain-JSON reports.

Ratios are said one way only: bytes first, then "N.NNx smaller (original/compressed), P% saved"
(gzip prints space saved, xz compressed/original, zstd original/compressed; users mix them up).
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Sequence
from typing import IO, Any

MAX_ROWS = 20  # larger tables show the first rows and one summary row

ITEMSIZE = {"bool": 1, "int8": 1, "uint8": 1, "int16": 2, "uint16": 2, "float16": 2, "bfloat16": 2,
            "int32": 4, "uint32": 4, "float32": 4, "int64": 8, "uint64": 8, "float64": 8}


def nbytes(n: int) -> str:
    """1234567 -> '1,234,567'."""
    return f"{n:,}"


def ratio_phrase(original: int, compressed: int) -> str:
    """'7.95x smaller (original/compressed), 87.4% saved' (or larger, when it grew)."""
    if compressed <= 0:
        return "n/a"
    if original >= compressed:
        saved = 100.0 * (1 - compressed / original) if original else 0.0
        return f"{original / compressed:.2f}x smaller (original/compressed), {saved:.1f}% saved"
    grew = 100.0 * (compressed / original - 1) if original else math.inf
    return f"{compressed / original:.2f}x larger (compressed/original), {grew:.1f}% more" if original \
        else "larger than the (empty) original"


def fmt_float(v: float | None) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "n/a"
    return f"{v:.3g}" if v == 0 or 1e-3 <= abs(v) < 1e4 else f"{v:.3e}"


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[bool]) -> list[str]:
    """Aligned text columns (right-aligned where ``right``)."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(c.rjust(w) if r else c.ljust(w) for c, w, r in zip(cells, widths, right)).rstrip()

    return [line(headers), *(line(r) for r in rows)]


def record_bytes(dtype: str, shape: Sequence[int]) -> int:
    return math.prod(shape) * ITEMSIZE.get(dtype, 0)


def compress_lines(src: str, dst: str, codec: str, params: dict[str, Any], shared: bool,
                   stats: Any, info: Any, norm2: float, base: str | None) -> list[str]:
    """The human report of ``mucsc compress``: one row per group, then the totals line."""
    rec_bytes = {r.name: record_bytes(r.dtype, r.shape) for r in info.records}
    rows = []
    for g, gs in zip(info.groups, stats.groups):
        names = g.records
        label = names[0] if len(names) == 1 else f"{len(names)} tensors"
        orig = sum(rec_bytes[n] for n in names)
        rows.append([str(g.index), label or "(array)", g.codec, nbytes(g.elements), nbytes(orig),
                     nbytes(g.bytes), fmt_float(8 * g.bytes / g.elements if g.elements else math.nan),
                     fmt_float(gs.stats.get("J"))])
    if len(rows) > MAX_ROWS:
        rest = rows[MAX_ROWS - 1:]
        rows = rows[: MAX_ROWS - 1] + [["...", f"{len(rest)} more groups", "", "", "", "", "", ""]]
    out = [f"{src} -> {dst}", "  codec " + " ".join([codec] + [f"{k}={v}" for k, v in params.items()])
           + (", one codebook for all float tensors" if shared else ", one codebook per tensor")
           + (f"; update relative to {base}" if base else "")]
    out += ["  " + s for s in table(["group", "tensors", "codec", "elements", "original B", "stored B",
                                     "bits/elem", "J"], rows, [True, False, False, True, True, True, True, True])]
    out.append("  total: " + totals_phrase(stats.original_bytes, stats.message_bytes, stats.elements,
                                           stats.J, norm2))
    return out


def totals_phrase(original: int, compressed: int, elements: int, J: float | None, norm2: float | None) -> str:
    """'5,200,008 -> 654,321 bytes, 7.95x smaller (...), 87.4% saved; 4.03 bits/element; J ...'."""
    bits = 8 * compressed / elements if elements else math.nan
    text = (f"{nbytes(original)} -> {nbytes(compressed)} bytes, {ratio_phrase(original, compressed)}; "
            f"{fmt_float(bits)} bits/element")
    if J is not None:
        text += f"; J = {fmt_float(J)}"
        rel = relative_error(J, norm2)
        if rel is not None:
            text += f", expected relative error sqrt(J)/||x|| = {100 * rel:.3g}%"
    return text


def relative_error(J: float | None, norm2: float | None) -> float | None:
    """sqrt(J / ||x||^2): the root-mean-square relative error to expect (None when undefined)."""
    if J is None or norm2 is None:
        return None
    if norm2 == 0:
        return 0.0 if J == 0 else None
    return math.sqrt(J / norm2)


def info_lines(name: str, info: Any) -> list[str]:
    """The human output of ``mucsc info``."""
    out = [f"{name}: mucsc message v{info.version}, {nbytes(info.size)} bytes, "
           f"{len(info.records)} tensor(s) in {len(info.groups)} group(s), container {info.container}",
           "  " + totals_phrase(info.original_bytes, info.size, info.elements, None, None)]
    if info.meta:
        out.append("  meta: " + ", ".join(f"{k}={v}" for k, v in sorted(info.meta.items())))
    out.append("records:")
    out += ["  " + s for s in table(["name", "dtype", "shape", "group"],
                                    [[r.name or "(array)", r.dtype, "x".join(map(str, r.shape)) or "scalar",
                                      str(r.group)] for r in info.records], [False, False, False, True])]
    out.append("groups:")
    out += ["  " + s for s in table(
        ["group", "codec", "dtype", "elements", "bytes", "bits/elem", "params"],
        [[str(g.index), g.codec, g.dtype, nbytes(g.elements), nbytes(g.bytes),
          fmt_float(8 * g.bytes / g.elements if g.elements else math.nan),
          " ".join(f"{k}={v}" for k, v in g.params.items())] for g in info.groups],
        [True, False, False, True, True, True, False])]
    out.append("sections:")
    out += ["  " + s for s in table(
        ["group", "tag", "encoding", "stored B", "raw B"],
        [["-" if s.group is None else str(s.group), s.tag, s.encoding, nbytes(s.stored_bytes),
          nbytes(s.raw_bytes)] for s in info.sections], [True, False, False, True, True])]
    return out


class Progress:
    """Phase messages on stderr ("mucsc: encoding model.pt (1.2 GB)... 3.1 s") for long jobs.

    Shown only when enabled (a terminal, not -q, a large input); each phase overwrites the last line.
    The public API has no progress hook, so this reports phases, not percentages.
    """

    def __init__(self, enabled: bool, stream: IO[str] | None = None) -> None:
        self.enabled = enabled
        self.stream = stream or sys.stderr
        self.t0 = time.monotonic()

    def phase(self, text: str) -> None:
        if self.enabled:
            self.stream.write(f"\r\x1b[2Kmucsc: {text}... ({time.monotonic() - self.t0:.1f} s)")
            self.stream.flush()

    def done(self) -> None:
        if self.enabled:
            self.stream.write("\r\x1b[2K")
            self.stream.flush()
