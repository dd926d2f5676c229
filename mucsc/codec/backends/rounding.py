"""The step "levels and eq. 7's rounding to them" (paper eq. 7, spec/FORMAT.md 4.3): the centroid
solver's view of the data, the wire centroids, and the stochastic rounding of every element.

``Host``: the solver reads the array (bounds and sorted data cached for a goal's many trials) and
:func:`mucsc.codec.numerics.quantize.stochastic_round` rounds (the compiled kernel or numpy, as
:mod:`mucsc.codec.kernels` chose; the C kernel sums J in the same pass).  ``Torch``: the solver reads a
small summary copied from the device in one copy, and the rounding is left on the device, done when
the message is written (``device_rounding.Rounding``: fused with the packing where the Triton kernel
runs).  Both give the same levels and IDs."""

from __future__ import annotations

from typing import Any

import numpy as np

from mucsc.codec import kernels, parallel
from mucsc.codec.backends import device_rounding
from mucsc.codec.backends.tensors import is_torch_tensor
from mucsc.codec.backends import torch_rounding, torch_summary
from mucsc.codec.numerics import centroids, quantize


class Host:
    @staticmethod
    def solve_and_round(x: np.ndarray, z: int, solver: str, dtype: Any, rng: np.random.Generator,
                        cache: dict | None = None, host: np.ndarray | None = None,
                        levels: np.ndarray | None = None) -> tuple[np.ndarray, Any, Any]:
        """(wire centroids of ``dtype``, IDs, J or None): levels solved for ``z`` with ``solver``
        (or the given ``levels``), then eq. 7's rounding with a key drawn from ``rng``.  ``cache``:
        kept by a caller that rounds the same ``x`` many times (a goal's search): its bounds and
        the solver's sorted data are computed once.  ``host``: unused (x is on the host)."""
        if x.size == 0:
            return np.zeros(0, dtype), np.zeros(0, np.uint8), 0.0
        if cache is not None and "bounds" in cache:
            bounds = cache["bounds"]
        else:
            bounds = parallel.bounds(x)  # once, not once per stage
            if cache is not None:
                cache["bounds"] = bounds
        if levels is None and cache is None:
            done = _solved_and_rounded(x, z, solver, dtype, rng, bounds)
            if done is not None:
                return done
        c = centroids.solve(x, z, solver, rng, bounds=bounds, cache=cache) if levels is None else levels
        wire = quantize.wire_centroids(c, x, np.dtype(dtype), bounds=bounds)
        # The C kernel accumulates J (float64) in the rounding pass for ~5 ms per 1e7 elements; in
        # the numpy fallback that costs ~40% of the rounding, so there J is computed only on demand.
        if kernels.compiled("sround") is not None:
            ids, J = quantize.stochastic_round(x, wire, rng, bounds=bounds, return_J=True, checked=True)
        else:
            ids = quantize.stochastic_round(x, wire, rng, bounds=bounds, checked=True)
            J = None
        return wire, ids, J

    @staticmethod
    def id_sample(ids: np.ndarray, step: int) -> np.ndarray:
        """ids[::step] on the host (for an estimate of the IDs' entropy)."""
        return ids[::step]


_F32 = np.dtype(np.float32)
_DATA = (_F32, np.dtype(np.float64))  # the data dtypes solve_round takes (float32 wire levels)


def _solved_and_rounded(x: np.ndarray, z: int, solver: str, dtype: Any, rng: np.random.Generator,
                        bounds: tuple[float, float]) -> tuple[np.ndarray, np.ndarray, float] | None:
    """:meth:`Host.solve_and_round` of a small float32 or float64 vector to float32 wire levels in one
    compiled call (``solve_round``: the solve on x's sort, the wire levels, the rounding), where it applies:
    the same operations, so the same levels, IDs and J, without the ~60 Python lines and ~15 numpy
    calls between the three steps (~25 us of a 1e4-element encode, whose caches the solver leaves
    cold).  None where it does not apply (nothing drawn from ``rng`` then); where the kernel hands
    the case back, the steps run one by one with the key it was given."""
    kernel = kernels.compiled("solve_round")
    lo, hi = bounds
    m = centroids.candidate_count(x.size, z)
    if (kernel is None or solver != "optimal" or type(x) is not np.ndarray or x.dtype not in _DATA
            or dtype != _F32 or not 3 <= z <= min(centroids.DP_MAX_Z, m)
            or x.size > centroids.FULL_SORT_MAX or not lo < hi or x.ndim != 1 or not x.flags.c_contiguous):
        return None  # (NaN bounds fail lo < hi: the solver names the problem)
    key = quantize.draw_key(rng)  # the rounding's one draw (the optimal solver draws nothing)
    # (_finish may add both ends: up to z + 2 levels before the wire merges them)
    levels, wire, ids = np.empty(z + 2), np.empty(z + 2, np.float32), np.empty(x.size, np.uint8)
    s = x.copy()  # np.sort(x), without its Python wrapper
    s.sort()
    # lo, hi: the bounds the steps' _finish would compare, a zero's sign included
    count, J = kernel(s, x, z, m, centroids.cbrt_table(), centroids.POLISH_SWEEPS, key, True, levels, wire, ids,
                      lo, hi)
    if count > 0:
        return wire[:count], ids, J
    c = centroids.solve(x, z, solver, rng, bounds=bounds)
    wire = quantize.wire_centroids(c, x, np.dtype(dtype), bounds=bounds)
    ids, J = quantize.stochastic_round(x, wire, None, bounds=bounds, return_J=True, checked=True, key=key)
    return wire, ids, J


class Torch:
    @staticmethod
    def solve_and_round(x: Any, z: int, solver: str, dtype: Any, rng: np.random.Generator,
                        cache: dict | None = None, host: np.ndarray | None = None,
                        levels: np.ndarray | None = None) -> tuple[np.ndarray, Any, Any]:
        """:meth:`Host.solve_and_round` of a torch tensor (solved levels only: given levels are planned
        and rounded on the host), byte-identical: the solver reads a summary copied from the device
        in one copy (none when ``host`` holds x's values already), the IDs are a
        ``device_rounding.Rounding``, and J a callable (a separate pass, only when asked)."""
        if levels is not None:
            raise ValueError("the torch rounding solves its levels: given levels are rounded on the host")
        dtype = np.dtype(dtype)
        if x.numel() == 0:
            return np.zeros(0, dtype), np.zeros(0, np.uint8), 0.0
        src = torch_summary.solver_source(x, z, solver, host)  # one copy to the host (none: ``host``)
        bounds = src.bounds()
        c = centroids.solve(src, z, solver, rng, bounds=bounds)
        wire = quantize.wire_centroids(c, None, dtype, bounds=bounds)
        if wire.size == 1:  # one level: every id is 0 and the rounding step draws nothing
            return wire, np.zeros(x.numel(), np.uint8), 0.0
        if not torch_rounding.round_supported(x, wire):  # a level gap beyond the working precision
            return (wire, *quantize.stochastic_round(x.cpu().numpy(), wire, rng, bounds=bounds, return_J=True))
        ids = device_rounding.Rounding(x, wire, quantize.draw_key(rng))
        return wire, ids, lambda: torch_rounding.variance_J(x, wire)

    @staticmethod
    def id_sample(ids: Any, step: int) -> np.ndarray:
        sample = ids.sample(step) if isinstance(ids, device_rounding.Rounding) else ids[::step]
        return sample.cpu().numpy() if is_torch_tensor(sample) else sample
