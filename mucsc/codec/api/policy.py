"""Grouping policy: which tensors share a codebook, which get their own, which are carried losslessly.

The paper compresses a model *update* as one flattened vector with one codebook (``shared=True`` in
:func:`mucsc.encode`).  Applied to a whole checkpoint that destroys small tensors (a bias next to a
large weight matrix gets the matrix's codebook spacing) and turns all-zero tensors into noise.  The
:class:`Policy` here is the checkpoint-grade alternative:

1. every float tensor large enough to gain from coding gets its own codebook (its own group);
   with a ``max_error`` target, the codec's own error-targeting mode picks each tensor's levels
   (mucsc: the cheapest meeting the bound, mucsc.codec.ratecontrol) and the policy checks the *measured*
   error ||decode - x|| / ||x|| of the result (:func:`encode_within`); a message-wide budget
   (mucsc's ``bits=`` / ``size=``) is split across the coded tensors by the API;
2. a float tensor is carried losslessly whenever coding it would not be smaller: as fp16 when fp16
   holds it exactly (and is smaller), else raw; all-zero tensors are always carried exactly;
3. optionally (model mode), 1-D float tensors -- norm weights, biases, scales: few bytes, yet
   every output feature goes through them -- are carried as fp16 when that keeps them within
   ``vector_max_error``, else raw; and tensors whose names match a ``lossless`` glob are carried
   exactly;
4. lossless tensors are pooled: all fp16-carried tensors in one fp16 group, small raw tensors in one
   raw group per dtype (format 1.1), so a one-element int tensor does not cost a group of its own.

Determinism: trial encodings draw from ``np.random.default_rng([seed, record index, attempt])``, so the
same input, codec, policy and seed give the same message.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from mucsc.codec import kernels, meter, ratecontrol
from mucsc.codec.codecs.base import Codec, EncodedGroup, get_codec
from mucsc.codec.wire.container import ITEMSIZE
from mucsc.codec.backends.tensors import Tensor, bf16_round_trip, name_label, on_host
from mucsc.errors import InputError, ParameterError

# What one more group costs beyond its payload bytes: its HEAD entry ({"codec":..,"dtype":..,
# "params":{..},"records":[..]}, 60-150 bytes of JSON) and one 32-byte section header per section.
GROUP_OVERHEAD = 96
POOL_MAX_BYTES = 64 << 10  # raw tensors up to this size share one raw group per dtype
RETRIES = 3  # encodings per tensor at most when the measured error overshoots the expected one
# Up to this many elements a tensor that fp16 holds within max_error is first asked whether any coding
# within the bound could be smaller (Codec.exceeds_within: a sort and a small DP, ~0.1 ms): tiny
# tensors (biases, a first convolution), whose levels cost more than their fp16 copy, skip the search.
FLOOR_MAX_ELEMENTS = 256
# Rounding to bfloat16 (8 significant bits) moves a value by at most half a unit in the last place,
# 2^-9 of it: a bfloat16 tensor coded within max_error leaves this much of the bound to that rounding.
BF16_HALF_ULP = 2.0 ** -9


@dataclasses.dataclass(frozen=True)
class Planned:
    """One group of the plan: the codec, the record indices (in order), and, when the policy already
    encoded it while choosing, the encoding to use as it is."""

    codec: Codec
    members: tuple[int, ...]
    encoded: EncodedGroup | None = None


@dataclasses.dataclass(frozen=True)
class Policy:
    """Per-tensor groups with lossless fallback (see the module docstring).

    ``max_error``: the relative error ||decode - x|| / ||x|| every coded float tensor must meet
    (a fraction: 0.01 is 1%); needs a codec with a ``max_error`` parameter (mucsc), which then
    chooses Z per tensor.  None keeps the codec's parameters as given (e.g. an update at Z = 16).
    ``lossy_fp16``: allow fp16 as the carrier of a tensor it does not hold exactly when that meets
    ``max_error`` and is smaller (a checkpoint may take fp16 rounding; an unbiased update may not).
    ``vector_max_error``: carry every 1-D float tensor as fp16 when that keeps it within this
    relative error (fp16 rounds to ~0.02%), else raw; None codes them like the rest.
    ``lossless``: glob patterns (fnmatch, case-sensitive) over tensor names: a float tensor that
    matches one is carried exactly (fp16 when it holds the values exactly, else raw).
    """

    max_error: float | None = None
    lossy_fp16: bool = True
    vector_max_error: float | None = None
    lossless: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for name in ("max_error", "vector_max_error"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))
                                  or not math.isfinite(v) or not 0 < v < 1):
                raise ParameterError(f"{name} must be a fraction in (0, 1), e.g. 0.01 for 1%, got {v!r}")
        if isinstance(self.lossless, str) or not all(isinstance(g, str) and g for g in self.lossless):
            raise ParameterError(f"lossless must be a sequence of non-empty glob patterns, got {self.lossless!r}")
        object.__setattr__(self, "lossless", tuple(self.lossless))

    def plan(self, tensors: Sequence[Tensor], codec: Codec, seed: int,
             on_tensor: Callable[[int], Any] | None = None,
             on_trial: Callable[[int], Any] | None = None) -> list[Planned]:
        """The groups for ``tensors`` (record order of their first member); ``on_tensor(i)`` is called
        when tensor i's choice is made, ``on_trial(i)`` after each trial encoding of its search (the
        API's progress hook)."""
        self.check_codec(codec)
        raw, fp16 = get_codec("raw"), get_codec("fp16")
        fp16_pool: list[int] = []
        raw_pools: dict[str, list[int]] = {}
        plan: list[Planned] = []
        for i, t in enumerate(tensors):
            with meter.ticking(None if on_trial is None else lambda i=i: on_trial(i)):
                choice = self.choose(i, t, codec, seed, fp16)
            if choice == "fp16":
                fp16_pool.append(i)
            elif choice == "raw":
                self._carry_raw(i, t, raw, raw_pools, plan)
            else:
                plan.append(choice)
            if on_tensor is not None:
                on_tensor(i)
        if fp16_pool:
            plan.append(Planned(fp16, tuple(fp16_pool)))
        plan += [Planned(raw, tuple(m)) for m in raw_pools.values()]
        plan.sort(key=lambda p: p.members[0])  # groups in record order: deterministic and easy to read
        return plan

    def check_codec(self, codec: Codec) -> None:
        """ParameterError when ``codec`` cannot serve this policy (a max_error needs a codec that targets one)."""
        if self.max_error is not None and not has_param(codec, "max_error"):
            raise ParameterError(f"a per-tensor max_error needs a codec that targets an error (mucsc); "
                                 f"codec {codec.name!r} has no max_error parameter")

    def choose(self, i: int, t: Tensor, codec: Codec, seed: int, fp16: Codec | None = None,
               x: np.ndarray | None = None) -> str | Planned:
        """Tensor ``i``'s carrier, decided from this tensor alone: "raw", "fp16" (the caller pools
        these), or a :class:`Planned` coded group (with its encoding when the policy made one while
        choosing).  What :meth:`plan` does per tensor; a streaming writer calls it as each tensor is read.
        ``x``: :func:`flat_float` of ``t`` when the caller has it (a bfloat16 tensor widened once)."""
        if not t.is_float or codec.lossless:
            return "raw"
        return self._choose(i, t, flat_float(t) if x is None else x, codec, fp16 or get_codec("fp16"), seed)

    def named_lossless(self, name: str | None) -> bool:
        """Whether ``name`` matches one of the ``lossless`` globs."""
        return name is not None and any(fnmatch.fnmatchcase(name, g) for g in self.lossless)

    @staticmethod
    def _carry_raw(i: int, t: Tensor, raw: Codec, pools: dict[str, list[int]], plan: list[Planned]) -> None:
        if math.prod(t.array.shape) * ITEMSIZE[t.dtype] <= POOL_MAX_BYTES:
            pools.setdefault(t.dtype, []).append(i)
        else:
            plan.append(Planned(raw, (i,)))

    def _choose(self, i: int, t: Tensor, x: np.ndarray, codec: Codec, fp16: Codec, seed: int) -> Any:
        """"raw", "fp16" or a :class:`Planned` coded group for float tensor ``t`` (values ``x``)."""
        n = x.size
        raw_bytes = x.size * ITEMSIZE[t.dtype]
        lossless, lossless_bytes, exact16 = _lossless_carrier(t, x, raw_bytes)
        norm = l2_norm(x)
        # all-zero tensors exactly; and no coding can beat a carrier no bigger than a group's overhead
        if norm == 0.0 or lossless_bytes <= GROUP_OVERHEAD + n // 8 or self.named_lossless(t.name):
            return lossless
        if self.vector_max_error is not None and len(t.array.shape) == 1:
            return "fp16" if _fp16_within(t, x, norm, self.vector_max_error) else "raw"
        codec.check_input(x, name_label(t.name))  # before any trial encode (an overflowing cast)
        if self.max_error is None and ratecontrol.needs_plan(codec):
            # a message-wide budget (bits=, size=): the API splits it across the coded groups
            return Planned(codec, (i,))
        lossy16 = self.max_error is not None and self.lossy_fp16 and not exact16 and 2 * n < raw_bytes
        if lossy16 and self._fp16_beats_any_coding(t, x, codec, norm):
            return "fp16"  # what the search would end in: every coding within the bound is larger
        coded = self._coded(i, x, codec, seed, norm, t.dtype)
        coded_bytes = math.inf if coded is None else payload_bytes(coded.encoded) + GROUP_OVERHEAD
        if lossy16 and 2 * n < coded_bytes and _fp16_within(t, x, norm, self.max_error):
            return "fp16"
        if lossless_bytes <= coded_bytes:
            return lossless
        return coded

    def _fp16_beats_any_coding(self, t: Tensor, x: np.ndarray, codec: Codec, norm: float) -> bool:
        """Whether a tiny tensor that fp16 holds within ``max_error`` is smaller as fp16 than any
        coding of ``codec`` within the bound (decided by size, without the search)."""
        n = x.size
        return (n <= FLOOR_MAX_ELEMENTS and _fp16_within(t, x, norm, self.max_error)
                and codec.exceeds_within(x, (self.max_error * norm) ** 2, 2 * n - GROUP_OVERHEAD))

    def _coded(self, i: int, x: np.ndarray, codec: Codec, seed: int, norm: float,
               dtype: str = "float32") -> Planned | None:
        """Tensor i coded by ``codec`` as given, or within ``max_error`` (None: out of the codec's reach).
        A bfloat16 record stores its decoded values rounded to bfloat16: that rounding is part of the
        error the bound is about (:func:`encode_within`'s ``stored``)."""
        rng_for = _rng_for(seed, i)
        if self.max_error is None:
            return Planned(codec, (i,), codec.encode_array(x, rng_for(0)))
        stored = bf16_round_trip if dtype == "bfloat16" else None
        found = encode_within(x, codec, self.max_error, rng_for, norm, stored)
        return None if found is None else Planned(found[0], (i,), found[1])


def _lossless_carrier(t: Tensor, x: np.ndarray, raw_bytes: int) -> tuple[str, int, bool]:
    """How float tensor ``t`` is carried exactly ("fp16" when its values survive float16 and that is
    smaller, else "raw"), that carrier's bytes, and whether float16 holds it exactly."""
    n = x.size
    exact16 = t.dtype in ("float32", "float64") and fp16_exact(x)
    lossless_bytes = min(raw_bytes, 2 * n) if exact16 else raw_bytes
    return ("fp16" if exact16 and 2 * n < raw_bytes else "raw"), lossless_bytes, exact16


def _fp16_within(t: Tensor, x: np.ndarray, norm: float, bound: float) -> bool:
    """Whether float16 keeps float32/float64 tensor ``t`` within relative error ``bound``."""
    return t.dtype in ("float32", "float64") and relative_error(x, fp16_round_trip(x), norm) <= bound


def encode_within(x: np.ndarray, codec: Codec, max_error: float,
                  rng_for: Callable[[int], np.random.Generator],
                  norm: float | None = None,
                  stored: Callable[[np.ndarray], np.ndarray] | None = None) -> tuple[Codec, EncodedGroup] | None:
    """``x`` encoded by ``codec`` in its own error-targeting mode (its ``max_error`` parameter: for
    mucsc, the cheapest levels whose expected error sqrt(J) / ||x|| meets the bound, chosen by
    mucsc.codec.ratecontrol), with the *measured* error of that very encoding checked too: when chance
    puts it above the bound (small tensors, where ||decode - x||^2 strays from its mean J), the bound
    is tightened by the overshoot and the tensor encoded again (at most RETRIES times).  None when the
    bound is out of the codec's reach.  ``norm``: ||x||, when the caller has it.  ``stored``: what the
    record keeps of the decoded values (bfloat16 rounding): the measured error is of that, and the
    codec's first bound leaves room for it (BF16_HALF_ULP: the rounding's largest relative error)."""
    norm = l2_norm(x) if norm is None else norm
    bound = max_error if stored is None else math.sqrt(max(max_error ** 2 - BF16_HALF_ULP ** 2, 0.25 * max_error ** 2))
    for attempt in range(RETRIES):
        c = with_max_error(codec, bound)
        try:
            enc = c.encode_array(x, rng_for(attempt))
        except ParameterError:  # the codec's largest Z misses the bound
            return None
        _, err, err_stored = measure(c, enc, x, stored=stored)[0]
        rel = (0.0 if err_stored == 0 else math.inf) if norm == 0 else err_stored / norm
        if rel <= max_error:  # kept until the message is written: its error known, its IDs dropped
            return c, dataclasses.replace(enc, lookup=None, measured=(norm, err))
        bound *= 0.97 * max_error / rel
    return None


def measure(codec: Codec, enc: EncodedGroup, x: np.ndarray, spans: Sequence[tuple[int, int]] | None = None,
            stored: Callable[[np.ndarray], np.ndarray] | None = None) -> list[tuple[float, float, float]]:
    """The realised error of ``enc`` (``codec``'s encoding of the host vector ``x``): per span [a, b)
    of x (default: one, all of x), (||x||, ||decode - x||, ||stored(decode) - x||) (the last equal to
    the second without ``stored``), in float64.  The decode is read from the encoding's lookup when
    the encoder kept one (``EncodedGroup.lookup``; :func:`kernels.lookup_error`: one pass, no decode
    of the sections and no full-size copy; ``stored`` applied to the table, which is the same as to
    each value), else the sections are decoded once, as the receiver will."""
    spans = [(0, x.size)] if spans is None else spans
    if enc.lookup is None:
        return _measure_decoded(decode_encoded(codec, enc, x.size, x.dtype), x, spans, stored)
    table, ids = enc.lookup
    tables = np.array([table] + ([] if stored is None else [stored(table)]), np.float64)
    out = []
    for s, e in spans:
        acc = np.zeros((len(tables) + 1, 8))
        kernels.lookup_error(x[s:e], ids[s:e], tables, acc)
        norms = [math.sqrt(kernels.dot_total(a)) for a in acc]
        out.append((norms[0], norms[1], norms[-1]))
    return out


def _measure_decoded(y: np.ndarray, x: np.ndarray, spans: Sequence[tuple[int, int]],
                     stored: Callable[[np.ndarray], np.ndarray] | None, chunk: int = 1 << 16
                     ) -> list[tuple[float, float, float]]:
    """:func:`measure` of a decoded vector ``y``, a chunk at a time (a chunk's float64 temporaries
    stay in the cache: 1M-element chunks took twice as long)."""
    out = []
    for s, e in spans:
        sums = [0.0, 0.0, 0.0]
        for a in range(s, e, chunk):
            b = min(a + chunk, e)
            xc = x[a:b].astype(np.float64)
            d, ds = y[a:b] - xc, (stored(y[a:b]) - xc if stored is not None else None)
            sums[0] += kernels.dot(xc, xc)
            sums[1] += kernels.dot(d, d)
            sums[2] += kernels.dot(ds, ds) if ds is not None else 0.0
        norms = [math.sqrt(v) for v in sums]
        out.append((norms[0], norms[1], norms[2] if stored is not None else norms[1]))
    return out


# ---- helpers ----------------------------------------------------------------------------------------

def flat_float(t: Tensor) -> np.ndarray:
    """A float tensor's values as a flat float32/float64 vector, checked finite."""
    x = np.ascontiguousarray(on_host(t).as_float()).reshape(-1)
    if x.dtype == np.float16:
        x = x.astype(np.float32)
    if x.size and not (np.isfinite(x.min()) and np.isfinite(x.max())):
        raise InputError(f"{name_label(t.name)} contains NaN or Inf")
    return x


def fp16_round_trip(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return x.astype(np.float16).astype(x.dtype)


def fp16_exact(x: np.ndarray, first: int = 1 << 10, chunk: int = 1 << 16) -> bool:
    """Whether every value survives float16 exactly (-0.0 included: its sign bit is kept).  Checked
    a chunk at a time, ``first`` elements first: a tensor that float16 does not hold (most) fails
    within its first values, where the whole cast took ~30 ms for 1.25M update values (float16
    subnormals are converted slowly) and ~6 ms for 1.25M weights."""
    bits = x.view(_uint(x))
    a, size = 0, first
    while a < x.size:
        part = x[a: a + size]
        if not np.array_equal(fp16_round_trip(part).view(_uint(x)), bits[a: a + size]):
            return False
        a, size = a + size, chunk
    return True


def _uint(x: np.ndarray) -> type:
    return np.uint64 if x.dtype == np.float64 else np.uint32


def l2_norm(x: np.ndarray, chunk: int = 1 << 20) -> float:
    """||x|| summed in float64, a chunk at a time: a float32 dot product underflows to 0 for tiny
    tensors (|x| ~ 1e-23 and below: taken for all-zero) and overflows to inf for huge ones (~1e19
    and above: every error bound then looks met)."""
    total = 0.0
    for a in range(0, x.size, chunk):
        total += _sum_squares(x[a: a + chunk].astype(np.float64))
    return math.sqrt(total)


def _sum_squares(v: np.ndarray) -> float:
    """sum v^2 of a float64 temporary (squared in place), numpy's pairwise sum: not np.dot, whose
    threaded BLAS took 2.8 ms for 48,000 elements on a loaded 2-core machine (12 us single-threaded)."""
    return float(np.square(v, out=v).sum())


def relative_error(x: np.ndarray, y: np.ndarray, norm: float | None = None,
                   stored: Callable[[np.ndarray], np.ndarray] | None = None, chunk: int = 1 << 20) -> float:
    """||y - x|| / ||x|| (0 when both are zero, inf when only x is), in float64 a chunk at a time (no
    full-size float64 temporaries: a 32M-element tensor would take two of 256 MiB); ``stored``
    applied to each chunk of ``y`` first (what a bfloat16 record keeps of it)."""
    if norm is None:
        norm = l2_norm(x)
    total = 0.0
    for a in range(0, x.size, chunk):
        yc = y[a: a + chunk] if stored is None else stored(y[a: a + chunk])
        total += _sum_squares(np.asarray(yc, np.float64) - x[a: a + chunk])
    err = math.sqrt(total)
    if norm == 0:
        return 0.0 if err == 0 else math.inf
    return err / norm


def payload_bytes(enc: EncodedGroup) -> int:
    """Bytes of an encoding's sections, uncompressed (the container may zstd some: an upper bound)."""
    return sum(len(memoryview(s.tobytes()).cast("B")) for s in enc.sections)


def decode_encoded(codec: Codec, enc: EncodedGroup, n: int, dtype: np.dtype) -> np.ndarray:
    """Decode an encoding straight from its sections (no container), as the receiver would."""
    sections = {s.tag: memoryview(s.tobytes()).cast("B") for s in enc.sections}
    return type(codec).decode_array(n, enc.params, sections, np.dtype(dtype))


def with_max_error(codec: Codec, bound: float) -> Codec:
    """The same codec in its error-targeting mode: ``max_error`` set, the other size-choosing
    parameters (z, bits, size: only one may be given) and explicit levels cleared."""
    names = {f.name for f in dataclasses.fields(codec.params)}
    return codec.replace(**{k: None for k in ("z", "bits", "size", "levels") if k in names}, max_error=bound)


def has_param(codec: Codec, name: str) -> bool:
    return any(f.name == name for f in dataclasses.fields(codec.params))


def _rng_for(seed: int, index: int) -> Callable[[int], np.random.Generator]:
    return lambda attempt: np.random.default_rng([int(seed), index, attempt])
