"""IDSL's lane-parallel rANS (spec/FORMAT.md 4.6) on torch tensors: cluster IDs coded and decoded where
they live, byte-identical to :mod:`mucsc.codec.wire.lanes`.

Encode: the symbols (the fused Triton kernel's packed IDs where it runs), their histogram on the
device (only the 256 or k counts cross to the host, which normalises the table exactly as the host
path does), every lane coded at once, the lanes' streams compacted into the section on the device:
only the coded section is copied to the host, by the message writer (``torch_transfer.DeviceBytes``).
Decode: the section copied to the device, every lane decoded at once, the IDs unpacked there.

Each lane step is the same integer arithmetic as the C kernel (the renormalisation without a
data-dependent branch: the byte count is a sum of comparisons); :mod:`mucsc.codec.backends.triton_lanes`
runs the whole loop in one kernel per call where Triton runs and its self-check passes, and this
module's torch loop (one vector step per symbol row, across all lanes) otherwise.  torch is imported
only when this module is used.
"""

from __future__ import annotations

import numpy as np

from mucsc.codec.backends import device_rounding, triton_lanes
from mucsc.codec.backends.tensors import torch_module
from mucsc.codec.backends import torch_packing, torch_transfer
from mucsc.codec.backends.triton_lanes import PAD, Geometry, tables
from mucsc.codec.wire import bitpack, lanes, rans
from mucsc.errors import FormatError

RANS_L = rans.RANS_L


def histogram(v, size: int):
    """Counts of the values of the int64 tensor ``v`` (all in [0, size)), ``size`` of them, on v's
    device: ``bincount`` on the CPU; elsewhere a scatter-add into zeros, since CUDA's bincount reads
    the input's min and max back to the host (two synchronisations) to size its output."""
    torch = torch_module()
    if v.device.type == "cpu":
        return torch.bincount(v, minlength=size)
    out = torch.zeros(size, dtype=torch.int64, device=v.device)
    return out.scatter_add_(0, v, _one(v.device).expand(v.numel()))


_ones: dict = {}


def _one(dev):
    """A 1-element int64 tensor of 1 on ``dev`` (made once per device; expanded, never written)."""
    t = _ones.get(dev)
    if t is None:
        t = _ones[dev] = torch_module().ones(1, dtype=torch_module().int64, device=dev)
    return t


def symbols_of(ids, k: int, w: int):
    """The IDSL symbols of device IDs (a tensor, or a ``device_rounding.Rounding``): packed bytes at w bits
    (the fused round + pack kernel's output for a rounding, where it runs), or the IDs (w = 16)."""
    return symbols_counted(ids, k, w)[0]


def symbols_counted(ids, k: int, w: int):
    """(symbols, their histogram of ``lanes.alphabet(k, w)`` or more counts) on the IDs' device: the
    fused kernel's packed bytes where it runs, else the ids packed as int64 words, counted, then
    narrowed to bytes (no separate widening copy for the histogram)."""
    torch = torch_module()
    size = lanes.alphabet(k, w)
    if w == lanes.WIDE:
        t = (ids.ids() if isinstance(ids, device_rounding.Rounding) else ids)
        return t.to(torch.int32), histogram(t.to(torch.int64), size)
    if isinstance(ids, device_rounding.Rounding):
        fused = ids.fused(w)
        if fused is not None:
            return fused, histogram(fused.to(torch.int64), size)
        ids = ids.ids()
    words = symbol_words(ids, w)
    return words.to(torch.uint8), histogram(words, size)


def symbol_words(ids, w: int):
    """The byte symbols of IDs (a tensor) at w = 1, 2, 4 or 8 bits as int64 values."""
    return ids.to(torch_module().int64) if w == 8 else torch_packing.pack_words(ids, w)


class LaneBytes(torch_transfer.DeviceBytes):
    """An IDSL section coded on the device (a ``format.Payload``), with the symbols it codes."""

    def __init__(self, section, symbols):
        super().__init__(section)
        self.symbols = symbols


class Coded:
    """An IDSL section of device IDs: ``payload`` (host bytes from the host coder, or a
    :class:`LaneBytes` left on the device), its length, and ``part(a, b)``: packed symbol bytes
    [a, b) on the host (the zstd comparison's), from the copy that brought the counts over where
    it brought them."""

    def __init__(self, payload, nbytes: int, part):
        self.payload, self.nbytes, self.part = payload, nbytes, part


def encode_ids(ids, k: int, w: int, spans=()) -> Coded:
    """The IDSL section of device IDs < k (``lanes.encode``'s bytes).  The histogram crosses to the
    host in one copy with, for the host's compiled coder (CPU tensors), the symbols themselves (it
    codes them in place), else the symbol bytes of ``spans`` ((a, b) pairs, the zstd comparison's
    sample) -- the lanes then coded on the device and left there."""
    torch = torch_module()
    size = lanes.alphabet(k, w)
    dev = ids.x.device if isinstance(ids, device_rounding.Rounding) else ids.device
    if dev.type == "cpu" and not triton_lanes.wanted(ids.x if isinstance(ids, device_rounding.Rounding) else ids):
        # the host's compiled coder codes the symbols in place: they come over as the int64 words the
        # packing made, behind their counts, in one copy (no narrowing or dtype views on the device)
        t = ids.ids() if isinstance(ids, device_rounding.Rounding) else ids
        words = t.to(torch.int64) if w == lanes.WIDE else symbol_words(t, w)
        counts = histogram(words, size)
        nc = counts.numel()
        got = torch_transfer.fetch(torch.cat((counts, words)))
        if nc > size:
            raise ValueError("a symbol is out of range")
        host = got[nc:].astype(np.uint16 if w == lanes.WIDE else np.uint8)
        data = lanes.payload(host, w, size, got[:nc])
        return Coded(data, len(data), lambda a, b: host[a:b])
    sym, counts = symbols_counted(ids, k, w)
    m, nc = sym.numel(), counts.numel()
    if nc > size:
        raise ValueError("a symbol is out of range")
    spans = [(a, min(b, m)) for a, b in spans if a < m]
    got = torch_transfer.fetch(torch.cat([counts.view(torch.uint8)] + [sym[a:b].view(torch.uint8) for a, b in spans]))
    fetched, at = {}, 8 * nc
    for a, b in spans:
        fetched[(a, b)], at = got[at:at + b - a], at + b - a
    S, f = lanes.table(got[:8 * nc].view(np.int64), m)
    cum = np.concatenate(([0], np.cumsum(f)[:-1])).astype(np.int64)
    geo = Geometry(lanes.layout(m), sym.device)
    streams, lens = encode_lanes(sym, f, cum, S, geo)
    head = bytes([S, w]) + rans._varints(f) + lens.astype("<u2").tobytes()
    prefix = torch_transfer.to_dev(np.frombuffer(head, np.uint8).copy(), sym.device)
    section = LaneBytes(torch.cat((prefix, streams)), sym)
    return Coded(section, section.nbytes,
                 lambda a, b: fetched[(a, b)] if (a, b) in fetched else torch_transfer.to_host(sym[a:b]))


def encode_lanes(sym, f: np.ndarray, cum: np.ndarray, S: int, geo: Geometry):
    """(the lanes' streams joined, as a uint8 tensor on sym's device; their lengths, host int64):
    the Triton kernel's where it runs, else :func:`encode_lanes_torch`'s."""
    got = triton_lanes.encode(sym, f, cum, S, geo)
    if got is not None:
        return compact(*got, geo)
    if sym.device.type == "cpu":  # CPU tensors (MUCSC_BACKEND=torch): the host's compiled coder, in place
        host = sym.numpy()
        lens, streams = lanes.code_lanes(host.astype(np.uint16) if host.dtype != np.uint8 else host, f, cum, S)
        torch = torch_module()
        return torch.from_numpy(np.frombuffer(b"".join(streams), np.uint8).copy()), lens
    return compact(*encode_lanes_torch(sym, f, cum, S, geo), geo)


def encode_lanes_torch(sym, f: np.ndarray, cum: np.ndarray, S: int, geo: Geometry):
    """(out, ptr): every lane coded backwards into its row of ``out`` (lanes x cap uint8), its stream
    being ``out[j, ptr[j]:]``; one vector step per symbol row, all lanes at once."""
    torch = torch_module()
    dev = sym.device
    L, cap = geo.base.numel(), geo.cap
    ft, ct, _ = tables(f, cum, S, dev)
    x = torch.full((L,), RANS_L, dtype=torch.int64, device=dev)
    ptr = torch.full((L,), cap, dtype=torch.int64, device=dev)
    out = torch.zeros(L * cap, dtype=torch.uint8, device=dev)
    row = torch.arange(L, dtype=torch.int64, device=dev) * cap
    scale = (RANS_L >> S) << 8
    for t in range(geo.steps - 1, -1, -1):
        act = t < geo.count
        s = sym[torch.where(act, geo.base + t * geo.stride, 0)].to(torch.int64)
        fs = torch.where(act, ft[s], 1)
        xm = fs * scale
        n = ((x >= xm).to(torch.int64) + (x >= xm << 8) + (x >= xm << 16)) * act
        for i in range(3):  # all three candidate bytes; the pointer moves by n (FORMAT.md 4.4's loop)
            out[row + ptr - 1 - i] = ((x >> (8 * i)) & 0xFF).to(torch.uint8)
        ptr = ptr - n
        x = x >> (8 * n)
        x = torch.where(act, (x // fs << S) + x % fs + ct[s], x)
    for i in range(4):  # the final state, little-endian, in front
        out[row + ptr - 4 + i] = ((x >> (8 * i)) & 0xFF).to(torch.uint8)
    return out.reshape(L, cap), ptr - 4


def compact(out, ptr, geo: Geometry):
    """The streams ``out[j, ptr[j]:]`` joined in lane order (a uint8 tensor), and their lengths (host)."""
    torch = torch_module()
    L, cap = out.shape
    lens_t = cap - ptr
    lens = torch_transfer.fetch(lens_t).astype(np.int64)
    total = int(lens.sum())
    ends = torch.cumsum(lens_t, 0)
    joined = torch.empty(total, dtype=torch.uint8, device=out.device)
    flat = out.reshape(-1)
    step = 1 << 24
    for a in range(0, total, step):  # bounded temporaries: int64 indices per output byte
        q = torch.arange(a, min(a + step, total), dtype=torch.int64, device=out.device)
        lane = torch.searchsorted(ends, q, right=True)
        joined[a: a + q.numel()] = flat[lane * cap + cap - (ends[lane] - q)]
    return joined, lens


def decode_ids(payload, n: int, k: int, device):
    """The n IDs (int64 tensor on ``device``) of an IDSL payload (host bytes), decoded there; the
    section is validated as ``lanes.decode_symbols`` validates it (same errors).  For CPU tensors the
    host's compiled decoder reads the payload where it is and only the symbols move (no copy back to
    check them); an ID >= k is looked for only where the width allows one (2^w > k)."""
    torch = torch_module()
    b = np.frombuffer(payload, np.uint8)
    p = lanes.parse(b, n, k)
    m = p.layout.m
    kind = torch.device(device).type
    if kind == "cpu" and not triton_lanes.wanted_on(kind):
        out = np.empty(m, np.uint8 if p.w != lanes.WIDE else np.uint16)
        if lanes.decode_lanes(b, p, out):
            raise FormatError(lanes.CORRUPT)
        if p.w == lanes.WIDE:
            return torch.from_numpy(out.astype(np.int64))
        if m:  # IDS_'s rules for the bytes: zero padding bits
            bitpack.check_padding(out, n * p.w, "IDSL symbols")
        sym = torch.from_numpy(out)
    else:
        geo = Geometry(p.layout, device)
        buf = torch_transfer.to_device(np.concatenate((b, np.zeros(PAD, np.uint8))), device)
        sym, bad = decode_lanes(buf, p, geo)
        if bad:
            raise FormatError(lanes.CORRUPT)
        if p.w == lanes.WIDE:
            return sym.to(torch.int64)
        sym = sym.to(torch.uint8)
        if m:  # the last byte's used bits: the padding after them must be zero
            bitpack.check_padding(torch_transfer.to_host(sym[-1:]), n * p.w - 8 * (m - 1), "IDSL symbols")
    ids = unpack_device(sym, p.w, n)
    if n and (1 << p.w) > k:  # every ID < k (a w-bit ID below 2^w <= k needs no look)
        top = int(ids.max())
        if top >= k:
            raise FormatError(f"cluster id {top} out of range for {k} centroids")
    return ids


def unpack_device(sym, w: int, n: int):
    """IDs (int64) of the uint8 device tensor ``sym`` packed w = 1, 2, 4 or 8 bits wide (LSB first)."""
    torch = torch_module()
    if w == 8:
        return sym.to(torch.int64)
    ids = ((sym.unsqueeze(1) >> torch_packing.bit_offsets(sym.device, w)) & ((1 << w) - 1)).view(-1)  # int64
    return ids if ids.numel() == n else ids[:n]


def decode_lanes(buf, p: lanes.Parsed, geo: Geometry):
    """(symbols as an int32 tensor, whether a lane is corrupt): the Triton kernel's where it runs,
    else :func:`decode_lanes_torch`'s."""
    got = triton_lanes.decode(buf, p, geo)
    if got is not None:
        return got
    if buf.device.type == "cpu":  # CPU tensors: the host's compiled decoder, in place
        torch = torch_module()
        out = np.empty(p.layout.m, np.uint8 if p.w != lanes.WIDE else np.uint16)
        bad = lanes.decode_lanes(buf.numpy()[: buf.numel() - PAD], p, out)
        return torch.from_numpy(out.astype(np.int32)), bad
    return decode_lanes_torch(buf, p, geo)


def decode_lanes_torch(buf, p: lanes.Parsed, geo: Geometry):
    """:func:`decode_lanes` with one vector step per symbol row across all lanes (``buf``: the section
    on the device followed by PAD zero bytes)."""
    torch = torch_module()
    dev = buf.device
    ft, ct, slot_sym = tables(p.f, p.cum, p.S, dev)
    starts = torch.from_numpy(p.starts).to(dev)
    ends = starts + torch.from_numpy(p.lengths).to(dev)
    b = buf.to(torch.int64)
    x = b[starts] | b[starts + 1] << 8 | b[starts + 2] << 16 | b[starts + 3] << 24
    ptr = starts + 4
    out = torch.empty(geo.layout.m, dtype=torch.int32, device=dev)
    bad = (x >> 31).any()  # a coder's state is below 2^31: every step then stays below it
    mask = (1 << p.S) - 1
    for t in range(geo.steps):
        act = t < geo.count
        slot = x & mask
        s = slot_sym[slot].to(torch.int64)
        x = torch.where(act, ft[s] * (x >> p.S) + slot - ct[s], x)
        at = geo.base + t * geo.stride
        out[at[act]] = s[act].to(torch.int32)
        n = ((x < RANS_L).to(torch.int64) + (x < RANS_L >> 8) + (x < RANS_L >> 16)) * act
        bad |= (ptr + n > ends).any()
        q = torch.clamp(ptr, max=buf.numel() - 3)
        v = b[q] << 16 | b[q + 1] << 8 | b[q + 2]
        x = ((x << 24) | v) >> (24 - 8 * n)
        ptr = ptr + n
    bad |= ((x != RANS_L) | (ptr != ends)).any()
    return out, bool(bad)
