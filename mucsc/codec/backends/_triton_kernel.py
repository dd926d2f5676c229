"""The fused rounding + packing kernel's body, in Triton's language (imported only by
:mod:`mucsc.codec.backends.triton_round`, which applies ``triton.jit`` to it when it is first used and
checks its bytes against the torch reference).

Left undecorated here so that ``triton_round`` can build it for the compiler or for Triton's
interpreter (``TRITON_INTERPRET=1``, read when ``triton.jit`` runs).  Everything follows
spec/FORMAT.md 4.3 (the stream, the interval, eq. 7's decision) and 4.2 (LSB-first packing).
"""

import triton.language as tl

# SplitMix64's constants (FORMAT.md 4.3); constexpr: a jitted function may read no other globals
GAMMA = tl.constexpr(0x9E3779B97F4A7C15)
M1 = tl.constexpr(0xBF58476D1CE4E5B9)
M2 = tl.constexpr(0x94D049BB133111EB)


def round_pack_kernel(x_ptr, c_ptr, g_ptr, out_ptr, args_ptr,
                      F32: tl.constexpr, SPAN: tl.constexpr, G: tl.constexpr):
    """One program: ``G`` groups of 8 elements of x -> their ``G * width`` bytes of IDS_.

    x_ptr: the data (float32 or float64); c_ptr: the K centroids and g_ptr: the K - 1 gaps
    c[k+1] - c[k], both in the working precision (float32 iff ``F32``); args_ptr: int64 (n, nint,
    nbytes, key, start, width): n elements, nint = K - 2 interior centroids, nbytes of output, the
    stream state's bit pattern, the stream index of x[0] (a multiple of 8), bits per id (<= SPAN, a
    power of two, so nint <= 2^width - 2 < 2^SPAN).  The scalars come from memory, not as arguments,
    so that one compiled binary serves every value (Triton would otherwise specialise on their
    sizes and alignment) and the self-check's probes test the binary that encodes."""
    n = tl.load(args_ptr)
    nint = tl.load(args_ptr + 1)
    nbytes = tl.load(args_ptr + 2)
    key = tl.load(args_ptr + 3)
    start = tl.load(args_ptr + 4)
    width = tl.load(args_ptr + 5).to(tl.int32)
    grp = tl.program_id(0).to(tl.int64) * G + tl.arange(0, G).to(tl.int64)
    j = tl.arange(0, 8)
    i = grp[:, None] * 8 + j[None, :]  # [G, 8] element index in x
    valid = i < n
    x = tl.load(x_ptr + i, mask=valid, other=0.0)
    e = (i + start).to(tl.uint64)  # element index in the group's stream
    # the counter of the stream word that holds element e's bits: float32 work takes two 24-bit
    # uniforms from each word (element 2m from word m's bits 8..31, 2m + 1 from its bits 40..63)
    if F32:
        z = (e >> 1) + 1
    else:
        z = e + 1
    # SplitMix64 (uint64: the products wrap mod 2^64, >> is a logical shift)
    z = key.to(tl.uint64, bitcast=True) + z * GAMMA
    z = (z ^ (z >> 30)) * M1
    z = (z ^ (z >> 27)) * M2
    z = z ^ (z >> 31)
    if F32:
        t = tl.where((e & 1) == 0, (z >> 8) & 0xFFFFFF, z >> 40)
        u = t.to(tl.int32).to(tl.float32) * 5.9604644775390625e-08  # * 2^-24, exact
        xw = x.to(tl.float32)
    else:
        u = (z >> 11).to(tl.int64).to(tl.float64) * 1.1102230246251565e-16  # * 2^-53, exact
        xw = x.to(tl.float64)
    # k = the number of interior centroids c[1..nint] that are <= x: a branch-free binary search
    # with steps 2^(SPAN-1) .. 1 (nint < 2^SPAN; steps past nint are masked off)
    k = tl.full([G, 8], 0, tl.int32)
    for s in tl.static_range(SPAN):
        cand = k + (1 << (SPAN - 1 - s))
        ok = cand <= nint
        cv = tl.load(c_ptr + cand, mask=ok, other=0.0)
        k = tl.where(ok & (cv <= xw), cand, k)
    ck = tl.load(c_ptr + k)
    gk = tl.load(g_ptr + k)
    # eq. 7: up iff u * (c[k+1] - c[k]) < x - c[k], each operation rounded once: the product only
    # feeds the comparison (no add to contract into an fma; the launch also turns fp fusion off)
    up = (u * gk) < (xw - ck)
    ids = tl.where(valid, k + up.to(tl.int32), 0)  # ids past n are 0: the padding bits are zero
    # byte b of a group is bits [8b, 8b + 8) of its 8 * width bits, and id j starts at bit j * width:
    # it contributes (id << (j*width - 8b)) & 0xFF, a right shift when that is negative
    col = tl.arange(0, SPAN)
    sh = j[None, None, :] * width - 8 * col[None, :, None]  # [1, SPAN, 8]
    lsh = tl.minimum(tl.maximum(sh, 0), 8)  # a shift of 8 or more leaves nothing in the byte
    rsh = tl.minimum(tl.maximum(-sh, 0), 16)  # ids < 2^16: so does >> 16
    part = ((ids[:, None, :] << lsh) >> rsh) & 0xFF  # [G, SPAN, 8]
    # or the 8 contributions together, halving the last axis three times (builtins only: tl.sum
    # is itself a jitted function, which Triton's interpreter runs only if it was imported in
    # interpreter mode)
    lo, hi = tl.split(tl.reshape(part, [G, SPAN, 4, 2]))
    lo, hi = tl.split(tl.reshape(lo | hi, [G, SPAN, 2, 2]))
    lo, hi = tl.split(lo | hi)
    pos = grp[:, None] * width + col[None, :]
    tl.store(out_ptr + pos, (lo | hi).to(tl.uint8), mask=(col[None, :] < width) & (pos < nbytes))
