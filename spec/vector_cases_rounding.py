"""Test-vector cases for mucsc's ``rounding`` parameter (FORMAT.md 4.2, 4.3.1): nearest rounding.
Imported by make_vectors.py like ``vector_cases_codecs``: ``CASES`` (valid vectors) and
``invalid_cases()`` (name -> (message, error class name, description))."""

from __future__ import annotations

import numpy as np

import mucsc
from vector_cases_codecs import _rebuild, gauss


def _heavy(n, seed):
    return np.random.default_rng(seed).standard_t(3, n).astype(np.float32)


CASES = {
    "mucsc_nearest_z8": ("rounding=nearest, Z = 8: Lloyd-Max levels, each element to its nearest level "
                         "(ties down), packed IDs: a 1.0 message with an informative rounding key",
                         gauss(500, 50), dict(codec="mucsc", z=8, rounding="nearest")),
    "mucsc_nearest_bits": ("format 1.1: rounding=nearest, bits=3 goal on Student-t(3) data (rANS IDs)",
                           _heavy(3000, 51), dict(codec="mucsc", bits=3.0, rounding="nearest")),
}


def invalid_cases():
    near = mucsc.encode(gauss(64, 52), "mucsc", z=4, rounding="nearest", compress="off")
    return {
        "mucsc_rounding_unknown": (_rebuild(near, params={"rounding": "floor"}), "FormatError",
                                   "rounding is not a defined value"),
    }
