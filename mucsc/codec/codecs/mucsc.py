"""``mucsc``: Model Update Compression by Soft Clustering (paper section IV-A).

The vector is sent as Z sorted centroids (CENT) and one ceil(log2 Z)-bit cluster ID per element
(IDS_; 4 or 8 bits for 3- and 5..7-bit IDs when the section is zstd-compressed, see ``id_packing``).  Each element is rounded at random to one of its two neighbouring centroids with eq. 7's
probabilities, so decoding is unbiased; the centroids minimise the variance J of eq. 8-9.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from mucsc.codec import kernels, parallel
from mucsc.codec.backends import device_rounding, torch_backend
from mucsc.codec.numerics import allocate, centroids, ecsq, quantize
from mucsc.codec.wire import bitpack, rans
from mucsc.codec.wire import container as fmt
from mucsc.codec.codecs.base import (F32_MAX, H, Z_RANGE, Codec, EncodedGroup, PaperSetup, PlanContext, Section, array_from,
                              ceil_log2, param_int, param_str, register, section, section_stream)
from mucsc.errors import FormatError, ParameterError, SizeError

MIN_Z, MAX_Z = Z_RANGE
CENTROID_DTYPES = {"float16": "<f2", "float32": "<f4", "float64": "<f8"}
# the largest |x| each centroid dtype carries: float16/float32 their largest finite value (a float32
# step c[k+1] - c[k] beyond FLT_MAX makes FORMAT.md 4.3 round in float64); float64 a quarter of its
# largest, so that every c[k+1] - c[k] stays finite in float64
CENTROID_LIMITS = {"float16": 65504.0, "float32": F32_MAX, "float64": float(np.finfo(np.float64).max) / 4}


ID_PACKINGS = ("auto", "tight", "aligned")
ID_CODINGS = ("auto", "packed", "rans")
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
    sample = ids.sample(step) if isinstance(ids, device_rounding.Rounding) else ids[::step]
    if torch_backend.is_torch(sample):
        sample = sample.cpu().numpy()
    p = np.bincount(sample, minlength=k) / sample.size
    p = p[p > 0]
    entropy = float(-(p * np.log2(p)).sum())
    return ALIGNED_WIDTH[w] if entropy < w - ALIGN_MARGIN_BITS else w


TARGETS = ("z", "bits", "max_error", "size")
DEFAULT_Z = 16
# Numbers of centroids tried by the rate-controlled modes (bits=, size=, max_error=): every Z up to 8,
# then about 4 steps per doubling (J falls roughly like 1/Z^2, the ID entropy grows like log2 Z).
Z_LADDER = tuple(sorted({*range(2, 9), *(m << e for e in range(1, 14) for m in (4, 5, 6, 7) if m << e <= MAX_Z),
                         MAX_Z}))


class GoalTarget:
    """What mucsc's and bmucsc's parameters share about their goal fields (z / bits / max_error /
    size, at most one given): which one drives the choice, and Z in the fixed-Z mode."""

    default_z: ClassVar[int] = DEFAULT_Z

    @property
    def target(self) -> str:
        """Which of z / bits / max_error / size drives the choice ("z" when none was given)."""
        return next((t for t in TARGETS if getattr(self, t) is not None), "z")

    @property
    def fixed_z(self) -> int:
        """The number of centroids in the fixed-Z mode."""
        return self.default_z if self.z is None else self.z


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
    "packed" (IDS_, format 1.0), "rans" (IDSA, static rANS, format 1.1) or "auto" (packed for a fixed
    z, so those messages stay 1.0; with a goal, whichever option is best)."""

    z: int | None = None
    solver: str = "optimal"
    centroid_dtype: str = "float32"
    id_packing: str = "auto"
    bits: float | None = None
    max_error: float | None = None
    size: int | None = None
    id_coding: str = "auto"

    def __post_init__(self) -> None:
        given = [t for t in TARGETS if getattr(self, t) is not None]
        if len(given) > 1:
            raise ParameterError(f"give one of z, bits, max_error, size (they all choose the number of "
                                 f"centroids), got {', '.join(given)}")
        if self.z is not None and not MIN_Z <= self.z <= MAX_Z:
            raise ParameterError(f"z must be in {MIN_Z}..{MAX_Z}, got {self.z}")
        if self.bits is not None and not 0 < self.bits <= 64:
            raise ParameterError(f"bits (per element of the message) must be in (0, 64], got {self.bits}")
        if self.max_error is not None and not 0 < self.max_error < math.inf:
            raise ParameterError(f"max_error (relative error sqrt(J)/||x||) must be > 0, got {self.max_error}")
        if self.size is not None and self.size < 1:
            raise ParameterError(f"size (bytes of the message) must be >= 1, got {self.size}")
        if self.solver not in centroids.SOLVERS:
            raise ParameterError(f"unknown solver {self.solver!r}; choose from {', '.join(centroids.SOLVERS)}")
        if self.centroid_dtype not in CENTROID_DTYPES:
            raise ParameterError(f"centroid_dtype must be one of {', '.join(CENTROID_DTYPES)}")
        if self.id_packing not in ID_PACKINGS:
            raise ParameterError(f"id_packing must be one of {', '.join(ID_PACKINGS)}")
        if self.id_coding not in ID_CODINGS:
            raise ParameterError(f"id_coding must be one of {', '.join(ID_CODINGS)}")

def resolve_id_packing(codec: Codec, compressing: bool) -> Codec:
    """``for_container`` of codecs with an ``id_packing`` parameter: resolve "auto"."""
    if codec.params.id_packing != "auto":
        return codec
    packing = "aligned" if compressing else "tight"
    return type(codec)(**{**dataclasses.asdict(codec.params), "id_packing": packing})


def cluster_resolved(header: Mapping[str, Any]) -> dict[str, Any]:
    """What a clustering settled (``EncodedGroup.resolved``), from its header params: the z recorded
    and the ID coding used (an "auto" id_coding becomes "packed" or "rans")."""
    return {"z": header["z"], "id_coding": header.get("id_coding", "packed")}


def cluster_section_sizes(n: int, k: int, p: MucscParams, estimate: bool) -> dict[str, int]:
    """Raw bytes of CENT and IDS_ for ``n`` elements and ``k`` centroids sent, tight IDs.  An
    "aligned" packing widens 3- and 5..7-bit IDs when the data's entropy allows: data-dependent."""
    if p.id_coding == "rans" and not estimate:
        raise SizeError("id_coding='rans' (an entropy code of the IDs) has a data-dependent size")
    width = id_width(k)
    if p.id_packing == "aligned" and width in ALIGNED_WIDTH and not estimate:
        raise SizeError(f"id_packing='aligned' with {width}-bit IDs has a data-dependent size")
    return {"CENT": np.dtype(CENTROID_DTYPES[p.centroid_dtype]).itemsize * k,
            "IDS_": bitpack.packed_size(n, width)}


def paper_mucsc_bytes(d: int, z: int, h: int = H) -> float:
    """Bytes of one MUCSC transfer as the paper counts them: ceil(log2 Z)/8 d + h Z
    (eq. CompressionRateofMUCSC's per-direction term)."""
    return ceil_log2(z) / 8 * d + h * z


def encode_clusters(x: np.ndarray, p: MucscParams, rng: np.random.Generator,
                    levels: np.ndarray | None = None, coding: str | None = None,
                    estimate: bool = False, levels_by: str = "ecsq", cache: dict | None = None) -> tuple[dict, tuple, Any]:
    """Shared by ``mucsc`` and ``bmucsc``: (header params, (CENT, IDS_ or IDSA) sections, J as a
    callable).  ``levels``: use these levels instead of solving for ``p.fixed_z``; ``coding``:
    "packed" or "rans" (default: "rans" only when ``p.id_coding`` says so); ``estimate``: an IDSA
    section of zeros of the estimated coded size (rate control's search; never sent).

    ``x`` may be a torch tensor (on any device): then the torch backend encodes it where it lives,
    giving the same bytes (:mod:`mucsc.codec.backends.torch_backend`); so does ``MUCSC_BACKEND=torch``.
    Given ``levels`` (a goal's choice, planned on the host) the host path encodes it."""
    if levels is not None and torch_backend.is_torch(x):
        x = x.cpu().numpy()
    wire, ids, J = round_clusters(x, p, rng, levels, cache)
    return cluster_message(x, p, wire, ids, J, levels, coding, estimate, levels_by)


def round_clusters(x: np.ndarray, p: MucscParams, rng: np.random.Generator,
                   levels: np.ndarray | None = None, cache: dict | None = None) -> tuple[np.ndarray, Any, Any]:
    """The first half of :func:`encode_clusters`: (wire centroids, IDs, J or None) -- the levels
    (solved for ``p.fixed_z`` unless given) and the stochastic rounding, before any ID coding.
    ``cache``: kept by a caller that rounds the same ``x`` many times (a goal's search): its bounds
    and the solver's sorted data are computed once (centroids.solve's ``cache``)."""
    if levels is None and torch_backend.applies(x):
        return _cluster_on_torch(torch_backend.as_tensor(x), p, rng)
    if x.size == 0:
        return np.zeros(0, CENTROID_DTYPES[p.centroid_dtype]), np.zeros(0, np.uint8), 0.0
    if cache is not None and "bounds" in cache:
        bounds = cache["bounds"]
    else:
        bounds = parallel.bounds(x)  # once, not once per stage
        if cache is not None:
            cache["bounds"] = bounds
    c = centroids.solve(x, p.fixed_z, p.solver, rng, bounds=bounds, cache=cache) if levels is None else levels
    wire = quantize.wire_centroids(c, x, np.dtype(p.centroid_dtype), bounds=bounds)
    # The C kernel accumulates J (float64) in the rounding pass for ~5 ms per 1e7 elements; in
    # the numpy fallback that costs ~40% of the rounding, so there J is computed only on demand.
    if kernels.use_c():
        ids, J = quantize.stochastic_round(x, wire, rng, bounds=bounds, return_J=True)
    else:
        ids = quantize.stochastic_round(x, wire, rng, bounds=bounds)
        J = None
    return wire, ids, J


def cluster_message(x: np.ndarray, p: MucscParams, wire: np.ndarray, ids: Any, J: Any,
                    levels: np.ndarray | None = None, coding: str | None = None, estimate: bool = False,
                    levels_by: str = "ecsq") -> tuple[dict, tuple, Any]:
    """The second half of :func:`encode_clusters`: header params, sections and J for one ID coding
    of a rounding (two codings of one rounding are what two encodes with the same rng give)."""
    coding = coding or ("rans" if p.id_coding == "rans" else "packed")
    solver = p.solver if levels is None else levels_by  # informative: who chose the given levels
    k = int(wire.size)
    z = p.fixed_z if levels is None else max(MIN_Z, k)
    cent = Section("CENT", np.ascontiguousarray(wire, CENTROID_DTYPES[p.centroid_dtype]))
    if coding == "rans" and k > 1:  # format 1.1 (FORMAT.md 4.4); one centroid needs no IDs at all
        if isinstance(ids, device_rounding.Rounding):
            ids = ids.ids()
        if torch_backend.is_torch(ids):
            ids = ids.cpu().numpy()
        params = {"centroids": k, "centroid_dtype": p.centroid_dtype, "id_coding": "rans", "solver": solver,
                  "z": z}
        data = bytes(rans.estimated_size(ids, k)) if estimate else rans.encode(ids, k)
        sections = (cent, Section("IDSA", data))
    else:
        bits = packed_width(ids, k, p.id_packing)
        params = {"centroids": k, "centroid_dtype": p.centroid_dtype, "id_bits": bits, "solver": solver,
                  "z": z}
        if isinstance(ids, device_rounding.Rounding):  # rounded and packed on the device now
            packed = ids.packed(bits)
        elif torch_backend.is_torch(ids):
            packed = torch_backend.pack(ids, bits)
        else:
            packed = parallel.pack(ids, bits)
        sections = (cent, Section("IDS_", packed, compressible=True))

    def exact_J() -> float:  # eq. 8-9, with the wire centroids the decoder sees
        if callable(J):
            return float(J())
        if J is not None:
            return float(J)
        return float(centroids.variance_J(x, np.asarray(wire, np.float64)))

    return params, sections, exact_J


def _cluster_on_torch(x, p: MucscParams, rng: np.random.Generator):
    """(wire centroids, ids, J) of a torch tensor, byte-identical to the host path: the solver reads
    a small summary from the device, the rounding runs there (ids: a ``device_rounding.Rounding``, done
    on the device when the message is written: fused with the packing where the Triton kernel runs)."""
    dtype = np.dtype(CENTROID_DTYPES[p.centroid_dtype])
    if x.numel() == 0:
        return np.zeros(0, dtype), np.zeros(0, np.uint8), 0.0
    src = torch_backend.TorchSource(x)
    bounds = src.bounds()
    c = centroids.solve(src, p.fixed_z, p.solver, rng, bounds=bounds)
    wire = quantize.wire_centroids(c, None, dtype, bounds=bounds)
    if wire.size == 1:  # one level: every id is 0 and the rounding step draws nothing
        return wire, np.zeros(x.numel(), np.uint8), 0.0
    if not torch_backend.round_supported(x, wire):  # a level gap beyond the working precision
        return (wire, *quantize.stochastic_round(x.cpu().numpy(), wire, rng, bounds=bounds, return_J=True))
    ids = device_rounding.Rounding(x, wire, quantize.draw_key(rng))
    return wire, ids, lambda: torch_backend.variance_J(x, wire)  # a separate pass, only when asked


def format_minor(params: Mapping[str, Any]) -> int:
    """The format minor version a group with these header params needs (1 for rANS-coded IDs)."""
    return 1 if params.get("id_coding") == "rans" else 0


def decode_clusters(n: int, params: Mapping[str, Any], sections: Mapping[str, memoryview],
                    dtype: np.dtype) -> np.ndarray:
    """Inverse of :func:`encode_clusters`, validating the untrusted header and sections."""
    cent, width, payload = _cluster_sections(n, params, sections, stream=True)
    k = cent.size
    if width is None:  # format 1.1: every ID comes from a table of k symbols, so ids < k
        ids = rans.decode(payload, n, k)
        return quantize.dequantize(ids, cent, dtype, check=False) if n else np.zeros(0, dtype)
    if n == 0:
        return np.zeros(0, dtype)
    # fixed-width IDs (length checked): unpacked chunk by chunk on parallel.current() threads, each
    # checked against k
    return parallel.unpack_take(payload, width, n, cent.astype(dtype),
                                lambda top: FormatError(f"cluster id {top} out of range for {k} centroids"))


def decode_clusters_torch(n: int, params: Mapping[str, Any], sections: Mapping[str, memoryview],
                          dtype: np.dtype, device) -> Any:
    """:func:`decode_clusters` with the unpacking and the gather on ``device`` (a torch tensor);
    rANS-coded IDs are decoded on the host (the coder is sequential) and moved there."""
    cent, width, payload = _cluster_sections(n, params, sections)
    if width is None:
        torch = torch_backend._torch()
        ids = torch.from_numpy(rans.decode(payload, n, cent.size).astype(np.int64)).to(device)
        return torch_backend.gather(cent.astype(dtype), ids)
    bitpack.check_packed(payload, width, n)
    ids = torch_backend.unpack(payload, width, n, device)
    if cent.size and width and n and int(ids.max()) >= cent.size:
        raise FormatError(f"cluster id {int(ids.max())} out of range for {cent.size} centroids")
    return torch_backend.gather(cent.astype(dtype), ids)


def _cluster_sections(n: int, params: Mapping[str, Any], sections: Mapping[str, memoryview],
                      stream: bool = False):
    """The validated (centroids, id width, IDS_ payload) of an untrusted mucsc header; the width is
    None and the payload IDSA's for rANS-coded IDs (format 1.1).  ``stream``: the IDS_ payload may
    come as a progressive decompressor (``base.section_stream``, for ``parallel.unpack_take``)."""
    cdtype = param_str(params, "centroid_dtype", tuple(CENTROID_DTYPES))
    k = param_int(params, "centroids", 0, MAX_Z)
    if (k == 0) != (n == 0):
        raise FormatError(f"{k} centroids for {n} elements")
    cent = array_from(section(sections, "CENT", k * np.dtype(CENTROID_DTYPES[cdtype]).itemsize),
                      CENTROID_DTYPES[cdtype], k)
    if k and not (np.all(np.isfinite(cent)) and np.all(cent[1:] > cent[:-1])):
        raise FormatError("centroids must be finite and strictly increasing")
    coding = params.get("id_coding", "packed")
    if coding == "rans":
        if k <= 1:
            raise FormatError("id_coding 'rans' needs at least 2 centroids")
        return cent, None, section(sections, "IDSA")
    if coding != "packed":
        raise FormatError(f"header parameter 'id_coding' must be 'packed' or 'rans', got {coding!r}")
    width = param_int(params, "id_bits", 0, bitpack.MAX_WIDTH)
    if (width == 0) != (k <= 1) or width < id_width(k):
        raise FormatError(f"id_bits {width} cannot address {k} centroids")
    fetch = section_stream if stream else section
    return cent, width, fetch(sections, "IDS_", bitpack.packed_size(n, width))


def group_bytes(sections: Sequence[Section], zstd_level: int | None) -> int:
    """What a group's sections add to a message, stored as the container stores them."""
    return sum(fmt.section_bytes(s.tobytes(), s.compressible, zstd_level) for s in sections)


# Lagrange multipliers tried by the goals, as mu = lambda * d / ||x||^2 (J per bit, relative to the
# mean square): from ~0.05 bits per element (mu = 1e4) to ~8 bits (mu = 1e-5).
MU_GRID = tuple(float(v) for v in 10.0 ** np.linspace(4, -5, 28))
REFINE_STEPS = 6  # bisection steps on mu between the two grid points around a single group's goal
# The grid sweep solves over this many interior candidates (the DP is cubic in them); the
# bisection around the goal over ecsq.INTERIOR_CANDIDATES.
SWEEP_CANDIDATES = 96


# at most 2^15.5 steps: with the two ends, fewer levels than the format's limit of 65536 centroids
UNIFORM_STEPS = tuple(int(v) for v in np.unique(np.round(2.0 ** np.arange(2, 15.51, 0.5))))


def uniform_levels(lo: float, hi: float, steps: int) -> np.ndarray:
    """Levels k * delta, delta = (hi - lo) / steps, for the k that bracket [lo, hi] (0 is a level)."""
    delta = (hi - lo) / steps
    k = np.arange(math.floor(lo / delta), math.ceil(hi / delta) + 1)
    return k * delta


@dataclasses.dataclass(frozen=True)
class Choice:
    """How one group is encoded under a goal: J-optimal levels for ``z``, or the entropy-constrained
    ``levels`` (ecsq); the IDs ``coding``; the header params it produces (an option key)."""

    z: int
    levels: tuple[float, ...] | None
    coding: str
    mu: float | None
    params: tuple
    steps: int | None = None  # uniform levels: this many steps of the data's span, a level at 0


class _Group:
    """One group's options under a goal: encodings measured exactly (bytes as stored, J)."""

    def __init__(self, x: np.ndarray, p: MucscParams, rng: Callable[[], np.random.Generator],
                 zstd_level: int | None):
        self.x, self.p, self.rng, self.level = x, p, rng, zstd_level
        self.norm2 = float(np.dot(x, x.astype(np.float64))) if x.size else 0.0
        self._prepared: dict[int, ecsq.Prepared] = {}
        self.lo, self.hi = (float(x.min()), float(x.max())) if x.size else (0.0, 0.0)
        self.options: list[allocate.Option] = []
        self._stash: dict[tuple[int, str], allocate.Option] = {}  # (Z, ID coding) -> measured, not yet asked
        self._solve_cache: dict = {}  # bounds and the solver's sorted data of x (round_clusters)

    def measure(self, choice_z: int | None = None, mu: float | None = None, coding: str = "packed",
                fine: bool = False, steps: int | None = None) -> allocate.Option:
        """Encode with Z-ladder levels (``choice_z``), ecsq levels for ``mu`` (over the coarse
        candidate set, or the fine one) or ``steps`` uniform steps; record the option."""
        p = dataclasses.replace(self.p, z=choice_z or MIN_Z, bits=None, max_error=None, size=None)
        levels = None if steps is None else uniform_levels(self.lo, self.hi, steps)
        if mu is not None:
            m = ecsq.INTERIOR_CANDIDATES if fine else SWEEP_CANDIDATES
            if m not in self._prepared:
                self._prepared[m] = ecsq.prepare(self.x, m)
            lam = mu * self.norm2 / max(self.x.size, 1)
            levels = ecsq.solve(self._prepared[m], lam, 8.0 * np.dtype(CENTROID_DTYPES[p.centroid_dtype]).itemsize
                                + 16.0)[0]
        ladder = levels is None  # J-optimal levels for a Z: measured with both ID codings (sweep)
        if ladder and (p.fixed_z, coding) in self._stash:
            o = self._stash.pop((p.fixed_z, coding))
            self.options.append(o)
            return o
        by = "ecsq" if steps is None else "uniform"
        wire, ids, J = round_clusters(self.x, p, self.rng(), levels, self._solve_cache)
        o = self._option(p, wire, ids, J, levels, coding, mu, steps, by)
        if ladder and coding == "packed" and self.p.id_coding == "auto":
            # The sweep's rANS pass measures this Z again, from a fresh copy of the same generator:
            # the same levels and rounding, so the same option -- coded from these IDs now instead
            # of solving and rounding again (and recorded when the sweep asks for it).
            self._stash[(p.fixed_z, "rans")] = self._option(p, wire, ids, o.J, levels, "rans", mu, steps, by)
        self.options.append(o)
        return o

    def _option(self, p: MucscParams, wire, ids, J, levels, coding: str, mu, steps, by: str) -> allocate.Option:
        params, sections, J = cluster_message(self.x, p, wire, ids, J, levels, coding, estimate=True, levels_by=by)
        key = Choice(params["z"], None if levels is None else tuple(map(float, levels)), coding, mu,
                     tuple(sorted(params.items())), steps)
        return allocate.Option(group_bytes(sections, self.level), float(J()), key)

    def exact(self, o: allocate.Option) -> allocate.Option:
        """``o`` with its exact size (rANS-coded IDs are searched with an estimate)."""
        if o.key.coding != "rans":
            return o
        p = dataclasses.replace(self.p, z=o.key.z, bits=None, max_error=None, size=None)
        levels = None if o.key.levels is None else np.array(o.key.levels)
        _, sections, _ = encode_clusters(self.x, p, self.rng(), levels, "rans",
                                         levels_by="ecsq" if o.key.steps is None else "uniform",
                                         cache=self._solve_cache)
        return dataclasses.replace(o, bytes=group_bytes(sections, self.level))

    def unreachable(self, max_error: float) -> str:
        """The error message when no option meets ``max_error``."""
        best = min(self.options, key=lambda o: o.J)
        return (f"max_error={max_error:g} is out of reach: the best relative error is "
                f"{allocate.relative_error(best.J, self.norm2):.3g} (Z = {best.key.z})")

    def floor_note(self, o: allocate.Option) -> str:
        """What the smallest message is made of, beyond the framing (nothing to add for mucsc)."""
        return ""

    def sweep(self, stop: Callable[[allocate.Option], bool], goal: str = "budget") -> None:
        """The Z ladder (packed IDs, unless id_coding="rans") and the mu grid (rANS-coded IDs, unless
        id_coding="packed"), each from the fewest bits up until ``stop``."""
        p = self.p
        if self.x.size == 0 or self.x.min() == self.x.max():
            self.measure(MIN_Z)
            return
        # J-optimal levels: packed IDs (a 1.0 message) and, unless restricted, rANS-coded IDs (at
        # high rates entropy-coded J-optimal levels are close to the ecsq ones and cheaper to find)
        for coding in {"auto": ("packed", "rans"), "packed": ("packed",), "rans": ("rans",)}[p.id_coding]:
            for z in Z_LADDER:
                o = self.measure(z, coding=coding)
                if stop(o) or dict(o.key.params)["centroids"] < z or o.J == 0.0:
                    break
        if p.id_coding != "packed":
            for mu in MU_GRID:
                o = self.measure(mu=mu, coding="rans")
                if stop(o) or o.J == 0.0:
                    break
            # uniform levels (a level at 0) with rANS-coded IDs: near-optimal at high rates
            # (Gish-Pierce), where the candidate sets of ecsq get too coarse for many levels
            for steps in UNIFORM_STEPS:
                o = self.measure(steps=steps, coding="rans")
                if stop(o) or o.J == 0.0:
                    break

    def refine(self, best: allocate.Option, ok: Callable[[allocate.Option], bool],
               better: Callable[[allocate.Option, allocate.Option], bool]) -> allocate.Option:
        """Bisect mu (fine candidates) between the two neighbouring grid points where ``ok`` changes
        (the goal lies between them); returns the best option (``better(a, b)``: a preferred)."""
        grid = sorted((o for o in self.options if o.key.mu in MU_GRID), key=lambda o: -o.key.mu)
        pair = next(((a, b) for a, b in zip(grid, grid[1:]) if ok(a) != ok(b)), None)
        if pair is not None:
            good, bad = (pair[0].key.mu, pair[1].key.mu) if ok(pair[0]) else (pair[1].key.mu, pair[0].key.mu)
        elif grid and ok(grid[-1]):
            # every grid point is ok (a byte budget the coarse solver cannot fill): walk on with
            # the fine solver towards more bits until a point is not ok, then bisect
            good, bad = grid[-1].key.mu, None
            for mu in MU_GRID[MU_GRID.index(good):]:
                o = self.measure(mu=mu, coding="rans", fine=True)
                if not ok(o):
                    bad = mu
                    break
                good = mu
                if better(o, best):
                    best = o
            if bad is None:
                return best
        else:
            return best
        return _bisect(good, bad, REFINE_STEPS, lambda g, b: math.sqrt(g * b),
                       lambda mu: self.measure(mu=mu, coding="rans", fine=True), ok, better, best)


    def refine_z(self, best: allocate.Option, ok: Callable[[allocate.Option], bool],
                 better: Callable[[allocate.Option, allocate.Option], bool]) -> allocate.Option:
        """Bisect Z (J-optimal levels, rANS-coded IDs) and the number of uniform steps between the
        two points of their ladders where ``ok`` changes: at high rates the ladders' steps are
        coarser than a budget."""
        for knob in ("z", "steps"):
            if knob == "z":
                pts = [o for o in self.options if o.key.mu is None and o.key.steps is None and o.key.coding == "rans"]
            else:
                pts = [o for o in self.options if o.key.steps is not None]
            pts.sort(key=lambda o: getattr(o.key, knob))
            pair = next(((a, b) for a, b in zip(pts, pts[1:]) if ok(a) != ok(b)), None)
            if pair is None:
                continue
            a, b = getattr(pair[0].key, knob), getattr(pair[1].key, knob)
            good, bad = (a, b) if ok(pair[0]) else (b, a)
            measure = ((lambda m: self.measure(m, coding="rans")) if knob == "z"
                       else (lambda m: self.measure(steps=m, coding="rans")))
            best = _bisect(good, bad, 12, lambda g, b: None if abs(g - b) <= 1 else (g + b) // 2,
                           measure, ok, better, best)
        return best


def _bisect(good, bad, steps: int, midpoint: Callable, measure: Callable[[Any], allocate.Option],
            ok: Callable[[allocate.Option], bool],
            better: Callable[[allocate.Option, allocate.Option], bool],
            best: allocate.Option) -> allocate.Option:
    """Up to ``steps`` bisections between a setting that meets the goal (``good``) and one that does
    not (``bad``); ``midpoint`` returns None when the two are adjacent.  Returns the best option seen."""
    for _ in range(steps):
        mid = midpoint(good, bad)
        if mid is None:
            break
        o = measure(mid)
        if ok(o):
            good = mid
            if better(o, best):
                best = o
        else:
            bad = mid
    return best


@register
class Mucsc(Codec):
    """MUCSC: Z centroids minimising J, unbiased stochastic rounding, fixed-width cluster IDs."""

    name = "mucsc"
    unbiased = True
    accepts_torch = True
    summary = "soft clustering to z centroids, unbiased; ceil(log2 z) bits per element"
    Params = MucscParams
    limits = {"z": Z_RANGE}
    # section VI-A: both directions; the clients' Z_U (mixed by thirds) and the server's Z_D
    paper_setup = PaperSetup(z_param="z")

    def section_sizes(self, n: int, *, positions_bytes: int | None = None, centroids: int | None = None,
                      estimate: bool = False) -> dict[str, int]:
        """``centroids`` sent default to min(z, n), exact for continuous data (ties merge levels)."""
        if self.params.target != "z" and centroids is None:
            raise SizeError(f"mucsc with {self.params.target}= chooses Z from the data: pass centroids")
        k = min(self.params.fixed_z, n) if centroids is None else centroids
        return cluster_section_sizes(n, k, self.params, estimate)

    def paper_bytes(self, d: int, h: int = H) -> float | None:
        """eq. CompressionRateofMUCSC's per-direction bytes for a fixed Z (None when bits=, size= or
        max_error= choose Z from the data)."""
        return paper_mucsc_bytes(d, self.params.fixed_z, h) if self.params.target == "z" else None

    def for_container(self, compressing: bool) -> Codec:
        return resolve_id_packing(self, compressing)

    @property
    def needs_plan(self) -> bool:
        return self.params.target != "z"

    @classmethod
    def format_minor(cls, params: Mapping[str, Any]) -> int:
        return format_minor(params)

    @classmethod
    def with_preset(cls, preset: Mapping[str, Any], given: Mapping[str, Any]) -> dict[str, Any]:
        """A goal the user gave (z, bits, max_error or size) replaces the preset's."""
        if any(t in given for t in TARGETS):
            preset = {k: v for k, v in preset.items() if k not in TARGETS}
        return {**preset, **given}

    def resolved(self, choice: Choice) -> "Mucsc":
        """This codec fixed to one choice (what a goal resolves to for one group)."""
        c = type(self)(**{**dataclasses.asdict(self.params), "z": choice.z, "bits": None, "max_error": None,
                          "size": None, "id_coding": "rans" if choice.coding == "rans" else "packed"})
        c._levels = None if choice.levels is None else np.array(choice.levels)
        c._levels_by = "ecsq" if choice.steps is None else "uniform"
        return c

    _levels: np.ndarray | None = None
    _levels_by = "ecsq"

    def plan(self, xs: Sequence[np.ndarray], ctx: PlanContext) -> list[Codec] | None:
        """Resolve bits= / size= (one byte budget split across the groups to minimise total J, see
        mucsc.codec.numerics.allocate) and max_error= (per group, the smallest message meeting the bound) to
        one fixed encoding per group: J-optimal levels for a Z of the ladder, or entropy-constrained
        levels (mucsc.codec.numerics.ecsq) with rANS-coded IDs, whichever does better."""
        if self.params.target == "z":
            return None
        groups = [_Group(x, self.params, (lambda i=i: ctx.rngs(i)), ctx.zstd_level) for i, x in enumerate(xs)]
        return plan_goal(self, groups, ctx)

    @property
    def input_limit(self) -> float:
        return CENTROID_LIMITS[self.params.centroid_dtype]

    def encode_array(self, x: np.ndarray, rng: np.random.Generator) -> EncodedGroup:
        codec = self
        if self.params.target != "z":  # called directly (not through the API): budget = this group
            codec, x, rng = plan_alone(self, x, rng)
        params, sections, J = encode_clusters(x, codec.params, rng, codec._levels, levels_by=codec._levels_by)
        return EncodedGroup(params, sections, {"J": J}, cluster_resolved(params))

    @classmethod
    def decode_array(cls, n: int, params: Mapping[str, Any], sections: Mapping[str, memoryview],
                     dtype: np.dtype) -> np.ndarray:
        return decode_clusters(n, params, sections, dtype)

    @classmethod
    def decode_torch(cls, n: int, params: Mapping[str, Any], sections: Mapping[str, memoryview],
                     dtype: np.dtype, device) -> Any:
        return decode_clusters_torch(n, params, sections, dtype, device)



def plan_goal(codec: Codec, groups: Sequence[Any], ctx: PlanContext) -> list[Codec]:
    """The goal search shared by ``mucsc`` and ``bmucsc``: one fixed codec per group
    (``codec.resolved(option.key)``) for ``codec.params``' bits= / size= / max_error=.

    ``groups`` measure their options (:class:`_Group` for mucsc; bmucsc's adds positions and the
    rest's mean): ``options``, ``norm2``, ``sweep(stop, goal)``, ``refine``, ``refine_z``,
    ``exact``, ``unreachable(max_error)`` (the error message) and ``floor_note(option)`` (what the
    smallest message is made of, appended to the "below the smallest" error)."""
    p = codec.params
    if p.target == "max_error":
        out = []
        for g in groups:
            meets = lambda o, g=g: allocate.relative_error(o.J, g.norm2) <= p.max_error  # noqa: E731
            g.sweep(meets, "error")
            best = allocate.cheapest_within(g.options, g.norm2, p.max_error)
            if best is None:
                raise ParameterError(g.unreachable(p.max_error))
            cheaper = lambda a, b: (a.bytes, a.J) < (b.bytes, b.J)  # noqa: E731
            best = g.refine_z(g.refine(best, meets, cheaper), meets, cheaper)
            out.append(codec.resolved(best.key))
        return out
    total = p.size if p.target == "size" else math.floor(p.bits * ctx.elements / 8)
    what = f"size={p.size}" if p.target == "size" else f"bits={p.bits:g}"
    for g in groups:
        g.sweep(lambda o: o.bytes > total - ctx.fixed_bytes, "budget")

    def cost(chosen: list[allocate.Option]) -> int:  # the exact message size
        return (ctx.fixed_bytes + ctx.head_bytes([dict(o.key.params) for o in chosen])
                + sum(o.bytes for o in chosen))

    def too_small(chosen: list[allocate.Option], size: int) -> ParameterError:
        note = "".join(g.floor_note(o) for g, o in zip(groups, chosen))
        return ParameterError(f"{what} is below the smallest {codec.name} message for this input: {size} "
                              f"bytes ({8 * size / max(ctx.elements, 1):.3g} bits per element){note}")

    def split(total: int) -> list[allocate.Option]:
        curves = [g.options for g in groups]
        cheapest = [min(c, key=lambda o: (o.bytes, o.J)) for c in curves]
        least = cost(cheapest)
        if least > total:
            raise too_small(cheapest, least)
        # HEAD's size depends on the params chosen (and is zstd'd): split what is left after the
        # HEAD of the last choice, check the exact size, and retry with the difference.
        best, tried = cheapest, set()
        budget = total - (least - sum(o.bytes for o in cheapest))
        while budget not in tried and len(tried) < 8:
            tried.add(budget)
            try:
                chosen = allocate.split_budget(curves, budget)
            except ParameterError:
                break
            size = cost(chosen)
            if size <= total and sum(o.J for o in chosen) < sum(o.J for o in best):
                best = chosen
            budget += total - size
            if size > total:  # the HEAD of this choice is larger: make the next split choose less
                budget = min(budget, sum(o.bytes for o in chosen) - 1)
        return best

    best = split(total)
    if len(groups) == 1:  # squeeze the last bytes: mu between the grid points around the budget
        g = groups[0]
        fits = lambda o: cost([o]) <= total  # noqa: E731
        g.refine(best[0], fits, lambda a, b: a.J < b.J)
        g.refine_z(best[0], fits, lambda a, b: a.J < b.J)
        best = split(total)
    # The search used estimated rANS sizes: check the exact size, and shrink the budget by the
    # overshoot until the exact message fits (the cheapest options always fit: checked below).
    goal = total
    for _ in range(8):
        exact = [g.exact(o) for g, o in zip(groups, best)]
        size = cost(exact)
        if size <= total:
            return [codec.resolved(o.key) for o in best]
        goal -= size - total
        best = split(goal)
    exact = [g.exact(min(g.options, key=lambda o: (o.bytes, o.J))) for g in groups]
    if cost(exact) > total:
        raise too_small(exact, cost(exact))
    return [codec.resolved(o.key) for o in exact]


def plan_alone(codec: Codec, x: Any, rng: np.random.Generator) -> tuple[Codec, np.ndarray, np.random.Generator]:
    """A goal codec's ``encode_array`` called directly (not through the API, which plans a whole
    message): plan ``x`` as a message of its own -> (the planned codec, x on the host, where
    planning runs, and a generator in ``rng``'s state, so the encode draws what the plan drew)."""
    level = None if codec.params.id_packing == "tight" else fmt.DEFAULT_ZSTD_LEVEL
    state = rng.bit_generator.state
    fresh = lambda: _restored(rng, state)  # noqa: E731
    host = x.cpu().numpy() if torch_backend.is_torch(x) else x
    (planned,) = codec.plan([host], PlanContext(level, host.size, 0, lambda i: fresh(), lambda params: 0))
    return planned, host, fresh()


def _restored(rng: np.random.Generator, state: dict) -> np.random.Generator:
    """A new generator of ``rng``'s kind in the given state (a replay of the same draws)."""
    g = np.random.Generator(type(rng.bit_generator)())
    g.bit_generator.state = state
    return g
