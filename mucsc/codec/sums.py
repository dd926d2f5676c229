"""Reductions summed in a fixed order, so that every choice and byte they feed is the same on every
machine (issue 37).

``np.dot`` hands float64 dot products to BLAS, whose result depends on the BLAS build's kernel for
the CPU and on its thread count (OpenBLAS splits a dot of more than ~10^4 elements among its
threads: with ``OPENBLAS_NUM_THREADS`` 1 and 2 the last bits differ).  :func:`dot` sums in one
fixed order instead: eight column sums ``acc[j] += a[8 i + j] b[8 i + j]`` in ``i`` order (a tail
padded with zeros), then ``((acc0 + acc1) + (acc2 + acc3)) + ((acc4 + acc5) + (acc6 + acc7))``; the
compiled kernel (``_kernels.c`` ``dot``) and the numpy twin below do the same float64 operations.
"""

from __future__ import annotations

import numpy as np

from mucsc.codec import kernels

__all__ = ["dot"]


def dot(a, b) -> float:
    """sum(a * b) in float64, in the fixed order of the module docstring."""
    a = np.ascontiguousarray(a, np.float64).reshape(-1)
    b = np.ascontiguousarray(b, np.float64).reshape(-1)
    if a.size != b.size:
        raise ValueError(f"dot: lengths {a.size} and {b.size} differ")
    if kernels.use_c():
        return kernels.c_module().dot(a, b)
    p = np.zeros(-(-a.size // 8) * 8)
    np.multiply(a, b, out=p[: a.size])
    # column sums in row order: cumsum adds strictly in sequence (a reduction could go pairwise)
    acc = np.cumsum(p.reshape(-1, 8), axis=0)[-1] if p.size else np.zeros(8)
    return float(((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7])))
