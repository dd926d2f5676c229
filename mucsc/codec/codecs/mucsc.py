"""``mucsc``: Model Update Compression by Soft Clustering (paper section IV-A).

The vector is sent as Z sorted centroids (CENT) and one ceil(log2 Z)-bit cluster ID per element
(IDS_; 4 or 8 bits for 3- and 5..7-bit IDs when the section is zstd-compressed, see ``id_packing``).
Each element is rounded at random to one of its two neighbouring centroids with eq. 7's
probabilities, so decoding is unbiased; the centroids minimise the variance J of eq. 8-9.  The
clustering itself is :mod:`mucsc.codec.codecs.clusters` (shared with bmucsc); a goal (bits= / size= /
max_error=) is resolved to fixed levels by :mod:`mucsc.codec.ratecontrol` before encoding.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Literal

import numpy as np

from mucsc.codec.backends.dispatch import backend_of
from mucsc.codec.codecs import _dithered as dithered
from mucsc.codec.codecs.base import (H, Z_RANGE, Codec, EncodedGroup, PaperSetup, ceil_log2, param, plan_alone,
                                     register)
from mucsc.codec.codecs.clusters import (BITS_HELP, CENTROID_DTYPES, CENTROID_LIMITS, ID_CODING_HELP, ID_CODINGS,
                                         ID_PACKING_HELP, ID_PACKINGS, LEVELS_BY, LEVELS_BY_HELP, LEVELS_HELP, MAX_Z,
                                         MIN_Z, ROUNDINGS, SIZE_HELP, SOLVER_HELP, TARGETS, ClusterTrials,
                                         GoalTarget, check_id_coding, check_levels, cluster_resolved,
                                         cluster_section_sizes,
                                         cluster_accumulator, cluster_parts, decode_clusters, decode_clusters_on_device,
                                         encode_clusters_kept, format_minor,
                                         given_levels, resolve_id_packing)
from mucsc.codec.numerics import centroids, levels_floor
from mucsc.errors import ParameterError, SizeError

WEIGHTINGS = ("total", "size", "damped")  # how bits= / size= weigh each group's J (MucscParams)


@dataclasses.dataclass(frozen=True)
class MucscParams(GoalTarget):
    """Exactly one of z / bits / max_error / size chooses the number of centroids (z = 16 when none
    is given): ``z`` fixes it (within ``Z_RANGE``); ``bits`` is a budget in bits per element of the whole
    message (framing included); ``size`` a budget in bytes of the whole message; ``max_error`` a
    bound on each group's relative error sqrt(J) / ||x||.  The header records the Z chosen, so
    decoding needs nothing else.  solver: how centroids are chosen for a fixed z (the goals use
    entropy-constrained levels, mucsc.codec.numerics.ecsq, as well); centroid_dtype: wire dtype; id_packing:
    "tight" (ceil(log2 z) bits), "aligned" (byte-aligned widths when the entropy allows, for a
    zstd-compressed IDS_) or "auto" (aligned exactly when the container compresses); id_coding:
    "packed" (IDS_, format 1.0), "rans" (IDSA, static rANS, format 1.1), "lanes" (IDSL, lane-parallel
    static rANS, format 1.2; a fixed z only) or "auto" (for a fixed z: lanes when the container
    compresses, unless zstd on the packed IDs is smaller, packed when it does not; with a goal,
    whichever of packed and rans is best).  levels / levels_by: the
    levels themselves instead of solving for z (what rate control resolves a goal to: explicit, so
    they take part in ==, hash and get_config) and who chose them (written to the header's solver).
    How bits= / size= split the budget over the groups: ``weighting`` "total" minimises the total J
    (the paper's objective for an update), "size" each group's squared relative error weighted by
    its element count (no small tensor starved: the weights' overall error) and "damped" by its
    element count to the power :data:`~mucsc.codec.numerics.allocate.DAMPED_POWER` (a checkpoint: a
    table as large as the rest together, an embedding, counts a little less than its share of the
    elements toward what the model computes); ``error_cap`` keeps every group within
    that relative error where the budget allows, else within the smallest cap it allows.
    rounding: "stochastic" (eq. 7, unbiased: updates), "nearest" (each element to its nearest level,
    Lloyd-Max levels; deterministic and biased, J is the squared error: stored models; ``solver`` does
    not apply) or "dithered" (see :mod:`mucsc.codec.numerics.dither`; always rANS-coded indices).
    grid: the dithered grid's (step, offset) instead of z's (what rate control resolves a goal to)."""

    z: int | None = param(None, "Number of centroids Z (default 16 when no goal is given)", min=MIN_Z, max=MAX_Z)
    solver: Literal[tuple(centroids.SOLVERS)] = param("optimal", SOLVER_HELP)
    centroid_dtype: Literal[tuple(CENTROID_DTYPES)] = param("float32", "Wire dtype of the centroids")
    id_packing: Literal[ID_PACKINGS] = param("auto", ID_PACKING_HELP)
    bits: float | None = param(None, BITS_HELP, min=0, max=64, min_open=True)
    max_error: float | None = param(None, "Goal: a bound on each group's relative error sqrt(J)/||x||", min=0,
                                    min_open=True)
    size: int | None = param(None, SIZE_HELP, min=1)
    id_coding: Literal[ID_CODINGS] = param("auto", ID_CODING_HELP)
    rounding: Literal[ROUNDINGS] = param("stochastic", "How each element becomes a level: stochastic (eq. 7, "
                                         "unbiased: updates), nearest (deterministic, biased, Lloyd-Max levels: "
                                         "stored models) or dithered (subtractive dither on a uniform grid, "
                                         "rANS-coded, format 1.2)")
    levels: tuple[float, ...] | None = param(None, LEVELS_HELP, cli=False)
    levels_by: Literal[LEVELS_BY] = param("ecsq", LEVELS_BY_HELP, cli=False)
    weighting: Literal[WEIGHTINGS] = param("total", "How bits / size split the budget over the groups: total "
                                           "(least total J: updates), size (each group's squared relative "
                                           "error weighted by its elements) or damped (weighted by its "
                                           "elements to the power 0.8: checkpoints)")
    error_cap: float | None = param(None, "With bits/size: keep every group within this relative error "
                                    "sqrt(J)/||x|| where the budget allows", min=0, min_open=True)
    grid: tuple[float, float] | None = param(None, "The dithered grid's (step, offset) instead of z (what rate "
                                             "control resolves a goal to)", cli=False)

    def __post_init__(self) -> None:
        _check_goals(self)
        _check_choices(self)
        if self.error_cap is not None and not 0 < self.error_cap < math.inf:
            raise ParameterError(f"error_cap (relative error sqrt(J)/||x|| of each group) must be > 0, "
                                 f"got {self.error_cap}")
        if self.rounding not in ROUNDINGS:
            raise ParameterError(f"rounding must be one of {', '.join(ROUNDINGS)}, got {self.rounding!r}")
        if self.rounding == "dithered" and self.id_coding in ("packed", "lanes"):
            raise ParameterError(f"rounding='dithered' always rANS-codes its indices per context (QIDX): "
                                 f"id_coding={self.id_coding!r} does not apply")
        check_id_coding(self)
        dithered.check_grid(self)
        check_levels(self)


def _check_goals(p: MucscParams) -> None:
    """At most one of z / bits / max_error / size, each within its range."""
    given = [t for t in TARGETS if getattr(p, t) is not None]
    if len(given) > 1:
        raise ParameterError(f"give one of z, bits, max_error, size (they all choose the number of "
                             f"centroids), got {', '.join(given)}")
    if p.z is not None and not MIN_Z <= p.z <= MAX_Z:
        raise ParameterError(f"z must be in {MIN_Z}..{MAX_Z}, got {p.z}")
    if p.bits is not None and not 0 < p.bits <= 64:
        raise ParameterError(f"bits (per element of the message) must be in (0, 64], got {p.bits}")
    if p.max_error is not None and not 0 < p.max_error < math.inf:
        raise ParameterError(f"max_error (relative error sqrt(J)/||x||) must be > 0, got {p.max_error}")
    if p.size is not None and p.size < 1:
        raise ParameterError(f"size (bytes of the message) must be >= 1, got {p.size}")


def _check_choices(p: MucscParams) -> None:
    """solver, centroid_dtype, id_packing, id_coding and weighting among their choices."""
    if p.solver not in centroids.SOLVERS:
        raise ParameterError(f"unknown solver {p.solver!r}; choose from {', '.join(centroids.SOLVERS)}")
    if p.centroid_dtype not in CENTROID_DTYPES:
        raise ParameterError(f"centroid_dtype must be one of {', '.join(CENTROID_DTYPES)}")
    if p.id_packing not in ID_PACKINGS:
        raise ParameterError(f"id_packing must be one of {', '.join(ID_PACKINGS)}")
    if p.id_coding not in ID_CODINGS:
        raise ParameterError(f"id_coding must be one of {', '.join(ID_CODINGS)}")
    if p.weighting not in WEIGHTINGS:
        raise ParameterError(f"weighting must be one of {', '.join(WEIGHTINGS)}, got {p.weighting!r}")


def paper_mucsc_bytes(d: int, z: int, h: int = H) -> float:
    """Bytes of one MUCSC transfer as the paper counts them: ceil(log2 Z)/8 d + h Z
    (eq. CompressionRateofMUCSC's per-direction term)."""
    return ceil_log2(z) / 8 * d + h * z


@register
class Mucsc(Codec):
    """MUCSC: Z centroids minimising J, unbiased stochastic rounding, fixed-width cluster IDs."""

    name = "mucsc"
    unbiased = True  # with rounding="nearest" it is not: see ``biased``
    accepts_device = True
    summary = "soft clustering to z centroids, unbiased; ceil(log2 z) bits per element"
    Params = MucscParams
    limits = {"z": Z_RANGE}
    # section VI-A: both directions; the clients' Z_U (mixed by thirds) and the server's Z_D
    paper_setup = PaperSetup(z_param="z")

    def section_sizes(self, n: int, *, positions_bytes: int | None = None, centroids: int | None = None,
                      estimate: bool = False) -> dict[str, int]:
        """``centroids`` sent default to min(z, n), exact for continuous data (ties merge levels)."""
        if self.params.rounding == "dithered":
            raise SizeError("rounding='dithered' entropy-codes its indices: a data-dependent size")
        if self.params.target != "z" and centroids is None:
            raise SizeError(f"mucsc with {self.params.target}= chooses Z from the data: pass centroids")
        k = min(self.params.fixed_z, n) if centroids is None else centroids
        return cluster_section_sizes(n, k, self.params, estimate)

    def paper_bytes(self, d: int, h: int = H) -> float | None:
        """eq. CompressionRateofMUCSC's per-direction bytes for a fixed Z (None when bits=, size= or
        max_error= choose Z from the data)."""
        fixed = self.params.target == "z" and self.params.rounding != "dithered"
        return paper_mucsc_bytes(d, self.params.fixed_z, h) if fixed else None

    def for_container(self, compressing: bool) -> Codec:
        return resolve_id_packing(self, compressing)

    @property
    def biased(self) -> bool:
        """Nearest rounding is deterministic: its error does not average out (error feedback)."""
        return self.params.rounding == "nearest"

    @classmethod
    def format_minor(cls, params: Mapping[str, Any]) -> int:
        return format_minor(params)

    @classmethod
    def with_preset(cls, preset: Mapping[str, Any], given: Mapping[str, Any]) -> dict[str, Any]:
        """A goal the user gave (z, bits, max_error or size) replaces the preset's."""
        if any(t in given for t in TARGETS):
            preset = {k: v for k, v in preset.items() if k not in TARGETS}
        return {**preset, **given}

    def trials(self, x: np.ndarray) -> ClusterTrials | dithered.DitherTrials:
        """Rate control's trial encodings of one group (a goal's search: mucsc.codec.ratecontrol)."""
        if self.params.rounding == "dithered":
            return dithered.DitherTrials(x)
        return ClusterTrials(x, self.params)

    def exceeds_within(self, x: np.ndarray, sq_error: float, size: int) -> bool:
        """By the centroid table alone: a decode within ``sq_error`` takes at least as many distinct
        values as :func:`~mucsc.codec.numerics.levels_floor.beyond` says, each a centroid of the
        table (dithered rounding sends no table: not known)."""
        if self.params.rounding == "dithered":
            return False
        return levels_floor.beyond(x, size // np.dtype(CENTROID_DTYPES[self.params.centroid_dtype]).itemsize,
                                   sq_error)

    @property
    def input_limit(self) -> float:
        return CENTROID_LIMITS[self.params.centroid_dtype]

    def encode_array(self, x: np.ndarray, rng: np.random.Generator) -> EncodedGroup:
        codec = self
        if self.params.target != "z":  # called directly (not through the API): budget = this group
            codec, x, rng, done = plan_alone(self, x, rng)
            if done is not None:
                return done
        if self.params.rounding == "dithered":  # on the host on every backend (rANS-coded indices)
            x = backend_of(x).host_array(x)
            grid = codec.params.grid
            grid = dithered.Grid(*grid) if grid else dithered.fixed_grid(x, codec.params.fixed_z)
            params, sections, J = dithered.encode(x, rng, grid)
            return EncodedGroup(params, sections, {"J": J})
        params, sections, J, lookup = encode_clusters_kept(x, codec.params, rng, given_levels(codec.params),
                                                           levels_by=codec.params.levels_by)
        return EncodedGroup(params, sections, {"J": J}, cluster_resolved(params), lookup)

    @classmethod
    def decode_array(cls, n: int, params: Mapping[str, Any], sections: Mapping[str, memoryview],
                     dtype: np.dtype) -> np.ndarray:
        return decode_clusters(n, params, sections, dtype)

    @classmethod
    def decode_mapped(cls, n: int, params: Mapping[str, Any], sections: Mapping[str, memoryview],
                      dtype: np.dtype, table_map: Callable[[np.ndarray], np.ndarray]) -> np.ndarray | None:
        return decode_clusters(n, params, sections, dtype, table_map)

    @classmethod
    def decode_parts(cls, n: int, params: Mapping[str, Any], sections: Mapping[str, memoryview],
                     dtype: np.dtype) -> Iterator[np.ndarray]:
        return cluster_parts(n, params, sections, dtype)

    @classmethod
    def accumulator(cls, n: int, params: Mapping[str, Any], sections: Mapping[str, memoryview],
                    dtype: np.dtype) -> Callable[[np.ndarray, float], None]:
        return cluster_accumulator(n, params, sections, dtype)

    @classmethod
    def decode_on_device(cls, n: int, params: Mapping[str, Any], sections: Mapping[str, memoryview],
                         dtype: np.dtype, device) -> Any:
        return decode_clusters_on_device(n, params, sections, dtype, device)
