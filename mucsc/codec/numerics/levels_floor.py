"""Whether any approximation of a vector by at most k distinct values comes within a squared error:
a bound that lets a caller rule a quantiser out by size alone (its table of k levels alone larger
than a lossless carrier) before searching its levels.

The least squared error with at most k values is the 1-D k-means optimum (its clusters contiguous in
sorted order), computed by the compiled kernel's DP.  Without it, a weaker bound from the sorted
data's gaps g_i: a group of elements u_1 < ... < u_m sharing one value c costs sum (u_j - c)^2 >=
1/4 sum (u_j+1 - u_j)^2 (each neighbouring pair at least half its squared distance, each member in
at most two pairs), (u_j+1 - u_j)^2 is at least the sum of the squared gaps it spans, and at most
k - 1 gaps are spanned by no group: the error is at least 1/4 of the sum of the n - k smallest g_i^2.
Either bound is loosened for the rounding of its float64 sums (``SLACK`` of the bound and of the
centred data's squared norm: the DP's prefix sums cancel), so "beyond" is never said of an x that is
not."""

from __future__ import annotations

import numpy as np

from mucsc.codec import kernels

# the float64 sums are within ~n 2^-53 (times the centred squared norm) of the exact ones: far less
SLACK = 1e-9


def beyond(x: np.ndarray, k: int, sq_error: float) -> bool:
    """True when every y with at most ``k`` distinct values has ||y - x||^2 > ``sq_error``."""
    n = x.size
    if k >= n:
        return False  # x itself
    if k < 1:
        return True
    xs = np.sort(x.astype(np.float64).reshape(-1))
    xc = xs - xs.mean()
    limit = sq_error * (1.0 + SLACK) + SLACK * float(np.square(xc).sum())
    kmeans = kernels.compiled("kmeans")
    if kmeans is not None:
        return kmeans(xc, k) > limit
    g = np.diff(xs)
    return float(np.sort(g * g)[: n - k].sum()) / 4 > limit
