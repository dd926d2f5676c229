"""Test-vector cases for the codecs of spec/codecs.md (bmucsc, qsgd, signsgd, stc, dgc, terngrad, topk,
fp16, none).  Imported by make_vectors.py: ``CASES`` (valid vectors, same shape as its own table) and
``invalid_cases()`` (name -> (message, error class name, description)), each invalid message built
from a valid one with one field changed and a correct CRC, so only the codec's decoder can object.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np

import mucsc
from mucsc.codec.wire import container as fmt


def gauss(n, seed=1, dtype="float32", scale=1.0):
    return (np.random.default_rng(seed).normal(size=n) * scale).astype(dtype)


def _heavy(n, seed):
    """Student-t(3) data: a few large values, as model updates have."""
    return np.random.default_rng(seed).standard_t(3, n).astype(np.float32)


CASES = {
    "bmucsc_default": ("B-MUCSC defaults: 1% kept (k = 3), exact centroids, Rice positions", _heavy(300, 20),
                       dict(codec="bmucsc")),
    "bmucsc_z4_rice": ("B-MUCSC keep 0.2, Z = 4: stochastic rounding of 40 kept values, Rice positions",
                       _heavy(200, 21), dict(codec="bmucsc", keep=0.2, z=4)),
    "bmucsc_paper": ("B-MUCSC positions=paper: fixed ceil(log2 d) = 8-bit positions, fixed-width IDs",
                     _heavy(250, 22), dict(codec="bmucsc", keep=0.1, z=8, positions="paper", compress="off")),
    "bmucsc_ef": ("B-MUCSC with Elias-Fano positions", _heavy(500, 23), dict(codec="bmucsc", keep=0.05, z=4,
                                                                              positions="ef")),
    "bmucsc_bitmap": ("B-MUCSC keep 0.7: bitmap positions", _heavy(64, 24), dict(codec="bmucsc", keep=0.7, z=4)),
    "bmucsc_bits_rans": ("format 1.1: B-MUCSC bits=3 goal: keep chosen (0.2, k = 600), entropy-constrained "
                         "levels (solver ecsq), kept IDs rANS-coded (IDSA)", _heavy(3000, 30),
                         dict(codec="bmucsc", bits=3.0)),
    "qsgd_fixed": ("QSGD s = 3, bucket 16: 3-bit (level << 1 | sign) fields, 5 bucket norms", gauss(70, 25),
                   dict(codec="qsgd", s=3, bucket=16, compress="off")),
    "qsgd_elias": ("QSGD s = 1, Elias-gamma gaps and levels", gauss(90, 26), dict(codec="qsgd", s=1, bucket=32,
                                                                                 coding="elias")),
    "qsgd_s255_float64": ("QSGD s = 255 (9-bit fields) on float64 input", gauss(40, 27, "float64"),
                          dict(codec="qsgd", s=255)),
    "signsgd_l1": ("signSGD scaled by ||U||_1 / d, one zero element", np.append(gauss(20, 28), 0).astype(np.float32),
                   dict(codec="signsgd")),
    "signsgd_none": ("signSGD pure signs", gauss(13, 29), dict(codec="signsgd", scale="none")),
    "stc_default": ("STC 3%: mu, signs, Rice positions with b* = 4", gauss(400, 30), dict(codec="stc")),
    "stc_fixed": ("STC 10% with fixed-width positions", gauss(100, 31), dict(codec="stc", keep=0.1,
                                                                              positions="fixed")),
    "dgc_paper": ("DGC 5%: float32 values + int32 positions (the DGC paper's wire)", gauss(200, 32),
                  dict(codec="dgc", keep=0.05, positions="paper")),
    "topk_auto": ("top-k 2% with the smallest position code", gauss(500, 33), dict(codec="topk", keep=0.02)),
    "terngrad_2bit": ("TernGrad 2-bit trits with 2.5-sigma clipping of one outlier",
                      np.append(gauss(30, 34), 25.0).astype(np.float32), dict(codec="terngrad", compress="off")),
    "terngrad_base3": ("TernGrad 5 trits per byte, no clipping", gauss(23, 35), dict(codec="terngrad",
                                                                                     packing="base3", clip=0)),
    "fp16_saturate": ("fp16, one value saturating at 65504", np.append(gauss(9, 36), 1e6).astype(np.float32),
                      dict(codec="fp16")),
    "none_float64": ("none (NC): float64 input sent as float32", gauss(11, 37, "float64"), dict(codec="none")),
    "stc_state_dict": ("STC on a state_dict, one group per tensor", {"w": gauss(60, 38).reshape(6, 10),
                                                                     "b": gauss(6, 39)},
                       dict(codec="stc", keep=0.1, shared=False)),
}


def _rebuild(blob, params=None, sections=None, drop=()):
    """The message with group 0's params updated and/or sections replaced (tag -> bytes), CRC valid."""
    msg = fmt.read_message(blob)
    h = msg.header
    g0 = h.groups[0]
    groups = (dataclasses.replace(g0, params={**g0.params, **(params or {})}),) + h.groups[1:]
    header = dataclasses.replace(h, groups=groups)
    secs = []
    for s in msg.sections:
        if s.tag == "HEAD" or (s.group == 0 and s.tag in drop):
            continue
        data = bytes(msg.payload(s))
        if s.group == 0 and sections and s.tag in sections:
            data = sections[s.tag]
        secs.append((s.group, s.tag, data, False))
    return fmt.write_message(header, secs, zstd_level=None, minor=msg.minor)


def _payload(blob, tag):
    msg = fmt.read_message(blob)
    return bytes(next(msg.payload(s) for s in msg.sections if s.tag == tag))


def invalid_cases():
    x = gauss(64, 40)
    top = mucsc.encode(x, "dgc", keep=0.1, positions="paper", compress="off")
    idx = np.frombuffer(_payload(top, "INDX"), "<i4").copy()
    swapped, beyond = idx.copy(), idx.copy()
    swapped[[0, 1]] = swapped[[1, 0]]
    beyond[-1] = 64
    bm = mucsc.encode(x, "bmucsc", keep=0.1, z=4, compress="off")
    q = mucsc.encode(x, "qsgd", s=3, bucket=16, compress="off")
    qv = bytearray(_payload(q, "VALS"))
    qv[0] = (qv[0] & 0b11111000) | 0b110  # first 3-bit field: level 3, sign 0 (valid for s = 3)
    qe = mucsc.encode(x, "qsgd", s=1, coding="elias", compress="off")
    tg = mucsc.encode(x, "terngrad", compress="off")
    t3 = mucsc.encode(x, "terngrad", packing="base3", compress="off")
    sg = mucsc.encode(gauss(13, 41), "signsgd", compress="off")
    sgp = bytearray(_payload(sg, "SIGN"))
    sgp[-1] |= 0x80  # 13 bits: bits 13..15 of the stream are padding
    stc = mucsc.encode(x, "stc", keep=0.1, compress="off")
    f16 = mucsc.encode(gauss(8, 42), "fp16", compress="off")
    nc = mucsc.encode(gauss(8, 43), "none", compress="off")
    ra = mucsc.encode(gauss(300, 44), "mucsc", z=4, id_coding="rans", compress="off")
    rp = bytearray(_payload(ra, "IDSA"))
    bad_state, bad_sum = bytearray(rp), bytearray(rp)
    bad_state[-1] ^= 0x5A  # the last renormalisation byte of the only lane
    bad_sum[2] ^= 0x01  # f_0 (a one- or two-byte varint) changes: the table no longer sums to 2^S
    cases = {
        "rans_final_state": (_rebuild(ra, sections={"IDSA": bytes(bad_state)}), "FormatError",
                             "IDSA: a stream byte changed, the lane does not end in state 2^23"),
        "rans_table_sum": (_rebuild(ra, sections={"IDSA": bytes(bad_sum)}), "FormatError",
                           "IDSA: the frequencies do not sum to 2^S"),
        "rans_lane_lengths": (_rebuild(ra, sections={"IDSA": bytes(rp) + b"\0"}), "FormatError",
                              "IDSA: one byte more than the lane lengths account for"),
        "dgc_positions_not_increasing": (_rebuild(top, sections={"INDX": swapped.astype("<i4").tobytes()}),
                                         "FormatError", "int32 positions out of order"),
        "dgc_position_out_of_range": (_rebuild(top, sections={"INDX": beyond.astype("<i4").tobytes()}),
                                      "FormatError", "a position equal to d"),
        "topk_values_short": (_rebuild(top, sections={"VALS": _payload(top, "VALS")[:-4]}),
                              "FormatError", "VALS holds k - 1 values"),
        "bmucsc_k_exceeds_n": (_rebuild(bm, params={"k": 65}), "FormatError", "k = d + 1"),
        "bmucsc_unknown_position_code": (_rebuild(bm, params={"pos": "huffman"}), "FormatError",
                                         "pos is not a defined method"),
        "bmucsc_rice_parameter_too_large": (_rebuild(bm, params={"pos_arg": 99}), "FormatError",
                                            "Rice parameter above bitlen(d)"),
        "bmucsc_mean_missing": (_rebuild(bm, drop=("SCAL",)), "FormatError", "no SCAL section"),
        "bmucsc_mean_nan": (_rebuild(bm, sections={"SCAL": np.array([np.nan], "<f4").tobytes()}),
                            "FormatError", "SCAL is NaN"),
        "qsgd_level_above_s": (_rebuild(q, params={"s": 2}, sections={"VALS": bytes(qv)}), "FormatError",
                               "a field holds level 3 but the header says s = 2 (same 3-bit width)"),
        "qsgd_elias_truncated": (_rebuild(qe, sections={"INDX": _payload(qe, "INDX")[:-1]}), "FormatError",
                                 "Elias-gamma gaps cut short"),
        "qsgd_norms_short": (_rebuild(q, params={"bucket": 8}), "FormatError", "8 buckets declared, 4 norms sent"),
        "terngrad_code_3": (_rebuild(tg, sections={"VALS": b"\xff" * len(_payload(tg, "VALS"))}),
                            "FormatError", "2-bit trit code 3"),
        "terngrad_base3_byte_243": (_rebuild(t3, sections={"VALS": bytes([243]) + _payload(t3, "VALS")[1:]}),
                                    "FormatError", "a base-3 byte above 242"),
        "signsgd_padding_bit": (_rebuild(sg, sections={"SIGN": bytes(sgp)}), "FormatError",
                                "a padding bit of SIGN is set"),
        "signsgd_unknown_scale": (_rebuild(sg, params={"scale": "l2"}), "FormatError", "scale is not l1/none"),
        "stc_sign_bits_short": (_rebuild(stc, sections={"SIGN": b""}), "FormatError", "no sign bits for k > 0"),
        "fp16_infinity": (_rebuild(f16, sections={"VALS": np.full(8, np.inf, "<f2").tobytes()}),
                          "FormatError", "an infinite float16"),
        "none_nan": (_rebuild(nc, sections={"VALS": np.full(8, np.nan, "<f4").tobytes()}),
                     "FormatError", "a NaN float32"),
    }
    return cases


if __name__ == "__main__":  # a quick self-check: every invalid case is rejected with its error
    for name, (blob, err, desc) in invalid_cases().items():
        try:
            mucsc.decode(blob)
        except mucsc.MucscError as exc:
            ok = err in [c.__name__ for c in type(exc).__mro__]
            print(("ok  " if ok else "BAD ") + name, type(exc).__name__, exc)
        else:
            print("BAD " + name + " decoded")
    print(json.dumps(sorted(CASES)))
