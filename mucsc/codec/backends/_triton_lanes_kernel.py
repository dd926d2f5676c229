"""IDSL's lane coder (spec/FORMAT.md 4.6, the coder of 4.4) in Triton's language: one program codes or
decodes ``BL`` lanes, looping over their symbol rows (imported only by :mod:`mucsc.codec.backends.triton_lanes`,
which applies ``triton.jit`` when first used and checks the bytes against the torch reference,
:mod:`mucsc.codec.backends.torch_lanes`).  Every step is that reference's integer arithmetic in int64."""

import triton.language as tl

RANS_L = tl.constexpr(1 << 23)


def encode_kernel(sym_ptr, f_ptr, cum_ptr, base_ptr, stride_ptr, count_ptr, out_ptr, ptr_ptr, args_ptr,
                  BL: tl.constexpr):
    """Lane i codes symbols base + t stride (t < count) backwards into out[i cap: (i + 1) cap] from its
    end; ptr_ptr[i] receives where its stream starts.  args: int64 (lanes, steps, cap, S)."""
    nl = tl.load(args_ptr)
    steps = tl.load(args_ptr + 1)
    cap = tl.load(args_ptr + 2)
    S = tl.load(args_ptr + 3)
    lane = tl.program_id(0).to(tl.int64) * BL + tl.arange(0, BL).to(tl.int64)
    ok = lane < nl
    base = tl.load(base_ptr + lane, mask=ok, other=0)
    stride = tl.load(stride_ptr + lane, mask=ok, other=0)
    count = tl.load(count_ptr + lane, mask=ok, other=0)
    x = tl.full([BL], 1 << 23, tl.int64)
    ptr = tl.full([BL], 0, tl.int64) + cap
    row = lane * cap
    scale = (RANS_L >> S) << 8
    for t0 in range(0, steps):
        t = steps - 1 - t0
        act = (t < count) & ok
        s = tl.load(sym_ptr + base + t * stride, mask=act, other=0).to(tl.int64)
        fs = tl.load(f_ptr + s, mask=act, other=1)
        cs = tl.load(cum_ptr + s, mask=act, other=0)
        xm = fs * scale
        n = (x >= xm).to(tl.int64) + (x >= (xm << 8)).to(tl.int64) + (x >= (xm << 16)).to(tl.int64)
        n = tl.where(act, n, 0)
        # the three candidate bytes of the renormalisation; the pointer moves by n
        tl.store(out_ptr + row + ptr - 1, (x & 0xFF).to(tl.uint8), mask=ok)
        tl.store(out_ptr + row + ptr - 2, ((x >> 8) & 0xFF).to(tl.uint8), mask=ok)
        tl.store(out_ptr + row + ptr - 3, ((x >> 16) & 0xFF).to(tl.uint8), mask=ok)
        ptr = ptr - n
        x = x >> (8 * n)
        q = x // fs
        x = tl.where(act, (q << S) + (x - q * fs) + cs, x)
    for i in tl.static_range(4):  # the final state, little-endian, in front
        tl.store(out_ptr + row + ptr - 4 + i, ((x >> (8 * i)) & 0xFF).to(tl.uint8), mask=ok)
    tl.store(ptr_ptr + lane, ptr - 4, mask=ok)


def decode_kernel(buf_ptr, f_ptr, cum_ptr, slot_ptr, base_ptr, stride_ptr, count_ptr, start_ptr, end_ptr,
                  out_ptr, bad_ptr, args_ptr, BL: tl.constexpr):
    """Lane i decodes its stream buf[start: end] into out[base + t stride] (t < count); bad_ptr[i] = 1
    when it ends early, not in state 2^23, or with bytes left.  buf has 3 readable bytes past the
    section.  args: int64 (lanes, steps, S, buffer length)."""
    nl = tl.load(args_ptr)
    steps = tl.load(args_ptr + 1)
    S = tl.load(args_ptr + 2)
    nbuf = tl.load(args_ptr + 3)
    lane = tl.program_id(0).to(tl.int64) * BL + tl.arange(0, BL).to(tl.int64)
    ok = lane < nl
    base = tl.load(base_ptr + lane, mask=ok, other=0)
    stride = tl.load(stride_ptr + lane, mask=ok, other=0)
    count = tl.load(count_ptr + lane, mask=ok, other=0)
    st = tl.load(start_ptr + lane, mask=ok, other=0)
    en = tl.load(end_ptr + lane, mask=ok, other=4)
    x = tl.load(buf_ptr + st, mask=ok, other=0).to(tl.int64)
    x = x | (tl.load(buf_ptr + st + 1, mask=ok, other=0).to(tl.int64) << 8)
    x = x | (tl.load(buf_ptr + st + 2, mask=ok, other=0).to(tl.int64) << 16)
    x = x | (tl.load(buf_ptr + st + 3, mask=ok, other=0x80).to(tl.int64) << 24)
    ptr = st + 4
    mask = (1 << S) - 1
    bad = (x >> 31) != 0  # a coder's state is below 2^31: every step then stays below it
    for t in range(0, steps):
        act = (t < count) & ok
        slot = x & mask
        s = tl.load(slot_ptr + slot, mask=act, other=0).to(tl.int64)
        fs = tl.load(f_ptr + s, mask=act, other=1)
        cs = tl.load(cum_ptr + s, mask=act, other=0)
        x = tl.where(act, fs * (x >> S) + slot - cs, x)
        tl.store(out_ptr + base + t * stride, s.to(tl.int32), mask=act)
        n = (x < RANS_L).to(tl.int64) + (x < (RANS_L >> 8)).to(tl.int64) + (x < (RANS_L >> 16)).to(tl.int64)
        n = tl.where(act, n, 0)
        bad = bad | (ptr + n > en)
        q = tl.minimum(ptr, nbuf - 3)
        v = (tl.load(buf_ptr + q, mask=ok, other=0).to(tl.int64) << 16) \
            | (tl.load(buf_ptr + q + 1, mask=ok, other=0).to(tl.int64) << 8) \
            | tl.load(buf_ptr + q + 2, mask=ok, other=0).to(tl.int64)
        x = ((x << 24) | v) >> (24 - 8 * n)
        ptr = ptr + n
    bad = bad | (x != RANS_L) | (ptr != en)
    tl.store(bad_ptr + lane, bad.to(tl.int8), mask=ok)
