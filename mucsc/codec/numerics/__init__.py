"""The numerics: pure functions on arrays for the paper's mathematics.

``centroids`` (levels r_1 < ... < r_Z minimising J, section IV-B), ``quantize`` (eq. 7's unbiased
stochastic rounding and eq. 8's J), ``ecsq`` (entropy-constrained levels), ``allocate`` (a byte
budget split across groups on the lower convex hull of their (bytes, J) options), ``nearest``
(Lloyd-Max levels and nearest rounding), ``dither`` (subtractive dither on a uniform grid, its index
alphabet and size estimates).

May import: :mod:`mucsc.codec.wire`, :mod:`mucsc.codec.kernels`, :mod:`mucsc.codec.parallel`,
:mod:`mucsc.errors`; nothing above."""
