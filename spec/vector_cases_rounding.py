"""Test-vector cases for mucsc's ``rounding`` parameter: nearest (FORMAT.md 4.2, 4.3.1) and dithered
(4.5, format 1.2).
Imported by make_vectors.py like ``vector_cases_codecs``: ``CASES`` (valid vectors) and
``invalid_cases()`` (name -> (message, error class name, description))."""

from __future__ import annotations

import struct

import numpy as np

import mucsc
from vector_cases_codecs import _payload, _rebuild, gauss


def _heavy(n, seed):
    return np.random.default_rng(seed).standard_t(3, n).astype(np.float32)


def _near_zero(n, seed):
    r = np.random.default_rng(seed)
    return np.where(r.random(n) < 0.8, r.normal(size=n) * 0.01, r.normal(size=n)).astype(np.float32)


CASES = {
    "mucsc_nearest_z8": ("rounding=nearest, Z = 8: Lloyd-Max levels, each element to its nearest level "
                         "(ties down), packed IDs: a 1.0 message with an informative rounding key",
                         gauss(500, 50), dict(codec="mucsc", z=8, rounding="nearest")),
    "mucsc_nearest_bits": ("format 1.1: rounding=nearest, bits=3 goal on Student-t(3) data (rANS IDs)",
                           _heavy(3000, 51), dict(codec="mucsc", bits=3.0, rounding="nearest")),
    "mucsc_dithered_z16": ("format 1.2: rounding=dithered, z = 16: step = range / 15, offset 0, indices "
                           "rANS-coded (QIDX, one context), no escape", gauss(300, 53),
                           dict(codec="mucsc", z=16, rounding="dithered")),
    "mucsc_dithered_bits1": ("format 1.2: rounding=dithered, bits=1 on 40000 elements: four dither contexts, "
                             "one IDSA payload each", gauss(40000, 54),
                             dict(codec="mucsc", bits=1.0, rounding="dithered")),
    "mucsc_dithered_near_zero": ("format 1.2: rounding=dithered, bits=1 on an 80%-near-zero mixture: part of "
                                 "the dither subtracted (share < 1 in GRID)", _near_zero(4000, 58),
                                 dict(codec="mucsc", bits=1.0, rounding="dithered")),
    "mucsc_dithered_share0": ("format 1.2: rounding=dithered with grid=(0.25, 0, 0): share 0, stochastic "
                              "rounding to the grid", gauss(300, 59),
                              dict(codec="mucsc", grid=(0.25, 0.0, 0.0), rounding="dithered")),
    "mucsc_dithered_escape": ("format 1.2: rounding=dithered, bits=3 on Student-t(3) data with a few huge "
                              "values: the tails escaped (QESC)",
                              np.append(_heavy(3000, 55), [900.0, -2500.0, 40000.0]).astype(np.float32),
                              dict(codec="mucsc", bits=3.0, rounding="dithered")),
    "mucsc_dithered_float64": ("format 1.2: rounding=dithered on float64 input", gauss(200, 56, "float64"),
                               dict(codec="mucsc", z=64, rounding="dithered")),
    "mucsc_dithered_constant": ("format 1.2: rounding=dithered on a constant tensor: offset = the value, "
                                "every index 0", np.full(10, 0.75, np.float32),
                                dict(codec="mucsc", z=16, rounding="dithered")),
}


def _grid(blob, **changes):
    step, offset, share, q_lo, key = struct.unpack("<dddqQ", _payload(blob, "GRID"))
    vals = {"step": step, "offset": offset, "share": share, "q_lo": q_lo, "key": key, **changes}
    return struct.pack("<dddqQ", vals["step"], vals["offset"], vals["share"], vals["q_lo"], vals["key"])


def invalid_cases():
    near = mucsc.encode(gauss(64, 52), "mucsc", z=4, rounding="nearest", compress="off")
    dith = mucsc.encode(gauss(300, 57), "mucsc", z=16, rounding="dithered", compress="off")
    esc = mucsc.encode(np.append(_heavy(3000, 55), [900.0, -2500.0, 40000.0]).astype(np.float32), "mucsc",
                       bits=3.0, rounding="dithered", compress="off")
    qidx = _payload(dith, "QIDX")
    escapes = sum(b < 0x80 for b in _payload(esc, "QESC"))  # one varint ends at each such byte
    return {
        "mucsc_rounding_unknown": (_rebuild(near, params={"rounding": "floor"}), "FormatError",
                                   "rounding is not a defined value"),
        "dithered_step_zero": (_rebuild(dith, sections={"GRID": _grid(dith, step=0.0)}), "FormatError",
                               "GRID: step 0"),
        "dithered_offset_nan": (_rebuild(dith, sections={"GRID": _grid(dith, offset=float("nan"))}),
                                "FormatError", "GRID: offset NaN"),
        "dithered_grid_short": (_rebuild(dith, sections={"GRID": _payload(dith, "GRID")[:32]}), "FormatError",
                                "GRID: 32 of 40 bytes"),
        "dithered_share_above_one": (_rebuild(dith, sections={"GRID": _grid(dith, share=1.5)}), "FormatError",
                                     "GRID: share 1.5 (at most 1)"),
        "dithered_share_nan": (_rebuild(dith, sections={"GRID": _grid(dith, share=float("nan"))}),
                               "FormatError", "GRID: share NaN"),
        "dithered_contexts_zero": (_rebuild(dith, sections={"QIDX": b"\0" + qidx[1:]}), "FormatError",
                                   "QIDX: 0 contexts"),
        "dithered_qidx_trailing": (_rebuild(dith, sections={"QIDX": qidx + b"\0"}), "FormatError",
                                   "QIDX: a byte after the last context's payload"),
        "dithered_symbols_beyond": (_rebuild(dith, params={"symbols": 70000}), "FormatError",
                                    "symbols above 65536"),
        "dithered_escape_missing": (_rebuild(esc, drop=("QESC",)), "FormatError", "escape true but no QESC"),
        "dithered_escape_unexpected": (_rebuild(esc, params={"escape": False}), "FormatError",
                                       "QESC present although escape is false (an unread critical section)"),
        "dithered_escape_inside": (_rebuild(esc, sections={"QESC": bytes(escapes)}),
                                   "FormatError", "an escaped index inside the alphabet (q - q_lo = 0)"),
        "dithered_decodes_infinite": (_rebuild(dith, sections={"GRID": _grid(dith, step=1e308, offset=1e308)}),
                                      "FormatError", "the grid decodes beyond float32"),
    }
