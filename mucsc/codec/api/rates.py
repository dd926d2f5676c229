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
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from mucsc.codec.wire import container as fmt
from mucsc.codec.api.messages import as_codec, encode
from mucsc.codec.codecs.base import H, Codec, available_codecs, codec_class, get_codec
from mucsc.codec.wire.sparse import keep_count
from mucsc.errors import SizeError

__all__ = ["H", "baselines", "RateRow", "allcnn_parameter_count", "baseline_rows", "keep_count", "message_bytes", "paper_bmucsc_bytes",
           "paper_bmucsc_rate", "paper_check", "paper_mucsc_bytes", "paper_mucsc_rate", "paper_rate", "rate",
           "section_sizes"]


def _mean(values: Iterable[float]) -> float:
    v = list(values)
    return sum(v) / len(v)


def _as_list(z: int | Iterable[int]) -> list[int]:
    return [z] if isinstance(z, int) else list(z)


# ---- the paper's formulas (each codec states its own: Codec.paper_bytes) ---------------------------

def paper_mucsc_bytes(d: int, z: int, h: int = H) -> float:
    """Bytes of one MUCSC transfer as the paper counts them: ceil(log2 Z)/8 d + h Z."""
    return get_codec("mucsc", z=z).paper_bytes(d, h)


def paper_bmucsc_bytes(d: int, d0: float, z: int, h: int = H) -> float:
    """Bytes of one B-MUCSC transfer: (ceil(log2 Z) + ceil(log2 d))/8 d0 + h Z + h (eq. CompressRateB),
    for any d0 (the codec's own ``paper_bytes`` uses the d0 it keeps, ceil(keep d))."""
    from mucsc.codec.codecs.bmucsc import paper_bmucsc_bytes as formula

    return formula(d, d0, z, h)


def rate(d: int, uplink: float, downlink: float, kn: float, h: int = H) -> float:
    """Compression rate 2 h d / (K/N uplink + downlink) of one client in one round (paper IV-D)."""
    return 2 * h * d / (kn * uplink + downlink)


def paper_rate(d: int, uplinks: Sequence[Codec], downlink: Codec, kn: float, h: int = H) -> float | None:
    """The paper's rate for these codecs: uplink bytes averaged over the clients' codecs (one entry
    per client, or per equally large client set), or None when a codec has no paper formula."""
    up = [c.paper_bytes(d, h) for c in uplinks]
    down = downlink.paper_bytes(d, h)
    if not up or down is None or any(u is None for u in up):
        return None
    return rate(d, _mean(up), down, kn, h)


def paper_mucsc_rate(d: int, z_u: int | Iterable[int], z_d: int, kn: float, h: int = H) -> float:
    """eq. CompressionRateofMUCSC; ``z_u`` may list the Z_U of equally large client sets (averaged)."""
    return paper_rate(d, [get_codec("mucsc", z=z) for z in _as_list(z_u)], get_codec("mucsc", z=z_d), kn, h)


def paper_bmucsc_rate(d: int, d0: float, z_u: int | Iterable[int], z_d: int, kn: float, h: int = H) -> float:
    """eq. CompressRateB: Lambda_B = 2 h d / (omega_U + omega_D)."""
    up = _mean(paper_bmucsc_bytes(d, d0, z, h) for z in _as_list(z_u))
    return rate(d, up, paper_bmucsc_bytes(d, d0, z_d, h), kn, h)


# ---- exact message sizes -------------------------------------------------------------------------

def message_bytes(head_bytes: int, section_payloads: Iterable[int]) -> int:
    """Total size of a message with a HEAD of ``head_bytes`` and these stored section payloads
    (the container's framing, spec/FORMAT.md section 4.2)."""
    return fmt.message_size([head_bytes, *section_payloads])


def section_sizes(codec: str | Codec, n: int, params: Mapping | None = None, *,
                  positions_bytes: int | None = None, centroids: int | None = None,
                  estimate: bool = False) -> dict[str, int]:
    """Raw payload bytes of each section of one group of ``n`` elements: ``Codec.section_sizes`` of
    the codec named (with ``params``) or given."""
    return as_codec(codec, **dict(params or {})).section_sizes(
        n, positions_bytes=positions_bytes, centroids=centroids, estimate=estimate)


def allcnn_parameter_count(num_classes: int = 10, in_channels: int = 3) -> int:
    """Parameters of ALL-CNN-C (Springenberg et al. 2015, table 2 for CIFAR-10): 3x3 convs 96, 96,
    96 (stride 2), 192, 192, 192 (stride 2), 3x3 conv 192, 1x1 conv 192, 1x1 conv classes, with biases,
    no batch norm: 1,369,738 for CIFAR-10."""
    layers = [(in_channels, 96, 3), (96, 96, 3), (96, 96, 3), (96, 192, 3), (192, 192, 3), (192, 192, 3),
              (192, 192, 3), (192, 192, 1), (192, num_classes, 1)]
    return sum(cin * cout * k * k + cout for cin, cout, k in layers)


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
    x = np.random.default_rng(seed).standard_normal(d).astype(np.float32)

    def size(codec: str, **kw) -> int:
        return len(encode(x, codec, seed=seed, **kw))

    def row(label: str, kind: str, up: float, down: float) -> RateRow:
        return RateRow(label, kind, up, down, rate(d, up, down, kn))

    zs = list(z_u)
    rows = [row("MUCSC, the paper's formula", "formula",
                _mean(paper_mucsc_bytes(d, z) for z in zs), paper_mucsc_bytes(d, z_d))]
    for comp, label in (("off", "MUCSC fixed-width IDs (compress=off)"), ("auto", "MUCSC zstd'd IDs (compress=auto)")):
        rows.append(row(label, "measured", _mean(size("mucsc", z=z, compress=comp) for z in zs),
                        size("mucsc", z=z_d, compress=comp)))
    b_formula = get_codec("bmucsc", keep=keep, z=z_b).paper_bytes(d)  # d0 = ceil(keep d)
    rows.append(row("B-MUCSC, the paper's formula", "formula", b_formula, b_formula))
    for comp, pos, label in (("off", "paper", "B-MUCSC positions=paper, compress=off"),
                             ("auto", "auto", "B-MUCSC positions=auto, compress=auto")):
        b = size("bmucsc", keep=keep, z=z_b, positions=pos, compress=comp)
        rows.append(row(label, "measured", b, b))
    return rows


# ---- baselines: one transfer's formula payload next to the measured message --------------------------

def baselines() -> list[tuple[str, Mapping]]:
    """Every registered codec (plugins included) with each of its ``rate_variants``."""
    return [(name, dict(v)) for name in available_codecs() for v in codec_class(name).rate_variants]


def baseline_rows(d: int, seed: int = 0, codecs: Sequence[tuple[str, Mapping]] | None = None) -> list[dict]:
    """Per codec (default: :func:`baselines`): the payload its section sizes state (an estimate where
    they depend on the data, None where the codec states none) and the measured message bytes of one
    transfer of a Gaussian vector of size d."""
    x = np.random.default_rng(seed).standard_normal(d).astype(np.float32)
    out = []
    for name, params in (baselines() if codecs is None else codecs):
        codec = get_codec(name, **params)
        try:
            formula, note = sum(codec.section_sizes(d).values()), "exact payload"
        except SizeError:
            try:
                formula, note = sum(codec.section_sizes(d, estimate=True).values()), "expected payload"
            except SizeError:
                formula, note = None, "the codec states no size"
        compact = len(encode(x, codec, seed=seed))
        out.append({"codec": name + "".join(f" {k}={v}" for k, v in params.items()),
                    "formula_payload": formula, "formula_note": note,
                    "measured_off": len(encode(x, codec, seed=seed, compress="off")),
                    "measured_auto": compact, "ratio_vs_float32": 4 * d / compact})
    return out
