"""Dispatch to the optional compiled kernels (``mucsc/codec/_kernels.c``) or the numpy path.

``BACKEND`` is ``"c"`` when the extension was built and imports, else ``"numpy"``.  Setting the
environment variable ``MUCSC_PURE_NUMPY=1`` (or ``MUCSC_BACKEND=numpy``) before the import forces
``"numpy"``.  Both backends give bit-identical results (same random stream, same decision rule, same
DP operation order), so encoder output never depends on the installation.  Every caller outside this
module asks :func:`compiled`, which reads ``BACKEND`` at call time: that is also how tests compare the
two paths in one process.

``MUCSC_BACKEND=torch`` additionally routes the encoders that have a torch path (the ``Torch`` forms
of :mod:`mucsc.codec.backends.dispatch`) through it for CPU data (tensors on a GPU always take it);
the host steps (the centroid solver) still use ``BACKEND``.  ``TORCH`` records that choice.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import numpy as np

__all__ = ["BACKEND", "TORCH", "splitmix64", "GAMMA", "use_c", "compiled", "dot", "lookup_error", "nearest",
           "output_array"]

GAMMA = 0x9E3779B97F4A7C15  # SplitMix64 state increment (spec/FORMAT.md 4.3)
_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
MASK64 = (1 << 64) - 1

try:
    from mucsc.codec import _kernels as _c  # type: ignore[attr-defined]
except ImportError:  # built without a C compiler: the numpy path runs
    _c = None
_REQUESTED = os.environ.get("MUCSC_BACKEND", "").strip().lower()
if _REQUESTED not in ("", "c", "numpy", "torch"):
    raise ImportError(f"MUCSC_BACKEND must be one of c, numpy, torch; got {_REQUESTED!r}")
_FORCE_NUMPY = os.environ.get("MUCSC_PURE_NUMPY", "").strip() not in ("", "0") or _REQUESTED == "numpy"
BACKEND = "c" if _c is not None and not _FORCE_NUMPY else "numpy"
TORCH = _REQUESTED == "torch"  # encode CPU data on the torch backend too (read at call time)


def use_c() -> bool:
    """True when the compiled kernels are available and selected (``BACKEND == "c"``).  For tests
    (skips, comparisons); the library asks :func:`compiled` for the kernel it runs."""
    return BACKEND == "c" and _c is not None


def c_module():
    """The compiled module, or None when it was not built (it is still importable when
    MUCSC_PURE_NUMPY=1 selected the numpy path, so tests can compare the two).  For tests; the
    library asks :func:`compiled`."""
    return _c


def compiled(name: str) -> Callable | None:
    """The compiled kernel ``name`` when the compiled kernels are selected (``BACKEND``, read now: tests
    switch it in one process) and built with it, else None: the one place the C-or-numpy choice is
    made.  A caller asks once per call and runs its numpy twin on None."""
    return getattr(_c, name, None) if BACKEND == "c" and _c is not None else None


def splitmix64(key: int, start: int, count: int, out: np.ndarray | None = None,
               tmp: np.ndarray | None = None, ramp: np.ndarray | None = None, shift: int = 0) -> np.ndarray:
    """Outputs number start+1 .. start+count of SplitMix64 with state ``key``, i.e.
    mix(key + (j + 1) * GAMMA) for j in [start, start + count), as uint64 (numpy integer arithmetic
    wraps mod 2^64).  ``out``/``tmp``: uint64 work buffers; ``ramp``: precomputed
    ``arange(1, >= count + 1) * GAMMA`` (all optional, for chunked callers); ``shift``: each output
    shifted right by this many bits (0..63)."""
    if out is None:
        out = np.empty(count, np.uint64)
    kernel = compiled("splitmix64")
    if kernel is not None:  # the same numbers in one pass (tmp and ramp unused)
        kernel(key & MASK64, start & MASK64, shift, out[:count])
        return out[:count]
    if tmp is None:
        tmp = np.empty(count, np.uint64)
    if ramp is None:
        ramp = np.arange(1, count + 1, dtype=np.uint64) * np.uint64(GAMMA)
    z, t = out[:count], tmp[:count]
    np.add(ramp[:count], np.uint64((key + start * GAMMA) & MASK64), out=z)
    np.right_shift(z, np.uint64(30), out=t)
    np.bitwise_xor(z, t, out=z)
    np.multiply(z, _M1, out=z)
    np.right_shift(z, np.uint64(27), out=t)
    np.bitwise_xor(z, t, out=z)
    np.multiply(z, _M2, out=z)
    np.right_shift(z, np.uint64(31), out=t)
    np.bitwise_xor(z, t, out=z)
    if shift:
        np.right_shift(z, np.uint64(shift), out=z)
    return z


def dot(a, b) -> float:
    """sum(a * b) in float64 in one fixed order, so that every choice and byte it feeds is the same on
    every machine: eight column sums ``acc[j] += a[8 i + j] b[8 i + j]`` in ``i`` order (a tail padded
    with zeros), then ``((acc0 + acc1) + (acc2 + acc3)) + ((acc4 + acc5) + (acc6 + acc7))``; the
    compiled kernel and the numpy twin do the same float64 operations.  Not ``np.dot``: it hands
    float64 dots to BLAS, whose result depends on the kernel the BLAS build picks for the CPU and on
    its thread count (OpenBLAS splits a dot of more than ~10^4 elements among its threads: with
    ``OPENBLAS_NUM_THREADS`` 1 and 2 the last bits differ)."""
    a = np.ascontiguousarray(a, np.float64).reshape(-1)
    b = np.ascontiguousarray(b, np.float64).reshape(-1)
    if a.size != b.size:
        raise ValueError(f"dot: lengths {a.size} and {b.size} differ")
    kernel = compiled("dot")
    if kernel is not None:
        return kernel(a, b)
    p = np.zeros(-(-a.size // 8) * 8)
    np.multiply(a, b, out=p[: a.size])
    # column sums in row order: cumsum adds strictly in sequence (a reduction could go pairwise)
    acc = np.cumsum(p.reshape(-1, 8), axis=0)[-1] if p.size else np.zeros(8)
    return float(((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7])))


def lookup_error(x: np.ndarray, ids: np.ndarray, tables: np.ndarray, acc: np.ndarray,
                 chunk: int = 1 << 16) -> None:
    """Add x^2 to ``acc[0]`` and (tables[r][ids] - x)^2 to ``acc[1 + r]`` (``acc``: float64, shape
    (1 + rows, 8): :func:`dot`'s column sums, element i of this call's x in column i % 8, so calls
    over consecutive pieces of a multiple of 8 elements give the sums of one call; :func:`dot_total`
    ends them).  The
    realised error of a decode that is a table lookup (``EncodedGroup.lookup``) without the decode:
    one pass, no float64 copy (the numpy twin: the same float64 operations ``chunk`` at a time)."""
    x = np.ascontiguousarray(x).reshape(-1)
    ids = np.ascontiguousarray(ids).reshape(-1)
    tables = np.ascontiguousarray(tables, np.float64)
    if tables.ndim != 2 or acc.shape != (tables.shape[0] + 1, 8) or ids.size != x.size:
        raise ValueError("lookup_error: bad arguments")
    kernel = compiled("lookup_error")
    if kernel is not None and x.dtype in (np.float32, np.float64) and ids.dtype in (np.uint8, np.uint16):
        kernel(x, ids, tables, acc.reshape(-1))
        return
    if ids.size and int(ids.max()) >= tables.shape[1]:
        raise ValueError("lookup_error: an id is out of range")
    for a in range(0, x.size, chunk):
        xc = x[a: a + chunk].astype(np.float64)
        vals = [xc * xc] + [(t[ids[a: a + chunk]] - xc) ** 2 for t in tables]
        for r, v in enumerate(vals):
            p = np.zeros(-(-v.size // 8) * 8)
            p[: v.size] = v
            # column sums carried on in row order (cumsum adds in sequence from the carried row)
            acc[r] = np.cumsum(np.vstack([acc[r][None], p.reshape(-1, 8)]), axis=0)[-1]


def dot_total(acc: np.ndarray) -> float:
    """:func:`dot`'s fixed tree over its 8 column sums."""
    return float(((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7])))


def nearest(x: np.ndarray, t: np.ndarray, c: np.ndarray, ids: np.ndarray, chunk: int,
            index: Callable[[np.ndarray], np.ndarray] | None = None) -> float:
    """Nearest rounding (spec/FORMAT.md 4.3.1): ``ids[m]`` = the number of boundaries ``t`` (float64,
    sorted, one fewer than the levels ``c``) with ``x[m] > t_k`` -- ties to the lower level -- and the
    squared error sum (x - c[ids])^2, summed chunk by chunk (``chunk`` elements: :func:`dot` of each
    chunk, the chunk sums added in order), so that the compiled kernel and the numpy twin give the
    same float.  The kernel makes one pass with O(#levels) working memory; the numpy twin converts a
    chunk at a time to float64.  ``index(xc)``: the twin's boundary count for a float64 chunk when
    the caller has a faster one than the binary search (it must give the same counts)."""
    x = np.asarray(x).reshape(-1)
    t = np.ascontiguousarray(t, np.float64)
    c = np.ascontiguousarray(c, np.float64)
    if c.size != t.size + 1 or ids.size != x.size:
        raise ValueError(f"nearest: {c.size} levels need {c.size - 1} boundaries (got {t.size}); "
                         f"{x.size} elements need as many ids (got {ids.size})")
    kernel = compiled("nearest")
    if kernel is not None and x.dtype in (np.float32, np.float64) and x.flags.c_contiguous and ids.flags.c_contiguous:
        return kernel(x, t, c, ids, chunk)
    err = 0.0
    for s in range(0, x.size, chunk):
        xc = x[s : s + chunk].astype(np.float64)
        # the number of boundaries below x
        k = np.searchsorted(t, xc, side="left") if index is None else index(xc)
        ids[s : s + chunk] = k
        d = xc - c[k]
        err += dot(d, d)
    return err


HUGE_OUTPUT = 4 << 20  # bytes: a decoder's output from here up is mapped on huge pages (output_array)


def output_array(n: int, dtype) -> np.ndarray:
    """An uninitialised array of n items of ``dtype`` for a decoder to fill.  From HUGE_OUTPUT bytes up,
    with the compiled kernels, on memory mapped from a 2 MiB boundary with transparent huge pages
    advised (``_kernels.huge_buffer``): one page fault per 2 MiB instead of numpy's 4 KiB pages at the
    edges of its own huge-page interior (~1,000 faults for a 40 MB array); counted by tracemalloc as
    numpy's arrays are, unmapped with its last view.  Else ``np.empty``."""
    dtype = np.dtype(dtype)
    alloc = compiled("huge_buffer")
    if alloc is None or n * dtype.itemsize < HUGE_OUTPUT:
        return np.empty(n, dtype)
    return np.frombuffer(alloc(n * dtype.itemsize), dtype, n)
