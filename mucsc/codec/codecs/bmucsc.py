"""B-MUCSC, Boosted MUCSC (paper section IV-E): MUCSC on the d0 largest-magnitude elements.

Rank |U_m|, keep the top d0 = ceil(keep * d) (default 1%, the paper's 0.01 d), cluster those into at
most ``z`` centroids (default 256) and stochastically round them (eq. 7, unbiased on the kept part),
send their positions, and replace the other d - d0 elements by their mean (one float32).  Biased by
design: the rest is replaced by its mean (use error feedback, mucsc.codec.api.state, to carry it over).

Goals (docs/codecs.md "Rate control"): exactly one of ``z`` / ``bits`` / ``size`` / ``max_error``.
``z`` fixes the kept set's number of centroids (``keep`` default 1%).  With a goal the encoder chooses
the keep fraction (from rate control's ladder, mucsc.codec.ratecontrol.sparse_search, unless ``keep`` is given: then only the kept set's
coding) and the kept set's coding (the four families of the mucsc goals: J-optimal levels with
packed or rANS-coded IDs, entropy-constrained levels, uniform levels) to minimise
J = J_kept + ||rest - mean||^2 within the budget, or the smallest message with
sqrt(J) / ||x|| <= max_error.  A budget has a floor (positions of the fewest kept elements + the
mean + the cheapest coding of the kept values + framing), an error bound a floor too with a given
keep (the mean replacement of the rest); a request below either is a ParameterError naming it.

Positions: ``auto`` (default) is the smallest of Rice / Elias-Fano / bitmap (about 8.1 bits per
position at d0 = 0.01 d); ``paper`` is the fixed ceil(log2 d) bits of eq. CompressRateB.  With
compress="off" and positions="paper" the payload equals the paper's count exactly:
(ceil(log2 Z) + ceil(log2 d)) d0 / 8 + 4 Z + 4 (up to byte rounding).  Layout: spec/codecs.md "bmucsc".
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from typing import Any, ClassVar, Literal

import numpy as np

from mucsc.codec.backends.dispatch import HOST, Kept, backend_of, backend_on
from mucsc.codec.codecs.base import (F32_MAX, H, Z_RANGE, Codec, EncodedGroup, PaperSetup, Section, array_from,
                                     ceil_log2, param, param_int, param_str, plan_alone, register, scattered,
                                     section)
from mucsc.codec.codecs.clusters import (BITS_HELP, CENTROID_DTYPES, CENTROID_LIMITS, ID_CODING_HELP, ID_CODINGS,
                                         ID_PACKING_HELP, ID_PACKINGS, LEVELS_BY, LEVELS_BY_HELP, LEVELS_HELP, MAX_Z,
                                         MIN_Z, SIZE_HELP, SOLVER_HELP, TARGETS, ClusterTrials, GoalTarget,
                                         cluster_resolved, cluster_section_sizes, decode_clusters,
                                         decode_clusters_on_device, encode_clusters, format_minor, given_levels,
                                         resolve_id_packing)
from mucsc.codec.codecs.mucsc import MucscParams
from mucsc.codec.codecs.topk import (
    KEEP_LIMITS, POSITIONS_HELP, check_keep, check_positions, header_keep, positions_resolved, positions_size,
)
from mucsc.codec.numerics import centroids
from mucsc.codec.wire import sparse
from mucsc.errors import FormatError, ParameterError, SizeError

DEFAULT_KEEP = 0.01  # the paper's d0 = 0.01 d (section VI-A)
DEFAULT_Z = 256  # the paper's Z for B-MUCSC
# "solver" values a bmucsc header may carry: a J-minimising solver, or how a goal chose the levels
HEADER_SOLVERS = (*centroids.SOLVERS, "ecsq")


def paper_bmucsc_bytes(d: int, d0: float, z: int, h: int = H) -> float:
    """Bytes of one B-MUCSC transfer as the paper counts them (eq. CompressRateB's per-direction
    term): (ceil(log2 Z) + ceil(log2 d)) / 8 d0 + h Z + h (fixed-width IDs and positions, the mean)."""
    return (ceil_log2(z) + ceil_log2(d)) / 8 * d0 + h * z + h


def cluster_params(p: Any) -> MucscParams:
    """The mucsc codec's parameters for the clustering of the kept elements (a fixed Z: a goal is
    resolved by bmucsc's own plan, over the keep fraction too)."""
    return MucscParams(z=p.fixed_z, solver=p.solver, centroid_dtype=p.centroid_dtype, id_packing=p.id_packing,
                       id_coding=p.id_coding, levels=p.levels, levels_by=p.levels_by)


def select(x: np.ndarray, keep: float) -> tuple[int, np.ndarray, np.ndarray, float]:
    """The top-k selection on the host: (k, sorted positions, kept values, sum of the rest in float64)."""
    sel = HOST.keep_top_k(x, keep)
    return sel.k, sel.pos, sel.kept, sel.rest_sum


def rest_mean(n: int, k: int, rest_sum: float) -> np.float32:
    """SCAL: the mean of the n - k elements not kept (0 when all are kept)."""
    return np.float32(rest_sum / (n - k)) if n > k else np.float32(0)


def rest_bias(x: np.ndarray, pos: np.ndarray, mean: float) -> float:
    """||rest - mean||^2: the squared error of replacing the elements not kept by their mean."""
    return HOST.rest_sq_bias(x, pos, mean)


@register
class BMUCSC(Codec):
    name = "bmucsc"
    accepts_device = True
    summary = "B-MUCSC: MUCSC on the top keep*d magnitudes, the rest sent as their mean (paper IV-E)"
    paper_positions = "fixed"  # eq. CompressRateB: ceil(log2 d) bits per position
    limits = {**KEEP_LIMITS, "z": Z_RANGE}
    # section VI-A: both directions, d0 = 0.01 d, Z = 256
    paper_setup = PaperSetup(up={"z": 256, "keep": 0.01}, down={"z": 256, "keep": 0.01})

    @dataclasses.dataclass(frozen=True)
    class Params(GoalTarget):
        """keep: the fraction of elements clustered (None: 1% with a fixed z, chosen by a goal);
        exactly one of z (the kept set's centroids, 256 when none is given) / bits (per element of
        the whole message) / size (bytes of the message) / max_error (sqrt(J) / ||x|| per group,
        J including the rest's mean replacement); solver, centroid_dtype, id_packing, id_coding:
        as the mucsc codec's, for the kept values; positions: the position code."""

        keep: float | None = param(None, "Fraction of the elements clustered, in (0, 1] (default 1% with a "
                                   "fixed z, chosen by a goal)", min=0, max=1, min_open=True)
        z: int | None = param(None, "Centroids of the kept set (default 256 when no goal is given)", min=MIN_Z,
                              max=MAX_Z)
        solver: Literal[tuple(centroids.SOLVERS)] = param("optimal", SOLVER_HELP)
        positions: Literal[sparse.POSITION_MODES] = param("auto", POSITIONS_HELP)
        centroid_dtype: Literal[tuple(CENTROID_DTYPES)] = param("float32", "Wire dtype of the centroids")
        id_packing: Literal[ID_PACKINGS] = param("auto", ID_PACKING_HELP)  # as the mucsc codec's
        bits: float | None = param(None, BITS_HELP, min=0, max=64, min_open=True)
        max_error: float | None = param(None, "Goal: a bound on each group's relative error sqrt(J)/||x|| (J "
                                        "including the rest's mean replacement)", min=0, min_open=True)
        size: int | None = param(None, SIZE_HELP, min=1)
        id_coding: Literal[ID_CODINGS] = param("auto", ID_CODING_HELP)  # as mucsc's: rans is format 1.1
        levels: tuple[float, ...] | None = param(None, LEVELS_HELP, cli=False)  # as mucsc's
        levels_by: Literal[LEVELS_BY] = param("ecsq", LEVELS_BY_HELP, cli=False)
        default_z: ClassVar[int] = DEFAULT_Z

        def __post_init__(self) -> None:
            if self.keep is not None:
                check_keep("bmucsc", self.keep)
            check_positions("bmucsc", self.positions)
            try:  # the clustering parameters and the goals are the mucsc codec's, validated there
                MucscParams(z=self.z, solver=self.solver, centroid_dtype=self.centroid_dtype,
                            id_packing=self.id_packing, bits=self.bits, max_error=self.max_error, size=self.size,
                            id_coding=self.id_coding, levels=self.levels, levels_by=self.levels_by)
            except ParameterError as exc:
                raise ParameterError(f"bmucsc: {exc}") from None

        @property
        def keep_fraction(self) -> float:
            """The keep fraction of a fixed-z encoding."""
            return DEFAULT_KEEP if self.keep is None else self.keep

    @property
    def _cluster_params(self) -> MucscParams:
        return cluster_params(self.params)

    def section_sizes(self, n: int, *, positions_bytes: int | None = None, centroids: int | None = None,
                      estimate: bool = False) -> dict[str, int]:
        """``centroids`` sent default to min(z, kept elements), exact for continuous data."""
        if self.params.target != "z":
            raise SizeError(f"bmucsc with {self.params.target}= chooses keep and Z from the data")
        k = sparse.keep_count(self.params.keep_fraction, n)
        kc = min(self.params.fixed_z, k) if centroids is None else centroids
        return {**cluster_section_sizes(k, kc, self._cluster_params, estimate),
                "INDX": positions_size(self, n, k, positions_bytes, estimate), "SCAL": 4}

    def paper_bytes(self, d: int, h: int = H) -> float | None:
        """eq. CompressRateB's bytes (None when a goal chooses keep and Z from the data)."""
        if self.params.target != "z":
            return None
        return paper_bmucsc_bytes(d, sparse.keep_count(self.params.keep_fraction, d), self.params.fixed_z, h)

    def for_container(self, compressing: bool) -> Codec:
        return resolve_id_packing(self, compressing)

    @property
    def input_limit(self) -> float:
        return min(CENTROID_LIMITS[self.params.centroid_dtype], F32_MAX)  # SCAL, the mean, is float32

    @classmethod
    def format_minor(cls, params: Mapping[str, Any]) -> int:
        return format_minor(params)  # 1 for the kept set's rANS-coded IDs (IDSA)

    @classmethod
    def with_preset(cls, preset: Mapping[str, Any], given: Mapping[str, Any]) -> dict[str, Any]:
        """A goal the user gave replaces the preset's z, and the preset's keep too unless the user
        gave keep (the goal then chooses it)."""
        if any(t in given for t in TARGETS):
            goal = any(t in given for t in TARGETS if t != "z")
            drop = set(TARGETS) | ({"keep"} if goal and "keep" not in given else set())
            preset = {k: v for k, v in preset.items() if k not in drop}
        return {**preset, **given}

    def trials(self, x: np.ndarray) -> "KeptTrials":
        """Rate control's trial encodings of one group: per keep fraction, the kept set's
        positions and mean, and the kept values' clustering trials (mucsc.codec.ratecontrol)."""
        return KeptTrials(self, x)

    def encode_array(self, x: np.ndarray, rng: np.random.Generator) -> EncodedGroup:
        codec = self
        if self.params.target != "z":  # called directly (not through the API): budget = this group
            codec, host, rng, done = plan_alone(self, x, rng)
            return done if done is not None else codec.encode_array(host, rng)
        sel = backend_of(x).keep_top_k(x, self.params.keep_fraction)  # where x lives (ties: the host)
        return self._encode_kept(sel, rng)

    def _encode_kept(self, sel: Kept, rng: np.random.Generator) -> EncodedGroup:
        """Everything after the selection: the kept values' clusters, positions and the rest's mean
        (``sel.kept_host``: device ``kept``'s values already on the host)."""
        be = backend_of(sel.x)
        x, k, pos = sel.x, sel.k, sel.pos
        n = be.size(x)
        mean = rest_mean(n, k, sel.rest_sum)
        # as the mucsc codec (a goal's levels, when resolved by plan)
        cparams, csecs, J_kept = encode_clusters(sel.kept, self._cluster_params, rng, given_levels(self.params),
                                                 levels_by=self.params.levels_by, host=sel.kept_host)
        params = {"keep": self.params.keep_fraction, "k": k, **cparams}
        secs = (*csecs, *self._rest_sections(pos, n, mean, params))

        def sq_error() -> float:  # variance of the kept part (eq. 8-9) + the rest's squared bias
            return J_kept() + be.rest_sq_bias(x, pos, mean)
        return EncodedGroup(params, secs, {"J": sq_error, "kept": float(k)},
                            {"keep": self.params.keep_fraction, **cluster_resolved(cparams),
                             **positions_resolved(self.params.positions, params["pos"])})

    def _rest_sections(self, pos: np.ndarray, n: int, mean: np.float32, params: dict) -> tuple[Section, ...]:
        """INDX (the kept positions) and SCAL (the rest's mean); adds the position code to ``params``."""
        method = self.paper_positions if self.params.positions == "paper" else self.params.positions
        coded = sparse.encode(pos, n, method)
        params.update(sparse.header_params(coded))
        return (Section("INDX", coded.data, compressible=coded.method in ("fixed", "bitmap")),
                Section("SCAL", np.array([mean], "<f4").tobytes()))

    @classmethod
    def decode_array(cls, n: int, params: Mapping[str, Any], sections: Mapping[str, memoryview],
                     dtype: np.dtype) -> np.ndarray:
        pos, vals, mean = cls._kept(n, params, sections, dtype)
        return HOST.scatter(n, pos, vals, dtype, fill=mean)

    @classmethod
    def decode_parts(cls, n: int, params: Mapping[str, Any], sections: Mapping[str, memoryview],
                     dtype: np.dtype) -> Iterator[np.ndarray]:
        """:meth:`decode_array` a piece at a time: the k kept values (decoded whole: k is the kept
        fraction) scattered over the mean piece by piece, so the n values are never held at once."""
        yield from scattered(n, *cls._kept(n, params, sections, dtype), dtype)

    @classmethod
    def _kept(cls, n: int, params: Mapping[str, Any], sections: Mapping[str, memoryview], dtype: np.dtype):
        """(the k kept positions, their values, the rest's mean), checked."""
        k = cls._kept_count(n, params)
        vals = decode_clusters(k, params, sections, dtype)  # CENT + IDS_ exactly as the mucsc codec
        pos, mean = cls._rest(n, k, params, sections)
        return pos, vals, mean

    @classmethod
    def decode_on_device(cls, n: int, params: Mapping[str, Any], sections: Mapping[str, memoryview],
                         dtype: np.dtype, device) -> Any:
        """:meth:`decode_array` on ``device``: the kept values unpacked and gathered there (as the
        mucsc codec's), the positions decoded on the host and the values scattered over the mean."""
        k = cls._kept_count(n, params)
        vals = decode_clusters_on_device(k, params, sections, dtype, device)
        pos, mean = cls._rest(n, k, params, sections)
        return backend_on(device).scatter(n, pos, vals, dtype, device, fill=mean)

    @staticmethod
    def _kept_count(n: int, params: Mapping[str, Any]) -> int:
        """k from the untrusted header, after checking its informative keys are well-formed."""
        header_keep(params)
        param_int(params, "z", *Z_RANGE)  # informative (requested Z, solver), but must be well-formed
        param_str(params, "solver", HEADER_SOLVERS)
        return param_int(params, "k", 0, n)

    @staticmethod
    def _rest(n: int, k: int, params: Mapping[str, Any], sections: Mapping[str, memoryview]):
        """(the k kept positions, the rest's float32 mean), checked."""
        pos = sparse.decode_from_header(params, section(sections, "INDX"), n, k)
        mean = array_from(section(sections, "SCAL", 4), "<f4")[0]
        if not np.isfinite(mean):
            raise FormatError("bmucsc: the mean of the rest must be finite")
        return pos, mean


@dataclasses.dataclass(frozen=True)
class KeptPart:
    """One keep fraction of a trial: k kept, the header params and sections (INDX, SCAL) of the
    positions and the rest's mean, the rest's squared bias, and the kept values' clustering trials."""

    keep: float
    k: int
    header: dict
    sections: tuple[Section, ...]
    bias: float
    trials: ClusterTrials


class KeptTrials:
    """bmucsc's measuring protocol (rate control decides which keep fractions and codings to try)."""

    def __init__(self, codec: BMUCSC, x: np.ndarray):
        self.x, self.p = x, codec.params
        self._fixed = BMUCSC(**{**dataclasses.asdict(codec.params), "z": None, "bits": None, "max_error": None,
                                "size": None})

    def part(self, keep: float) -> KeptPart:
        """The selection at ``keep``: positions and the rest's mean, and the kept values' trials."""
        n = self.x.size
        k, pos, kept, rest_sum = select(self.x, keep)
        mean = rest_mean(n, k, rest_sum)
        bias = rest_bias(self.x, pos, mean) if n > k else 0.0
        header: dict[str, Any] = {"keep": keep, "k": k}
        secs = self._fixed._rest_sections(pos, n, mean, header)
        return KeptPart(keep, k, header, secs, bias, ClusterTrials(kept, cluster_params(self.p)))

