"""Test-vector cases for format 1.2's lane-parallel rANS IDs (IDSL, FORMAT.md 4.6).  Imported by
make_vectors.py: ``CASES`` (valid vectors) and ``invalid_cases()`` (name -> (message, error class name,
description)); each invalid message is a valid one with its IDSL section changed and a correct CRC."""

from __future__ import annotations

import numpy as np

import mucsc
from mucsc.codec.wire import container as fmt
from mucsc.codec.wire import lanes


def gauss(n, seed=1, dtype="float32"):
    return np.random.default_rng(seed).normal(size=n).astype(dtype)


def _sparse(n, seed):
    g = np.random.default_rng(seed)
    x = g.normal(size=n)
    x[g.uniform(size=n) < 0.7] = 0
    return x.astype("float16")


CASES = {
    "mucsc_lanes_z16": ("format 1.2: Z = 16, IDSL with two IDs per byte symbol, one block of 3 lanes (5001 "
                        "IDs: the last symbol's high nibble is padding)", gauss(5001, 60),
                        dict(codec="mucsc", z=16, id_coding="lanes")),
    "mucsc_lanes_z3": ("format 1.2: Z = 3, four 2-bit IDs per byte symbol, one lane", gauss(1500, 61),
                       dict(codec="mucsc", z=3, id_coding="lanes", compress="off")),
    "mucsc_lanes_z300_wide": ("format 1.2: Z = 300, one symbol per ID (w = 16), 2 lanes", gauss(4100, 62),
                              dict(codec="mucsc", z=300, id_coding="lanes", solver="uniform")),
    "mucsc_lanes_default": ("format 1.2: the default Z = 16 message of a sparse update (8000 float16 values, "
                            "70% zeros at random places): the writer's 'auto' keeps IDSL, smaller than zstd on "
                            "the packed IDs; 2 lanes", _sparse(8000, 63), dict(codec="mucsc")),
    "bmucsc_lanes": ("format 1.2: B-MUCSC keep 0.5, Z = 16: the kept values' IDs in IDSL", gauss(900, 64),
                     dict(codec="bmucsc", keep=0.5, z=16, id_coding="lanes")),
}


def _rebuild(blob, section):
    msg = fmt.read_message(blob)
    secs = [(s.group, s.tag, section if s.tag == "IDSL" else bytes(msg.payload(s)), False)
            for s in msg.sections if s.tag != "HEAD"]
    return fmt.write_message(msg.header, secs, zstd_level=None, minor=msg.minor)


def _payload(blob):
    msg = fmt.read_message(blob)
    return bytes(next(msg.payload(s) for s in msg.sections if s.tag == "IDSL"))


def invalid_cases():
    n, k = 601, 12  # 4-bit symbols; 12..15 are not IDs; n odd: the last symbol's high nibble is padding
    base = mucsc.encode(gauss(n, 65), "mucsc", z=k, id_coding="lanes", compress="off")
    good = _payload(base)
    ids = np.random.default_rng(66).integers(0, k, n)
    sym = lanes.symbols(ids, k)
    high, pad = sym.copy(), sym.copy()
    high[7] = 0xD0 | (high[7] & 0x0F)  # an ID 13
    pad[-1] |= 0x40
    state = bytearray(good)
    state[-1] ^= 0x5A
    L = lanes.layout(lanes.symbol_count(n, 4)).total_lanes
    table_len = _table_length(good, 256)
    high_state = bytearray(good)
    first = 2 + table_len + 2 * L
    high_state[first + 3] |= 0x80
    sums = bytearray(good)
    sums[2] ^= 0x01
    return {
        "lanes_final_state": (_rebuild(base, bytes(state)), "FormatError",
                              "IDSL: a stream byte changed, the lane does not end in state 2^23"),
        "lanes_table_sum": (_rebuild(base, bytes(sums)), "FormatError", "IDSL: the frequencies do not sum to 2^S"),
        "lanes_lane_lengths": (_rebuild(base, good + b"\0"), "FormatError",
                               "IDSL: one byte more than the lane lengths account for"),
        "lanes_symbol_width": (_rebuild(base, bytes([good[0], 2]) + good[2:]), "FormatError",
                               "IDSL: 2-bit symbols cannot carry the IDs of 12 centroids"),
        "lanes_state_above_2_31": (_rebuild(base, bytes(high_state)), "FormatError",
                                   "IDSL: a lane's initial state is 2^31 or more"),
        "lanes_id_out_of_range": (_rebuild(base, lanes.encode_symbols(high, 4, 256)), "FormatError",
                                  "IDSL: a valid coding of symbols holding the ID 13 for 12 centroids"),
        "lanes_padding_bits": (_rebuild(base, lanes.encode_symbols(pad, 4, 256)), "FormatError",
                               "IDSL: a valid coding of symbols whose last padding nibble is not zero"),
    }


def _table_length(payload: bytes, count: int) -> int:
    """Bytes of the varint table that starts at payload[2]."""
    pos = 2
    for _ in range(count):
        while payload[pos] & 0x80:
            pos += 1
        pos += 1
    return pos - 2
