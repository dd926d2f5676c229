"""Soft clustering of one vector (paper section IV-A), shared by ``mucsc`` and ``bmucsc``: levels
(solved for a Z, or given), eq. 7's unbiased rounding to them, the IDs packed (IDS_) or rANS-coded
(IDSA) or lane-coded (IDSL), and the inverse.  :class:`ClusterTrials` is the measuring protocol rate control drives
(:mod:`mucsc.codec.ratecontrol`): trial encodings of one vector, without any search of its own.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Iterator, Mapping
from typing import Any, ClassVar

import numpy as np

from mucsc.codec import parallel
from mucsc.codec.backends.dispatch import HOST, backend_for, backend_of, backend_on
from mucsc.codec.codecs import _dithered as dithered
from mucsc.codec.codecs.base import (ACCUMULATE_CHUNK, F32_MAX, PART, Z_RANGE, Codec, Section, add_scaled,
                                     array_from, ceil_log2, param_int, param_str, section, section_stream)
from mucsc.codec.numerics import centroids, nearest, quantize
from mucsc.codec.wire import bitpack, lanes, rans, structure
from mucsc.codec.wire.zstdframe import ZstdFrame
from mucsc.errors import FormatError, ParameterError, SizeError

MIN_Z, MAX_Z = Z_RANGE
# (dtype objects: numpy parses a dtype string on every call that takes one)
CENTROID_DTYPES = {name: np.dtype(code) for name, code in (("float16", "<f2"), ("float32", "<f4"), ("float64", "<f8"))}
# the largest |x| each centroid dtype carries: float16/float32 their largest finite value (a float32
# step c[k+1] - c[k] beyond FLT_MAX makes FORMAT.md 4.3 round in float64); float64 a quarter of its
# largest, so that every c[k+1] - c[k] stays finite in float64
CENTROID_LIMITS = {"float16": 65504.0, "float32": F32_MAX, "float64": float(np.finfo(np.float64).max) / 4}


ID_PACKINGS = ("auto", "tight", "aligned")
ID_CODINGS = ("auto", "packed", "rans", "lanes")
# The fixed-Z "auto" coding keeps lane-parallel rANS (IDSL) unless zstd on the packed IDs is smaller:
# packed IDs up to this many bytes are compared exactly.  Larger ones are screened on SAMPLE_SLICES
# evenly spaced slices of SAMPLE_BYTES for what zstd could use beyond order-0 coding (repeats, a
# drifting byte distribution: wire.structure); only where the screen finds some, zstd compresses the
# same slices, and the whole frame is computed when their rate beats the lanes' mean rate.
EXACT_ZSTD_BYTES = 1 << 18
SAMPLE_SLICES, SAMPLE_BYTES = 4, 1 << 16
COMPARE_LEVEL = 3  # the zstd level of that comparison (FORMAT.md 4.6), whatever the container's level
# zstd's entropy stage codes bytes: IDs that straddle byte boundaries (3, 5, 6, 7 bits) compress far
# worse than the same IDs packed 4 or 8 bits wide (measured, Gaussian d = 1.3e6, Z = 8: 2.81 bits per
# ID tight vs 2.46 aligned, entropy 2.43; docs/codecs.md).  Wider IDs (9..15 bits) stay tight: as
# 16-bit words their two bytes mix into one byte alphabet and compress worse than tight packing.
ALIGNED_WIDTH = {3: 4, 5: 8, 6: 8, 7: 8}
ALIGN_MARGIN_BITS = 0.25  # aligned only if the sampled entropy is this far below the tight width


def id_width(k: int) -> int:
    """Bits per cluster ID for ``k`` centroids: ceil(log2 k), 0 for a single centroid."""
    return ceil_log2(k) if k > 1 else 0


def packed_width(ids: np.ndarray, k: int, packing: str) -> int:
    """The IDS_ width: ceil(log2 k), or its byte-aligned widening when ``packing`` is "aligned" and
    the IDs' entropy (estimated on a sample) leaves room for zstd to win the extra bits back."""
    w = id_width(k)
    if packing != "aligned" or w not in ALIGNED_WIDTH or len(ids) == 0:
        return w
    step = max(1, len(ids) // 65536)
    sample = backend_of(ids).id_sample(ids, step)  # on the host (rounded there only, for a device rounding)
    p = np.bincount(sample, minlength=k) / sample.size
    p = p[p > 0]
    entropy = float(-(p * np.log2(p)).sum())
    return ALIGNED_WIDTH[w] if entropy < w - ALIGN_MARGIN_BITS else w



TARGETS = ("z", "bits", "max_error", "size")  # the fields that choose Z; all but z are goals
# How each element becomes a level: "stochastic" (paper eq. 7, unbiased), "nearest" (deterministic,
# biased, Lloyd-Max levels: for stored models), "dithered" (subtractive dither on a uniform grid).
ROUNDINGS = ("stochastic", "nearest", "dithered")
DEFAULT_Z = 16  # mucsc's Z when no field chooses it


def rounding_of(p: Any) -> str:
    """How clustering parameters round (bmucsc's have no ``rounding`` field: eq. 7's stochastic)."""
    return getattr(p, "rounding", "stochastic")


class GoalTarget:
    """What mucsc's and bmucsc's parameters share about their goal fields (z / bits / max_error /
    size, at most one given): which one drives the choice, and Z in the fixed-Z mode."""

    default_z: ClassVar[int] = DEFAULT_Z

    @functools.cached_property  # (parameters are frozen: worked out once, asked a few times per encode)
    def target(self) -> str:
        """Which of z / bits / max_error / size drives the choice ("z" when none was given)."""
        for t in TARGETS:
            if getattr(self, t) is not None:
                return t
        return "z"

    @property
    def fixed_z(self) -> int:
        """The number of centroids in the fixed-Z mode."""
        return self.default_z if self.z is None else self.z



LEVELS_BY = ("ecsq", "uniform", "optimal")  # who chose given levels: entropy-constrained, uniform steps, J-optimal
# help texts of the Params fields mucsc and bmucsc share (base.param; the command line shows them)
SOLVER_HELP = "How centroids are chosen for a fixed z (the goals use entropy-constrained levels as well)"
ID_PACKING_HELP = ("IDs' bit widths: tight (ceil(log2 z)), aligned (byte-aligned where the entropy allows, for a "
                   "zstd-compressed container) or auto (aligned exactly when the container compresses)")
ID_CODING_HELP = ("IDs' coding: packed (format 1.0), rans (static rANS, format 1.1), lanes (lane-parallel static rANS, "
                  "format 1.2; a fixed z only) or auto (a fixed z: lanes when the container compresses unless zstd on "
                  "the packed IDs is smaller, else packed; with a goal whichever of packed and rans is best)")
BITS_HELP = "Goal: bits per element of the whole message (framing included)"
SIZE_HELP = "Goal: bytes of the whole message"
# fields rate control sets when it resolves a goal (cli=False: not command-line options)
LEVELS_HELP = "The levels themselves instead of solving for z (what rate control resolves a goal to)"
LEVELS_BY_HELP = "Who chose the given levels (written to the header's solver)"


def check_levels(p: Any) -> None:
    """Validate (and normalise to a tuple of floats) the explicit ``levels`` of clustering
    parameters: finite, at most MAX_Z of them, and not together with a goal."""
    if p.levels_by not in LEVELS_BY:
        raise ParameterError(f"levels_by must be one of {', '.join(LEVELS_BY)}, got {p.levels_by!r}")
    if p.levels is None:
        return
    if p.target != "z":
        raise ParameterError(f"levels fix the encoding: they exclude {p.target}=")
    try:
        levels = tuple(map(float, p.levels))
    except (TypeError, ValueError):
        raise ParameterError(f"levels must be a sequence of numbers, got {p.levels!r}") from None
    if not 1 <= len(levels) <= MAX_Z or not all(map(math.isfinite, levels)):
        raise ParameterError(f"levels must be 1..{MAX_Z} finite numbers")
    object.__setattr__(p, "levels", levels)


def given_levels(p: Any) -> np.ndarray | None:
    """The explicit levels of clustering parameters as the encoder takes them (None: solve for z)."""
    return None if p.levels is None else np.array(p.levels)


def check_id_coding(p: Any) -> None:
    """id_coding "lanes" codes a fixed Z's IDs (FORMAT.md 4.6): a goal's search weighs packed and
    rANS-coded IDs (IDSA), so it excludes a goal."""
    if p.id_coding == "lanes" and p.target != "z":
        raise ParameterError(f"id_coding='lanes' codes a fixed z's IDs: it excludes {p.target}= (a goal chooses "
                             f"between packed and rans; leave id_coding='auto')")


def resolve_id_packing(codec: Codec, compressing: bool) -> Codec:
    """``for_container`` of codecs with ``id_packing`` / ``id_coding`` parameters: resolve "auto"
    packing, and a fixed Z's "auto" coding of cluster IDs to "packed" when nothing is compressed (the
    paper's fixed width; a dithered grid always rANS-codes its indices)."""
    try:
        return _resolved(codec, compressing)
    except TypeError:  # unhashable parameters (not memoised)
        return _resolved.__wrapped__(codec, compressing)


@functools.lru_cache(maxsize=256)
def _resolved(codec: Codec, compressing: bool) -> Codec:
    """:func:`resolve_id_packing`'s codec, memoised: codecs are immutable values (equal and hashed by
    their parameters), and rebuilding one costs ~50 us per encode call (measured, d = 1e3)."""
    p = codec.params
    changes = {}
    if p.id_packing == "auto":
        changes["id_packing"] = "aligned" if compressing else "tight"
    if p.id_coding == "auto" and p.target == "z" and not compressing and rounding_of(p) != "dithered":
        changes["id_coding"] = "packed"
    return codec.replace(**changes) if changes else codec


def cluster_resolved(header: Mapping[str, Any]) -> dict[str, Any]:
    """What a clustering settled (``EncodedGroup.resolved``), from its header params: the z recorded
    and the ID coding used (an "auto" id_coding becomes "packed", "rans" or "lanes")."""
    return {"z": header["z"], "id_coding": header.get("id_coding", "packed")}


def cluster_section_sizes(n: int, k: int, p: GoalTarget, estimate: bool) -> dict[str, int]:
    """Raw bytes of CENT and IDS_ for ``n`` elements and ``k`` centroids sent, tight IDs.  An
    "aligned" packing widens 3- and 5..7-bit IDs when the data's entropy allows: data-dependent."""
    if p.id_coding in ("rans", "lanes") and not estimate:
        raise SizeError(f"id_coding={p.id_coding!r} (an entropy code of the IDs) has a data-dependent size")
    width = id_width(k)
    if p.id_packing == "aligned" and width in ALIGNED_WIDTH and not estimate:
        raise SizeError(f"id_packing='aligned' with {width}-bit IDs has a data-dependent size")
    return {"CENT": np.dtype(CENTROID_DTYPES[p.centroid_dtype]).itemsize * k,
            "IDS_": bitpack.packed_size(n, width)}



def encode_clusters(x: np.ndarray, p: GoalTarget, rng: np.random.Generator,
                    levels: np.ndarray | None = None, coding: str | None = None,
                    estimate: bool = False, levels_by: str = "ecsq", cache: dict | None = None,
                    host: np.ndarray | None = None) -> tuple[dict, tuple, Any]:
    """Shared by ``mucsc`` and ``bmucsc``: (header params, (CENT, IDS_ or IDSA) sections, J as a
    callable).  ``levels``: use these levels instead of solving for ``p.fixed_z``; ``coding``:
    "packed", "rans", "lanes" or "auto" (default: ``p.id_coding``); ``estimate``: an IDSA
    section of zeros of the estimated coded size (rate control's search; never sent).

    ``x`` may be a torch tensor (on any device): then its backend (:func:`backend_for`) encodes it
    where it lives, giving the same bytes; so does ``MUCSC_BACKEND=torch``.  Given ``levels`` (a
    goal's choice, planned on the host) the host path encodes it; so is nearest rounding.  ``host``:
    a torch ``x``'s values already on the host (nothing more is copied for the solver)."""
    return encode_clusters_kept(x, p, rng, levels, coding, estimate, levels_by, cache, host)[:3]


def encode_clusters_kept(x: np.ndarray, p: GoalTarget, rng: np.random.Generator,
                         levels: np.ndarray | None = None, coding: str | None = None,
                         estimate: bool = False, levels_by: str = "ecsq", cache: dict | None = None,
                         host: np.ndarray | None = None) -> tuple[dict, tuple, Any, tuple | None]:
    """:func:`encode_clusters` and the lookup its decode is (``EncodedGroup.lookup``): (the wire
    levels as ``x``'s dtype, the IDs), None when the IDs live on a device."""
    if levels is not None or rounding_of(p) != "stochastic":
        x = backend_of(x).host_array(x) if host is None else host
    wire, ids, J = round_clusters(x, p, rng, levels, cache, host)
    params, sections, J = cluster_message(x, p, wire, ids, J, levels, coding, estimate, levels_by)
    lookup = None
    if isinstance(ids, np.ndarray) and isinstance(x, np.ndarray) and ids.size == x.size:
        # what decode_clusters looks the IDs up in: the CENT section's values as the decoded dtype
        lookup = (wire.astype(x.dtype, copy=False), ids)  # wire: the CENT dtype already
    return params, sections, J, lookup


def round_clusters(x: np.ndarray, p: GoalTarget, rng: np.random.Generator,
                   levels: np.ndarray | None = None, cache: dict | None = None,
                   host: np.ndarray | None = None) -> tuple[np.ndarray, Any, Any]:
    """The first half of :func:`encode_clusters`: (wire centroids, IDs, J or None) -- the levels
    (solved for ``p.fixed_z`` unless given) and the stochastic rounding, before any ID coding.
    ``cache``: kept by a caller that rounds the same ``x`` many times (a goal's search): its bounds
    and the solver's sorted data are computed once (centroids.solve's ``cache``)."""
    dtype = CENTROID_DTYPES[p.centroid_dtype]
    if levels is None and rounding_of(p) == "stochastic":  # solved levels: where x lives
        be = backend_for(x)
        return be.solve_and_round(be.vector(x), p.fixed_z, p.solver, dtype, rng, cache, host)
    if x.size == 0:
        return np.zeros(0, dtype), np.zeros(0, np.uint8), 0.0
    if rounding_of(p) == "nearest":  # deterministic: draws nothing from rng
        c = nearest.lloyd_max(x, p.fixed_z, cache) if levels is None else levels
        wire = nearest.wire_levels(c, p.centroid_dtype)
        return (wire, *nearest.assign(x, wire))
    return HOST.solve_and_round(x, p.fixed_z, p.solver, dtype, rng, cache, levels=levels)  # a goal's levels


def cluster_message(x: np.ndarray, p: GoalTarget, wire: np.ndarray, ids: Any, J: Any,
                    levels: np.ndarray | None = None, coding: str | None = None, estimate: bool = False,
                    levels_by: str = "ecsq") -> tuple[dict, tuple, Any]:
    """The second half of :func:`encode_clusters`: header params, sections and J for one ID coding
    of a rounding (two codings of one rounding are what two encodes with the same rng give)."""
    coding = coding or p.id_coding
    rounding = rounding_of(p)
    # informative: who chose the levels
    solver = ("lloyd-max" if rounding == "nearest" else p.solver) if levels is None else levels_by
    k = int(wire.size)
    z = p.fixed_z if levels is None else max(MIN_Z, k)
    cent = Section("CENT", np.ascontiguousarray(wire, CENTROID_DTYPES[p.centroid_dtype]))
    ids_section = None
    if coding in ("auto", "lanes") and k > 1:  # format 1.2 (FORMAT.md 4.6), unless "auto" finds zstd smaller
        ids_section = lane_section(ids, k, p.id_packing, coding == "auto")
    if ids_section is not None and ids_section.tag == "IDSL":
        params = {"centroids": k, "centroid_dtype": p.centroid_dtype, "id_coding": "lanes", "solver": solver,
                  "z": z}
        sections = (cent, ids_section)
    elif coding == "rans" and k > 1:  # format 1.1 (FORMAT.md 4.4); one centroid needs no IDs at all
        ids = _host_ids(ids)
        params = {"centroids": k, "centroid_dtype": p.centroid_dtype, "id_coding": "rans", "solver": solver,
                  "z": z}
        data = bytes(rans.estimated_size(ids, k)) if estimate else rans.encode(ids, k)
        sections = (cent, Section("IDSA", data))
    else:
        bits = packed_width(ids, k, p.id_packing)
        params = {"centroids": k, "centroid_dtype": p.centroid_dtype, "id_bits": bits, "solver": solver,
                  "z": z}
        if ids_section is not None:  # lane_section's packing, with the zstd frame it compared
            sections = (cent, ids_section)
        else:
            packed = backend_of(ids).pack(ids, bits)  # a device rounding: rounded and packed there now
            sections = (cent, Section("IDS_", packed, compressible=True))
    if rounding != "stochastic":  # informative (decoding is the same): for `info` and honesty
        params["rounding"] = rounding

    return params, sections, _exact_J(x, wire, J)


def _host_ids(ids: Any) -> np.ndarray:
    """Cluster IDs (an array, a torch tensor or a device rounding) as a host array."""
    return backend_of(ids).host_array(ids)


def _exact_J(x: Any, wire: np.ndarray, J: Any) -> Any:
    """J of eq. 8-9 with the wire centroids the decoder sees: the rounding pass's, or computed."""
    def exact_J() -> float:
        if callable(J):
            return float(J())
        if J is not None:
            return float(J)
        return float(centroids.variance_J(x, np.asarray(wire, np.float64)))
    return exact_J


def lane_section(ids: Any, k: int, packing: str, auto: bool) -> Section | None:
    """The IDSL section of ``ids`` (k >= 2 centroids); with ``auto``, None when zstd on the IDS_
    packing would be smaller or lane coding does not pay for its table (see EXACT_ZSTD_BYTES), or
    for host IDs of at most EXACT_ZSTD_BYTES packed the IDS_ section itself (its packing and the zstd
    frame compared, a ``ZstdFrame``; lane coding skipped when ``lanes.size_estimate`` already loses).
    Device IDs are coded on their device (their backend's ``lane_code``): the same bytes."""
    w = lanes.symbol_bits(k)
    bits = packed_width(ids, k, packing) if auto else w
    be = backend_of(ids)
    if auto and be is HOST and _packed_size(len(ids), bits, w) <= EXACT_ZSTD_BYTES:
        sym, counts, xlog = lanes.symbols_counted(ids, k, w, xlog=True)
        return _lanes_or_packed(sym, counts, xlog, w, k, sym if bits == w else parallel.pack_array(ids, bits))
    spans = _sample_spans(lanes.symbol_count(len(ids), w)) if auto and bits == w else ()
    coded = be.lane_code(ids, k, w, bits, auto, spans, _screen)
    if auto and not _lanes_win(coded.nbytes, coded.size, coded.part, coded.seen):
        return None
    return Section("IDSL", coded.payload)


def _screen(packed: np.ndarray) -> structure.Screen | None:
    """The structure screen of packed IDs too large for an exact zstd comparison (None below that)."""
    if packed.size <= EXACT_ZSTD_BYTES:
        return None
    return structure.screen(packed, _sample_starts(packed.size), SAMPLE_BYTES)


def _packed_size(n: int, bits: int, w: int) -> int:
    """Bytes of n IDs packed ``bits`` wide (the lanes' ``w``-bit symbols when ``bits == w``)."""
    return lanes.symbol_count(n, w) if bits == w else bitpack.packed_size(n, bits)


def _lanes_or_packed(sym: np.ndarray, counts: np.ndarray, xlog: float, w: int, k: int, packed: np.ndarray
                     ) -> Section:
    """"auto"'s choice for host IDs of at most EXACT_ZSTD_BYTES packed (as :func:`_lanes_win`):
    the IDSL section when its bytes are no more than the packed bytes and their zstd frame, else the
    IDS_ section, carrying that frame for the writer.  The frame is taken first: the lanes are not
    coded when their size estimate, less its slack, is already above it (Gaussian IDs at Z = 16:
    ~70 us of a ~0.4 ms encode at d = 1e4, ~0.25 ms of ~1.4 ms at 1e5), nor their table made when
    the entropy floor is (~20 us)."""
    floor = lanes.entropy_floor(counts, sym.size, above=packed.size, xlog=xlog)  # xlog: sum c log2 c
    frame = parallel.zstd_compressor(COMPARE_LEVEL, 1).compress(packed)
    best = min(packed.size, len(frame))
    ids_ = Section("IDS_", packed, compressible=ZstdFrame(COMPARE_LEVEL, frame))
    if floor > best:
        return ids_
    tab = lanes.table(counts, sym.size)  # one table for the estimate and the coding
    if lanes.size_estimate(counts, sym.size, tab) - lanes.estimate_slack(sym.size) > best:
        return ids_
    data = lanes.payload(sym, w, lanes.alphabet(k, w), counts, tab)
    return Section("IDSL", data) if len(data) <= best else ids_


def _sample_spans(size: int) -> list[tuple[int, int]]:
    """The byte ranges of ``size`` packed bytes that :func:`_lanes_win` reads first: all of them up
    to EXACT_ZSTD_BYTES, else the sample slices."""
    if size <= EXACT_ZSTD_BYTES:
        return [(0, size)]
    return [(a, a + SAMPLE_BYTES) for a in _sample_starts(size).tolist()]


def _sample_starts(size: int) -> np.ndarray:
    """Where the SAMPLE_SLICES sample slices of ``size`` packed bytes start: evenly spaced."""
    return np.arange(SAMPLE_SLICES, dtype=np.int64) * (size // SAMPLE_SLICES)


def _lanes_win(coded: int, size: int, part: Any, seen: structure.Screen | None = None) -> bool:
    """Whether ``coded`` IDSL bytes are no more than the IDS_ section the container would store for
    ``size`` packed bytes (``part(a, b)``: bytes [a, b) on the host): the packed bytes, or their zstd
    frame (level 3) when smaller -- exact up to EXACT_ZSTD_BYTES; above, no zstd at all when the
    sample shows nothing zstd could use beyond order-0 coding (``seen``: its screen, when taken
    already), else zstd on the sample first and the whole frame only when the sample says zstd may win."""
    if coded > size:
        return False
    zstd = parallel.zstd_compressor(COMPARE_LEVEL, 1)
    if size > EXACT_ZSTD_BYTES:
        slices = None
        if seen is None:  # device IDs: the sample brought to the host once, screened there
            slices = [part(a, a + SAMPLE_BYTES) for a in _sample_starts(size).tolist()]
            seen = structure.screen(np.concatenate(slices), np.arange(SAMPLE_SLICES, dtype=np.int64) * SAMPLE_BYTES,
                                    SAMPLE_BYTES)
        if seen.order0_suffices(coded, size):
            return True  # nothing zstd could use beyond order-0 coding: no zstd trial
        if slices is None:
            slices = [part(a, a + SAMPLE_BYTES) for a in _sample_starts(size).tolist()]
        sample = sum(len(zstd.compress(s)) for s in slices)
        if sample * size >= coded * SAMPLE_SLICES * SAMPLE_BYTES:
            return True  # zstd's rate on the sample is no better than the lanes' mean rate
        zstd = parallel.zstd_compressor(COMPARE_LEVEL, parallel.current())
    return coded <= len(zstd.compress(part(0, size)))


def format_minor(params: Mapping[str, Any]) -> int:
    """The format minor version a group with these header params needs (1 for rANS-coded IDs, 2 for
    lane-coded IDs and the dithered layout)."""
    if params.get("rounding") == "dithered":
        return dithered.format_minor(params)
    return {"rans": 1, "lanes": 2}.get(params.get("id_coding"), 0)


def decode_clusters(n: int, params: Mapping[str, Any], sections: Mapping[str, memoryview],
                    dtype: np.dtype, table_map: Callable[[np.ndarray], np.ndarray] | None = None
                    ) -> np.ndarray | None:
    """Inverse of :func:`encode_clusters`, validating the untrusted header and sections.
    ``table_map``: an elementwise map applied to the table the IDs look up (the centroids as
    ``dtype``), so the values come back mapped (``Codec.decode_mapped``); None then for a dithered
    group (no table)."""
    if params.get("rounding") == "dithered":  # format 1.2: a dithered grid, no centroids
        return dithered.decode(n, params, sections, dtype) if table_map is None else None
    cent, width, payload = _cluster_sections(n, params, sections, stream=True)
    k = cent.size
    table = cent.astype(dtype) if table_map is None else np.ascontiguousarray(table_map(cent.astype(dtype)))
    if width == "lanes":  # format 1.2: values straight from the decoder, else symbols unpacked as IDS_ is
        out = lanes.decode_values(payload, n, k, table)
        if out is not None:
            return out
        sym, w = lanes.decode_symbols(payload, n, k)
        if w == lanes.WIDE:  # one symbol per ID, from a table of k symbols: ids < k
            return quantize.dequantize(sym, table, table.dtype, check=False)
        width, payload = w, sym
    elif width is None:  # format 1.1: every ID comes from a table of k symbols, so ids < k
        return _decode_rans(payload, n, table, table.dtype)
    if n == 0:
        return np.zeros(0, table.dtype)
    # fixed-width IDs (length checked): unpacked chunk by chunk on parallel.current() threads, each
    # checked against k
    return parallel.unpack_take(payload, width, n, table,
                                lambda top: FormatError(f"cluster id {top} out of range for {k} centroids"))


def cluster_parts(n: int, params: Mapping[str, Any], sections: Mapping[str, memoryview],
                  dtype: np.dtype) -> Iterator[np.ndarray]:
    """:func:`decode_clusters`'s values a piece at a time (``Codec.decode_parts``): a dithered
    group's and rANS-coded IDs' decoding passes; packed IDs, and lane-coded IDs decoded to their
    symbols (n x w bits: 1-2 bytes an ID at most), unpacked and looked up ``PART`` at a time."""
    if params.get("rounding") == "dithered":
        yield from dithered.decode_parts(n, params, sections, dtype)
        return
    cent, width, payload = _cluster_sections(n, params, sections)
    k = cent.size
    if width is None:
        yield from _rans_parts(payload, n, cent, dtype)
        return
    if width == "lanes":
        payload, width = lanes.decode_symbols(payload, n, k)
        if width == lanes.WIDE:  # one symbol per ID, from a table of k symbols: ids < k
            for a in range(0, n, PART):
                yield quantize.dequantize(payload[a: a + PART], cent, dtype, check=False)
            return
    table = cent.astype(dtype)
    for a in range(0, n, PART):  # PART: a multiple of 8, so every piece starts on a whole byte
        b = min(a + PART, n)
        yield parallel.unpack_take(payload[a * width // 8: bitpack.packed_size(b, width)], width, b - a, table,
                                   lambda top: FormatError(f"cluster id {top} out of range for {k} centroids"))


def cluster_accumulator(n: int, params: Mapping[str, Any], sections: Mapping[str, memoryview],
                        dtype: np.dtype) -> Callable[[np.ndarray, float], None]:
    """:meth:`Codec.accumulator` of a mucsc group without the decoded vector: the sections are read
    and checked as :func:`decode_clusters` checks them (IDs < k included), then ``add`` looks the IDs
    up in the centroids (as ``dtype``, then float64) times the weight, chunk by chunk into a small
    buffer added to ``acc``: the same sums as adding the decode.  The IDs stay as they came (packed
    bits, or rANS-decoded symbols of 1-2 bytes).  A dithered group has no centroids: decoded."""
    if params.get("rounding") == "dithered":
        x = dithered.decode(n, params, sections, dtype)
        return lambda acc, weight: add_scaled(acc, weight, x)
    cent, width, payload = _cluster_sections(n, params, sections)
    k = cent.size
    values = cent.astype(dtype).astype(np.float64)
    if width == "lanes":
        sym, w = lanes.decode_symbols(payload, n, k)
        if w == lanes.WIDE:  # one symbol per ID, from a table of k symbols: ids < k
            return lambda acc, weight: _add_taken(acc, values * np.float64(weight), sym)
        width, payload = w, sym
    elif width is None:  # rANS: every ID comes from a table of k symbols, so ids < k
        ids = rans.decode(payload, n, k)
        return lambda acc, weight: _add_taken(acc, values * np.float64(weight), ids)
    if n == 0:
        return lambda acc, weight: None
    bitpack.check_packed(payload, width, n)
    packed = np.frombuffer(payload, np.uint8)
    if (1 << width) > k:  # IDs >= k can be written: checked before anything is added
        _check_ids(packed, width, n, k)
    return lambda acc, weight: parallel.unpack_add(packed, width, n, values * np.float64(weight), acc)


def _check_ids(packed: np.ndarray, width: int, n: int, k: int) -> None:
    """FormatError unless every packed ID is < k (checked padding bits are zero: IDs 0)."""
    if 8 % width == 0:  # whole bytes: a byte is bad when one of the 8 / width IDs it holds is
        ids = (np.arange(256)[:, None] >> (np.arange(8 // width) * width)) & ((1 << width) - 1)
        if not (ids >= k).any(axis=1)[packed].any():
            return
    for s, e in _chunks(n):
        top = int(bitpack.unpack(packed[s * width // 8: bitpack.packed_size(e, width)], width, e - s).max())
        if top >= k:
            raise FormatError(f"cluster id {top} out of range for {k} centroids")


def _chunks(n: int) -> list[tuple[int, int]]:
    return [(s, min(s + ACCUMULATE_CHUNK, n)) for s in range(0, n, ACCUMULATE_CHUNK)]


def _add_taken(acc: np.ndarray, table: np.ndarray, ids: np.ndarray) -> None:
    """``acc += table[ids]`` chunk by chunk (``ids`` < len(table), checked by their decoder)."""
    buf = np.empty(min(ACCUMULATE_CHUNK, ids.size), np.float64)
    for s, e in _chunks(ids.size):
        t = buf[: e - s]
        np.take(table, ids[s:e], out=t, mode="clip")
        np.add(acc[s:e], t, out=acc[s:e])


def _decode_rans(payload: memoryview, n: int, cent: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """The values of an IDSA payload (format 1.1): its lengths checked against n before the output
    is allocated (:class:`rans.Lanes`), then each ID looked up as it is decoded
    (:meth:`rans.Lanes.take_values`: no ID array; the numpy path ``VALUES_CHUNK`` IDs at a time)."""
    ids = rans.Lanes(payload, n, cent.size)
    out = np.empty(n, dtype)
    ids.take_values(np.ascontiguousarray(cent.astype(dtype)), out)  # the values as the IDs are decoded
    ids.finish()
    return out


RANS_CHUNK = 1 << 18  # values per piece of :func:`_rans_parts`


def _rans_parts(payload: memoryview, n: int, cent: np.ndarray, dtype: np.dtype) -> Iterator[np.ndarray]:
    """:func:`_decode_rans`'s values ``RANS_CHUNK`` at a time into one reused buffer, so the scratch
    stays fixed; the stream finished after the last piece."""
    ids = rans.Lanes(payload, n, cent.size)
    table = np.ascontiguousarray(cent.astype(dtype))
    buf = np.empty(min(RANS_CHUNK, n), dtype)
    for a in range(0, n, RANS_CHUNK):
        piece = buf[: min(RANS_CHUNK, n - a)]
        ids.take_values(table, piece)
        yield piece
    ids.finish()


def decode_clusters_on_device(n: int, params: Mapping[str, Any], sections: Mapping[str, memoryview],
                              dtype: np.dtype, device) -> Any:
    """:func:`decode_clusters` with the unpacking and the gather on ``device`` (its backend's steps);
    rANS-coded IDs are decoded on the host (the coder is sequential) and moved there; so is a
    dithered group (its bytes are rANS-coded too)."""
    be = backend_on(device)
    if params.get("rounding") == "dithered":
        return be.from_host(dithered.decode(n, params, sections, dtype), device)
    cent, width, payload = _cluster_sections(n, params, sections)
    if width is None:  # the coder is sequential: decoded on the host in passes, the values moved there
        return be.from_host(_decode_rans(payload, n, cent, dtype), device)
    if width == "lanes":  # decoded on the device, then unpacked there
        return be.gather(cent.astype(dtype), be.lane_decode_ids(payload, n, cent.size, device))
    bitpack.check_packed(payload, width, n)
    ids = be.unpack(payload, width, n, device)
    if cent.size and width and n and int(ids.max()) >= cent.size:
        raise FormatError(f"cluster id {int(ids.max())} out of range for {cent.size} centroids")
    return be.gather(cent.astype(dtype), ids)


def _cluster_sections(n: int, params: Mapping[str, Any], sections: Mapping[str, memoryview],
                      stream: bool = False):
    """The validated (centroids, id width, IDS_ payload) of an untrusted mucsc header; the width is
    None and the payload IDSA's for rANS-coded IDs (format 1.1), "lanes" and IDSL's for lane-coded ones
    (format 1.2).  ``stream``: the IDS_ payload may
    come as a progressive decompressor (``base.section_stream``, for ``parallel.unpack_take``)."""
    cdtype = param_str(params, "centroid_dtype", tuple(CENTROID_DTYPES))
    k = param_int(params, "centroids", 0, MAX_Z)
    if (k == 0) != (n == 0):
        raise FormatError(f"{k} centroids for {n} elements")
    cent = array_from(section(sections, "CENT", k * np.dtype(CENTROID_DTYPES[cdtype]).itemsize),
                      CENTROID_DTYPES[cdtype], k)
    if k and not (np.all(np.isfinite(cent)) and np.all(cent[1:] > cent[:-1])):
        raise FormatError("centroids must be finite and strictly increasing")
    rounding = params.get("rounding", "stochastic")
    if rounding not in ("stochastic", "nearest"):
        raise FormatError(f"header parameter 'rounding' must be 'stochastic' or 'nearest' with centroids, "
                          f"got {rounding!r}")
    coding = params.get("id_coding", "packed")
    if coding == "rans":
        if k <= 1:
            raise FormatError("id_coding 'rans' needs at least 2 centroids")
        return cent, None, section(sections, "IDSA")
    if coding == "lanes":
        if k <= 1:
            raise FormatError("id_coding 'lanes' needs at least 2 centroids")
        return cent, "lanes", section(sections, "IDSL")
    if coding != "packed":
        raise FormatError(f"header parameter 'id_coding' must be 'packed', 'rans' or 'lanes', got {coding!r}")
    width = param_int(params, "id_bits", 0, bitpack.MAX_WIDTH)
    if (width == 0) != (k <= 1) or width < id_width(k):
        raise FormatError(f"id_bits {width} cannot address {k} centroids")
    fetch = section_stream if stream else section
    return cent, width, fetch(sections, "IDS_", bitpack.packed_size(n, width))


@dataclasses.dataclass(frozen=True)
class Rounded:
    """One trial rounding: the wire centroids, the IDs (a device rounding, or an array) and J (a
    number, None, or a callable computing it)."""

    wire: np.ndarray
    ids: Any
    J: Any


class ClusterTrials:
    """Trial encodings of one vector's clustering, measured by rate control (the measuring protocol:
    :mod:`mucsc.codec.ratecontrol.search` decides what to try).  ``p``: the codec's clustering
    parameters; each trial fixes Z (J-optimal levels) or gives the levels, and the ID coding.  The
    bounds and the solver's sorted data of ``x`` are computed once for every trial."""

    def __init__(self, x: np.ndarray, p: GoalTarget):
        self.x, self.p = x, p
        self._cache: dict = {}

    def fixed(self, z: int) -> Any:
        """The parameters of one trial: Z fixed, no goal."""
        return dataclasses.replace(self.p, z=z, bits=None, max_error=None, size=None)

    def round(self, z: int, levels: np.ndarray | None, rng: np.random.Generator) -> Rounded:
        """Levels (solved for ``z`` unless given) and eq. 7's rounding to them."""
        return Rounded(*round_clusters(self.x, self.fixed(z), rng, levels, self._cache))

    def message(self, r: Rounded, z: int, levels: np.ndarray | None, coding: str, levels_by: str,
                estimate: bool = True) -> tuple[dict, tuple, Any]:
        """(header params, sections, J) of one ID coding of a rounding; ``estimate``: rANS-coded IDs
        as a section of their estimated size (two codings of one rounding are what two encodes with
        the same generator give)."""
        return cluster_message(self.x, self.fixed(z), r.wire, r.ids, r.J, levels, coding, estimate, levels_by)

    def encode(self, z: int, levels: np.ndarray | None, coding: str, levels_by: str,
               rng: np.random.Generator) -> tuple[dict, tuple, Any]:
        """The exact encoding of one trial (what the resolved codec will write)."""
        return encode_clusters(self.x, self.fixed(z), rng, levels, coding, levels_by=levels_by, cache=self._cache)

