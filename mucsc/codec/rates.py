"""Byte counts: the paper's compression-rate formulas and every codec's exact message size.

The paper (section IV-D/IV-E) counts payload only, h bytes per float:
- MUCSC, one direction: ceil(log2 Z) d / 8 + h Z                       (eq. CompressionRateofMUCSC)
- B-MUCSC, one direction: (ceil(log2 Z) + ceil(log2 d)) d0 / 8 + h Z + h (eq. CompressRateB)
- rate = 2 h d / (K/N * uplink + downlink): a client uploads with probability K/N and always downloads.
A mucsc message adds fixed framing (spec/FORMAT.md section 4.2): preamble, HEAD, 32-byte section
headers, 8-byte padding and the CRC; :func:`message_bytes` adds it to the section sizes of
:func:`section_sizes` (spec/codecs.md states the same formulas).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from mucsc.codec import sparse

H = 4  # bytes of a float in the paper's formulas (float32)
PREAMBLE, SECTION_HEADER, TRAILER = 24, 32, 4  # spec/FORMAT.md sections 2.1-2.3


def clog2(x: int) -> int:
    """ceil(log2 x) for x >= 1 (0 for x = 1)."""
    return max(0, int(x - 1).bit_length())


def _mean(values: Iterable[float]) -> float:
    v = list(values)
    return sum(v) / len(v)


def _as_list(z: int | Iterable[int]) -> list[int]:
    return [z] if isinstance(z, int) else list(z)


# ---- the paper's formulas ------------------------------------------------------------------------

def paper_mucsc_bytes(d: int, z: int, h: int = H) -> float:
    """Bytes of one MUCSC transfer as the paper counts them: ceil(log2 Z)/8 d + h Z."""
    return clog2(z) / 8 * d + h * z


def paper_bmucsc_bytes(d: int, d0: int, z: int, h: int = H) -> float:
    """Bytes of one B-MUCSC transfer: (ceil(log2 Z) + ceil(log2 d))/8 d0 + h Z + h (eq. CompressRateB)."""
    return (clog2(z) + clog2(d)) / 8 * d0 + h * z + h


def rate(d: int, uplink: float, downlink: float, kn: float, h: int = H) -> float:
    """Compression rate 2 h d / (K/N uplink + downlink) of one client in one round (paper IV-D)."""
    return 2 * h * d / (kn * uplink + downlink)


def paper_mucsc_rate(d: int, z_u: int | Iterable[int], z_d: int, kn: float, h: int = H) -> float:
    """eq. CompressionRateofMUCSC; ``z_u`` may list the Z_U of equally large client sets (averaged)."""
    up = _mean(paper_mucsc_bytes(d, z, h) for z in _as_list(z_u))
    return rate(d, up, paper_mucsc_bytes(d, z_d, h), kn, h)


def paper_bmucsc_rate(d: int, d0: int, z_u: int | Iterable[int], z_d: int, kn: float, h: int = H) -> float:
    """eq. CompressRateB: Lambda_B = 2 h d / (omega_U + omega_D)."""
    up = _mean(paper_bmucsc_bytes(d, d0, z, h) for z in _as_list(z_u))
    return rate(d, up, paper_bmucsc_bytes(d, d0, z_d, h), kn, h)


# ---- exact message sizes -------------------------------------------------------------------------

def pad8(x: int) -> int:
    """Zero padding after a payload of x bytes (FORMAT.md: sections start at multiples of 8)."""
    return (8 - x % 8) % 8


def message_bytes(head_bytes: int, section_payloads: Iterable[int]) -> int:
    """Total size of a message with a HEAD of ``head_bytes`` and these stored section payloads."""
    total = PREAMBLE + SECTION_HEADER + head_bytes + pad8(head_bytes) + TRAILER
    return total + sum(SECTION_HEADER + s + pad8(s) for s in section_payloads)


def position_bytes(method: str, d: int, k: int) -> int:
    """Bytes of k positions in [0, d) for the data-independent methods (fixed, int32, ef, bitmap)."""
    return sparse.nbytes(method, d, k)


def section_sizes(codec: str, n: int, params: Mapping | None = None,
                  positions_bytes: int | None = None, centroids: int | None = None) -> dict[str, int]:
    """Raw (uncompressed) payload bytes of each section of one group of ``n`` elements.

    ``params`` are the codec's parameters (defaults filled in).  Codecs whose size depends on the data
    take it as arguments: ``positions_bytes`` for Rice-coded positions (otherwise the method's exact
    formula), ``centroids`` for the number of centroids actually sent (default min(z, kept elements),
    which is exact for continuous data).  QSGD's Elias coding is data-dependent: not covered here.
    """
    from mucsc.codec.base import get_codec  # late: the registry imports every codec

    p = dict(get_codec(codec, **dict(params or {})).get_config())
    p.pop("codec")
    if codec == "none":
        return {"VALS": 4 * n}
    if codec == "fp16":
        return {"VALS": 2 * n}
    if codec == "signsgd":
        return {"SIGN": (n + 7) // 8, **({"SCAL": 4} if p["scale"] == "l1" else {})}
    if codec == "qsgd":
        if p["coding"] != "fixed":
            raise ValueError("qsgd with coding='elias' has a data-dependent size")
        from mucsc.codec.codecs.qsgd import level_width
        return {"NORM": 4 * (-(-n // p["bucket"])), "VALS": (n * level_width(p["s"]) + 7) // 8}
    if codec == "terngrad":
        return {"SCAL": 4, "VALS": (2 * n + 7) // 8 if p["packing"] == "2bit" else -(-n // 5)}
    if codec == "mucsc":
        if any(p.get(t) is not None for t in ("bits", "max_error", "size")):
            raise ValueError("mucsc with bits=, size= or max_error= chooses Z from the data: pass z")
        z = 16 if p["z"] is None else p["z"]  # MucscParams.fixed_z
        kc = min(z, n) if centroids is None else centroids
        item = {"float16": 2, "float32": 4, "float64": 8}[p.get("centroid_dtype", "float32")]
        return {"CENT": item * kc, "IDS_": (n * clog2(max(kc, 1)) + 7) // 8}
    k = sparse.keep_count(p["keep"], n)
    if positions_bytes is None:
        method = p["positions"]
        if method == "paper":
            method = {"dgc": "int32", "bmucsc": "fixed", "topk": "fixed"}[codec]
        if method in ("auto", "golomb", "rice"):
            raise ValueError(f"positions={method!r} has a data-dependent size: pass positions_bytes")
        positions_bytes = position_bytes(method, n, k)
    if codec in ("topk", "dgc"):
        return {"VALS": 4 * k, "INDX": positions_bytes}
    if codec == "stc":
        return {"SCAL": 4, "SIGN": (k + 7) // 8, "INDX": positions_bytes}
    if codec == "bmucsc":
        kc = min(p["z"], k) if centroids is None else centroids
        item = {"float16": 2, "float32": 4, "float64": 8}[p["centroid_dtype"]]
        return {"CENT": item * kc, "IDS_": (k * clog2(max(kc, 1)) + 7) // 8, "INDX": positions_bytes, "SCAL": 4}
    raise ValueError(f"no size formula for codec {codec!r}")


def expected_message_bytes(codec: str, n: int, head_bytes: int, **kwargs) -> int:
    """:func:`message_bytes` of :func:`section_sizes`: the exact size with ``compress="off"``."""
    return message_bytes(head_bytes, section_sizes(codec, n, **kwargs).values())


def allcnn_parameter_count(num_classes: int = 10, in_channels: int = 3) -> int:
    """Parameters of ALL-CNN-C (Springenberg et al. 2015, table 2 for CIFAR-10): 3x3 convs 96, 96,
    96 (stride 2), 192, 192, 192 (stride 2), 3x3 conv 192, 1x1 conv 192, 1x1 conv classes, with biases,
    no batch norm: 1,369,738 for CIFAR-10."""
    layers = [(in_channels, 96, 3), (96, 96, 3), (96, 96, 3), (96, 192, 3), (192, 192, 3), (192, 192, 3),
              (192, 192, 3), (192, 192, 1), (192, num_classes, 1)]
    return sum(cin * cout * k * k + cout for cin, cout, k in layers)


def summarize_paper_table(d: int) -> dict[str, float]:
    """The paper's section VI-B numbers recomputed (K/N = 0.1, Z_U in {4, 8, 16}, Z_D = 16; B-MUCSC
    d0 = 0.01 d, Z = 256), for the report."""
    d0 = math.ceil(0.01 * d)
    return {"mucsc": paper_mucsc_rate(d, (4, 8, 16), 16, 0.1),
            "mucsc_zu16": paper_mucsc_rate(d, 16, 16, 0.1),
            "bmucsc": paper_bmucsc_rate(d, d0, 256, 256, 0.1)}


# ---- the paper check: formulas next to measured message bytes -------------------------------------

@dataclasses.dataclass(frozen=True)
class RateRow:
    """One line of ``mucsc rate``: bytes per uplink (mean over the client classes' Z_U) and downlink
    transfer, and the resulting per-client, per-round compression rate 2 h d / (K/N up + down)."""

    label: str
    kind: str  # "formula" or "measured"
    uplink: float
    downlink: float
    rate: float


def paper_check(d: int, z_u: Sequence[int] = (4, 8, 16), z_d: int = 16, kn: float = 0.1,
                keep: float = 0.01, z_b: int = 256, seed: int = 0) -> list[RateRow]:
    """The paper's two formulas and the real codecs' message sizes on a Gaussian vector of size d.

    Fixed-width modes (compress="off"; B-MUCSC positions="paper") reproduce the formulas up to the
    framing; the compact defaults (zstd'd IDs, Rice/EF positions) are smaller.
    """
    from mucsc.codec.api import encode  # late: api imports the codec registry

    x = np.random.default_rng(seed).standard_normal(d).astype(np.float32)
    d0 = sparse.keep_count(keep, d)

    def size(codec: str, **kw) -> int:
        return len(encode(x, codec, seed=seed, **kw))

    def row(label: str, kind: str, up: float, down: float) -> RateRow:
        return RateRow(label, kind, up, down, rate(d, up, down, kn))

    zs = list(z_u)
    rows = [row("MUCSC eq. CompressionRateofMUCSC", "formula",
                _mean(paper_mucsc_bytes(d, z) for z in zs), paper_mucsc_bytes(d, z_d))]
    for comp, label in (("off", "MUCSC fixed-width IDs (compress=off)"), ("auto", "MUCSC zstd'd IDs (compress=auto)")):
        rows.append(row(label, "measured", _mean(size("mucsc", z=z, compress=comp) for z in zs),
                        size("mucsc", z=z_d, compress=comp)))
    rows.append(row("B-MUCSC eq. CompressRateB", "formula", paper_bmucsc_bytes(d, d0, z_b),
                    paper_bmucsc_bytes(d, d0, z_b)))
    for comp, pos, label in (("off", "paper", "B-MUCSC positions=paper, compress=off"),
                             ("auto", "auto", "B-MUCSC positions=auto, compress=auto")):
        b = size("bmucsc", keep=keep, z=z_b, positions=pos, compress=comp)
        rows.append(row(label, "measured", b, b))
    return rows
