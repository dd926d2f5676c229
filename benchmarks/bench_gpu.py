#!/usr/bin/env python3
"""Device-resident encode/decode: torch tensor on a device -> message bytes -> tensor on the device.

    python benchmarks/bench_gpu.py                      # CUDA, d = 1e7, 1e8, 1e9 (skips sizes that do not fit)
    python benchmarks/bench_gpu.py --device cpu --sizes 1e6,1e7   # the torch backend on CPU tensors
    python benchmarks/bench_gpu.py --codecs signsgd,topk,stc,fp16,bmucsc   # other codecs' rows too

Rows, for each d (float32, Gaussian, mucsc Z = 16, seed 0):
* ``device encode``: ``mucsc.encode(x_dev)`` -- the solver summary, rounding and packing on the device,
  the IDs lane-coded there (format 1.2's IDSL: mucsc/codec/backends/torch_lanes.py, the Triton kernels
  of triton_lanes.py where they run), only the coded section copied to the host; ``id_coding=packed``:
  the format 1.0 default (packed IDs copied over, zstd on the host);
* ``threads=0`` / ``compress=off``: the same with the host's stages (zstd, CRC-32) on all cores / with
  the IDs stored fixed-width (no zstd);
* ``device encode, MUCSC_TRITON=0``: the same with the fused Triton kernel switched off (the torch
  path rounds, then packs; the first row's path too where the kernel does not run);
* with ``--stages``, each step of the device encode timed alone (what bounds the end-to-end figure),
  ``fused round+pack (Triton)``: mucsc/codec/backends/triton_round.py's one kernel for the rounding and
  packing rows (its bytes checked equal to theirs first), or why it did not run;
  the CRC-32 of the packed IDs on the device vs on the host, and the message writer alone on the
  device encode's sections (``compress=off``: the IDs copied into the message with the device's or
  the host's CRC, 1 thread / all cores; and the old writer's passes for comparison);
* with ``--stages`` also the IDSL coding's steps (histogram + table, lane encode, compaction, the
  section's copy, lane decode) and which coder ran;
* with ``--selection KEEP``, each step of the top-k family's and B-MUCSC's device selection of the
  largest KEEP fraction timed alone: ``torch.topk`` against the radix select the backend uses, the
  positions' copy, the values' gather, the positions' coding on the host, the rest's float64 sum;
  where the Gaussian input has ties at the k-th magnitude (the host decides), that path is timed
  on it and the device path on a tie-free input of the same size;
* ``host encode``: ``mucsc.encode(x_dev.cpu().numpy())`` -- the copy to the host plus the compiled kernels
  (or numpy) on one core: what a user did before the torch backend;
* ``device decode``: ``mucsc.decode(blob, as_torch=True, device=dev)`` -- unpack and gather on the device;
* ``host decode``: ``mucsc.decode(blob, as_torch=True).to(dev)``.
With ``--codecs``, each listed codec (default parameters) gets ``device encode``, ``host encode`` and
``device decode`` rows of its own, after checking its device and host bytes are identical.
GB/s counts the float32 input (4 bytes per element); best of --repeat, after one warm-up run.  Both
encodes must give identical bytes (checked; the benchmark stops otherwise).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import time

import numpy as np

import mucsc
from mucsc.codec import kernels


def sync(torch, dev):
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def best_time(fn, repeat, torch, dev):
    fn()  # warm-up: kernels, allocator
    sync(torch, dev)
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        sync(torch, dev)
        best = min(best, time.perf_counter() - t0)
    return best


def host_encode(a: np.ndarray, z: int | None, codec: str = "mucsc") -> bytes:
    """The host path (compiled kernels or numpy), also when the torch backend is selected for CPU."""
    was, kernels.TORCH = kernels.TORCH, False
    try:
        return mucsc.encode(a, codec, seed=0, **({} if z is None else {"z": z}))
    finally:
        kernels.TORCH = was


def codec_rows(x, codec: str, dev) -> list[tuple]:
    """``--codecs`` rows for one codec (its default parameters), after the byte check."""
    blob = mucsc.encode(x, codec, seed=0)
    if blob != host_encode(x.cpu().numpy(), None, codec):
        raise SystemExit(f"bench_gpu: {codec}: device and host bytes differ at d = {x.numel()}")
    return [(f"{codec}: device encode", lambda: mucsc.encode(x, codec, seed=0)),
            (f"{codec}: host encode", lambda: host_encode(x.cpu().numpy(), None, codec)),
            (f"{codec}: device decode", lambda: mucsc.decode(blob, as_torch=True, device=dev, max_elements=None))]


def stages(x, z: int, repeat: int, torch, dev) -> list[tuple[str, float]]:
    """Seconds of each step of a device encode, timed alone (best of ``repeat``): what bounds the
    end-to-end figure.  Uses the backend's internals (this is a benchmark, not API)."""
    import zlib

    from mucsc.codec import parallel
    from mucsc.codec.numerics import centroids, quantize
    from mucsc.codec.backends import crc, torch_packing, torch_rounding, torch_summary, torch_transfer

    src = torch_summary.TorchSource(x)
    b = src.bounds()
    wire = quantize.wire_centroids(centroids.solve(src, z, "optimal", np.random.default_rng(0), bounds=b),
                                   None, np.float32, bounds=b)
    key = quantize.draw_key(np.random.default_rng(0))
    ids, _ = torch_rounding.stochastic_round(x, wire, key)
    width = int(np.ceil(np.log2(wire.size)))
    packed = torch_packing.pack_tensor(ids, width)
    host = torch_transfer.to_host(packed)
    touched = np.ones(packed.numel(), np.uint8)
    one, every = parallel.zstd_compressor(3, 1), parallel.zstd_compressor(3, parallel.resolve(0))

    def all_cores(fn):
        with parallel.using(0):
            return fn()
    return [fused_stage(x, wire, key, width, packed, repeat, torch, dev),
        ("min/max", best_time(lambda: src.bounds(), repeat, torch, dev)),
        ("solver (summary + host)", best_time(lambda: centroids.solve(src, z, "optimal", np.random.default_rng(0),
                                                                      bounds=b), repeat, torch, dev)),
        ("rounding (eq. 7)", best_time(lambda: torch_rounding.stochastic_round(x, wire, key), repeat, torch, dev)),
        ("J pass (stats only)", best_time(lambda: torch_rounding.variance_J(x, wire), repeat, torch, dev)),
        ("packing", best_time(lambda: torch_packing.pack_tensor(ids, width), repeat, torch, dev)),
        ("copy to host, pinned", best_time(lambda: torch_transfer.to_host(packed), repeat, torch, dev)),
        *([("  ... into touched memory",
            best_time(lambda: torch_transfer.copy_out(packed, touched), repeat, torch, dev))]
          if dev.type == "cuda" else []),  # the pinned staging is CUDA's
        ("copy to host, pageable", best_time(lambda: packed.cpu(), repeat, torch, dev)),
        ("zstd, 1 thread", best_time(lambda: one.compress(host), repeat, torch, dev)),
        ("zstd, all cores", best_time(lambda: every.compress(host), repeat, torch, dev)),
        ("CRC-32, host, 1 thread", best_time(lambda: zlib.crc32(host), repeat, torch, dev)),
        ("CRC-32, host, all cores", best_time(lambda: all_cores(lambda: parallel.crc32(memoryview(host))),
                                              repeat, torch, dev)),
        ("CRC-32 on the device", best_time(lambda: crc.crc32(packed), repeat, torch, dev)),
    ]


def assembly(x, z: int, raw: bytes, repeat: int, torch, dev) -> list[tuple[str, float]]:
    """Seconds of ``format.write_message`` alone on a device encode's sections (``compress=off``,
    the API's path): the packed IDs copied from the device into the message (through the pinned
    buffer's halves) with their CRC-32 from the device or from the host, on 1 thread and all cores;
    both checked to give ``raw``, the message ``mucsc.encode`` gives.  And, for comparison, the
    passes the writer made before (a new host array of the IDs, a CRC pass, a join)."""
    from mucsc.codec.wire import container as fmt
    from mucsc.codec import parallel
    from mucsc.codec.backends import torch_transfer

    enc = mucsc.get_codec("mucsc", z=z).for_container(compressing=False).encode_array(x, np.random.default_rng([0, 0]))
    header = fmt.read_message(raw).header
    secs = [(0, s.tag, s.payload(), s.compressible) for s in enc.sections]
    ids = next(p for _, tag, p, _ in secs if tag == "IDS_")
    dev_crc, host_crc = ([(g, tag, torch_transfer.DeviceBytes(ids.tensor, device_crc=on) if p is ids else p, c)
                          for g, tag, p, c in secs] for on in (True, False))

    def write(s, threads):
        with parallel.using(threads):
            return fmt.write_message(header, s, zstd_level=None)

    def old_passes(threads):
        with parallel.using(threads):
            h = torch_transfer.to_host(ids.tensor)
            parallel.crc32(memoryview(h))
            return b"".join([raw[:64], h])

    for s in (dev_crc, host_crc):
        if write(s, 1) != raw:
            raise SystemExit("bench_gpu: the writer's message differs from mucsc.encode's")
    return [(f"{what}{', threads=0' if t == 0 else ''}", best_time(lambda: fn(t), repeat, torch, dev))
            for what, fn in (("writer, device CRC", lambda t: write(dev_crc, t)),
                             ("writer, host CRC", lambda t: write(host_crc, t)),
                             ("old: array, CRC, join", old_passes))
            for t in (1, 0)]


def tie_free(d: int, torch, dev):
    """A float32 vector of d distinct magnitudes (random signs): bit patterns 0x3F000000 + a random
    permutation of range(d) (0.5 and up, all finite for d < 2^30), so no two |x| are equal and the
    device selection never hands over to the host."""
    g = torch.Generator(device=dev).manual_seed(1)
    bits = torch.randperm(d, generator=g, device=dev, dtype=torch.int64) + 0x3F000000
    sign = torch.randint(0, 2, (d,), generator=g, device=dev, dtype=torch.int64) << 31
    return (bits | sign).to(torch.int32).view(torch.float32)


def selection_stages(x, keep: float, repeat: int, torch, dev) -> list[tuple[str, float]]:
    """Seconds of each step of a device top-k selection of ``keep`` (the top-k family and B-MUCSC),
    timed alone (best of ``repeat``), with ``torch.topk`` as the reference for the radix select.

    Gaussian float32 at 1e7 and more has elements tied at the k-th magnitude, and then the host
    decides (the set is a choice): that path is timed on ``x`` as it is (the copy to the host and
    ``sparse.top_k`` there, as ``top_k_positions`` returning None leads to), and the device path on a
    tie-free vector of the same size (:func:`tie_free`)."""
    from mucsc.codec.wire import sparse
    from mucsc.codec.backends import ordered_sum, torch_selection, torch_transfer

    k = sparse.keep_count(keep, x.numel())
    rows = []
    if torch_selection.top_k_positions(x, k) is None:
        rows += [(f"ties at the k-th |x| (k = {k:,}): the host's path", None),
                 ("  device: detect the tie",
                  best_time(lambda: torch_selection.top_k_positions(x, k), repeat, torch, dev)),
                 ("  copy to host + sparse.top_k", best_time(lambda: sparse.top_k(x.cpu().numpy(), k), repeat, torch,
                                                            dev))]
        x = tie_free(x.numel(), torch, dev)
        rows.append(("tie-free input (distinct |x|), the device path", None))
    a = x.abs()
    t, _, _ = torch_selection.kth_largest_abs(a, k)
    if t != float(torch.topk(a, k, sorted=False).values.min()):
        raise SystemExit("bench_gpu: the radix select and torch.topk disagree on the k-th magnitude")
    pos = torch_selection.top_k_positions(x, k)
    if pos is None:
        raise SystemExit("bench_gpu: ties at the k-th magnitude in the tie-free input")
    pos_dev = torch.from_numpy(pos).to(dev)
    return rows + [
        (f"|x| (k = {k:,})", best_time(lambda: x.abs(), repeat, torch, dev)),
        ("k-th |x|: torch.topk", best_time(lambda: float(torch.topk(a, k, sorted=False).values.min()),
                                           repeat, torch, dev)),
        ("k-th |x|: radix select", best_time(lambda: torch_selection.kth_largest_abs(a, k), repeat, torch, dev)),
        ("positions + copy to host", best_time(lambda: torch.nonzero(a >= t).reshape(-1).cpu().numpy(),
                                               repeat, torch, dev)),
        ("whole selection", best_time(lambda: torch_selection.top_k_positions(x, k), repeat, torch, dev)),
        ("values: gather + copy", best_time(lambda: torch_transfer.bytes_to_host(x[torch.from_numpy(pos).to(dev)]),
                                            repeat, torch, dev)),
        ("positions coded (host, auto)", best_time(lambda: sparse.encode(pos, x.numel(), "auto"), repeat, torch, dev)),
        ("float64 sum, numpy's order", best_time(lambda: ordered_sum.sum64_like_numpy(x), repeat, torch, dev)),
        ("kept values' float64 sum", best_time(lambda: ordered_sum.sum64_like_numpy(x[pos_dev]), repeat, torch, dev)),
    ]


def lane_stages(x, z: int, repeat: int, torch, dev) -> list[tuple[str, float | str]]:
    """Seconds of each step of the IDSL coding of a device encode's IDs (format 1.2), timed alone:
    the symbols' histogram and table, the lane encode (Triton kernels where they run, else the torch
    loop), the compaction, and the lane decode on the device; which coder ran is named."""
    from mucsc.codec.backends import device_rounding, torch_lanes, triton_lanes
    from mucsc.codec.backends import torch_summary, torch_transfer
    from mucsc.codec.numerics import centroids, quantize
    from mucsc.codec.wire import lanes

    src = torch_summary.TorchSource(x)
    b = src.bounds()
    wire = quantize.wire_centroids(centroids.solve(src, z, "optimal", np.random.default_rng(0), bounds=b),
                                   None, np.float32, bounds=b)
    ids = device_rounding.Rounding(x, wire, quantize.draw_key(np.random.default_rng(0)))
    w = lanes.symbol_bits(wire.size)
    sym = torch_lanes.symbols_of(ids, wire.size, w)
    size = lanes.alphabet(wire.size, w)
    counts = torch.bincount(sym.to(torch.int64), minlength=size).cpu().numpy()
    S, f = lanes.table(counts, sym.numel())
    cum = np.concatenate(([0], np.cumsum(f)[:-1]))
    geo = torch_lanes.Geometry(lanes.layout(sym.numel()), dev)
    kernel = triton_lanes.encode(sym, f, cum, S, geo) is not None
    coder = "Triton kernels" if kernel else f"torch loop ({triton_lanes.disabled_reason() or 'Triton not run here'})"
    payload = torch_lanes.encode_ids(ids, wire.size, w).payload  # host bytes (CPU tensors) or LaneBytes
    host = payload.host() if hasattr(payload, "host") else np.frombuffer(payload, np.uint8)
    p = lanes.parse(host, x.numel(), wire.size)
    buf = torch_transfer.to_device(np.concatenate((host, np.zeros(torch_lanes.PAD, np.uint8))), dev)
    enc = (lambda: triton_lanes.launch_encode(sym, f, cum, S, geo)) if kernel else \
        (lambda: torch_lanes.encode_lanes_torch(sym, f, cum, S, geo))
    raw = enc()
    return [
        (f"IDSL coder: {coder}", None),
        ("  histogram + table", best_time(lambda: lanes.table(torch.bincount(sym.to(torch.int64), minlength=size)
                                                            .cpu().numpy(), sym.numel()), repeat, torch, dev)),
        ("  lane encode", best_time(enc, repeat, torch, dev)),
        ("  compaction", best_time(lambda: torch_lanes.compact(*raw, geo), repeat, torch, dev)),
        ("  whole IDSL section on the device", best_time(lambda: torch_lanes.encode_ids(ids, wire.size, w).payload,
                                                         repeat, torch, dev)),
        ("  copy of the section to host",
         best_time(lambda: payload.host() if hasattr(payload, "host") else payload, repeat, torch, dev)),
        ("  lane decode", best_time(lambda: torch_lanes.decode_lanes(buf, p, geo), repeat, torch, dev)),
    ]


def fused_stage(x, wire, key: int, width: int, packed, repeat: int, torch, dev) -> tuple[str, float | str]:
    """The fused Triton kernel's time for the rounding + packing rows' work, after checking its bytes
    equal theirs; or why it did not run (no triton, not a CUDA tensor, failed its self-check)."""
    from mucsc.codec.backends import triton_round

    what = "fused round+pack (Triton)"
    if triton_round.round_pack(x, wire, key, width) is None:  # runs the self-check on first use
        return what, f"not run: {triton_round.disabled_reason() or 'triton not importable or not wanted here'}"
    if not torch.equal(triton_round.launch(x, wire, key, width), packed):
        raise SystemExit(f"bench_gpu: the fused kernel's bytes differ from the torch path's at d = {x.numel()}")
    return what, best_time(lambda: triton_round.launch(x, wire, key, width), repeat, torch, dev)


@contextlib.contextmanager
def triton_off():
    """MUCSC_TRITON=0 inside the block (the torch path rounds and packs)."""
    was = os.environ.get("MUCSC_TRITON")
    os.environ["MUCSC_TRITON"] = "0"
    try:
        yield
    finally:
        if was is None:
            del os.environ["MUCSC_TRITON"]
        else:
            os.environ["MUCSC_TRITON"] = was


def encode_unfused(x, z: int) -> bytes:
    with triton_off():
        return mucsc.encode(x, "mucsc", z=z, seed=0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--sizes", default="1e7,1e8,1e9")
    ap.add_argument("--z", type=int, default=16)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--stages", action="store_true", help="also time each step of the device encode alone")
    ap.add_argument("--selection", type=float, default=None, metavar="KEEP",
                    help="also time each step of a device top-k selection of this fraction (e.g. 0.01)")
    ap.add_argument("--codecs", default="", help="also time these codecs (comma-separated, e.g. signsgd,topk)")
    args = ap.parse_args()
    import torch

    dev = torch.device(args.device)
    kernels.TORCH = dev.type == "cpu"  # CPU tensors take the torch backend only when selected
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("bench_gpu: no CUDA device here (use --device cpu to time the torch backend on CPU)")
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else platform.processor() or "cpu"
    print(f"# device {dev} ({name}), torch {torch.__version__}, host kernels {kernels.BACKEND}, "
          f"mucsc z={args.z}, float32 Gaussian, best of {args.repeat}")
    print(f"{'d':>14}  {'what':<30} {'seconds':>9} {'GB/s':>8}")
    for d in (int(float(s)) for s in args.sizes.split(",")):
        try:
            g = torch.Generator(device=dev).manual_seed(0)
            x = torch.randn(d, generator=g, device=dev)
        except (RuntimeError, MemoryError) as exc:  # torch.OutOfMemoryError is a RuntimeError
            print(f"{d:>14,}  skipped: {str(exc).splitlines()[0][:60]}")
            continue
        blob = mucsc.encode(x, "mucsc", z=args.z, seed=0)
        if blob != host_encode(x.cpu().numpy(), args.z) or blob != encode_unfused(x, args.z):
            raise SystemExit(f"bench_gpu: device (fused or not) and host bytes differ at d = {d}")
        raw = mucsc.encode(x, "mucsc", z=args.z, seed=0, compress="off")
        packed = mucsc.encode(x, "mucsc", z=args.z, seed=0, id_coding="packed")
        print(f"{d:>14,}  default message: {8 * len(blob) / d:.4f} bits/element, id_coding "
              f"{mucsc.inspect(blob).groups[0].params.get('id_coding', 'packed')}, format {mucsc.inspect(blob).version}; "
              f"id_coding=packed {8 * len(packed) / d:.4f}", flush=True)
        rows = [
            ("device encode", lambda: mucsc.encode(x, "mucsc", z=args.z, seed=0)),
            ("device encode, MUCSC_TRITON=0", lambda: encode_unfused(x, args.z)),
            ("device encode, id_coding=packed", lambda: mucsc.encode(x, "mucsc", z=args.z, seed=0, id_coding="packed")),
            ("device encode, threads=0", lambda: mucsc.encode(x, "mucsc", z=args.z, seed=0, threads=0)),
            ("device encode, compress=off", lambda: mucsc.encode(x, "mucsc", z=args.z, seed=0, compress="off")),
            ("  ... and threads=0", lambda: mucsc.encode(x, "mucsc", z=args.z, seed=0, compress="off", threads=0)),
            ("host encode", lambda: host_encode(x.cpu().numpy(), args.z)),
            ("device decode", lambda: mucsc.decode(blob, as_torch=True, device=dev, max_elements=None)),
            ("device decode, compress=off", lambda: mucsc.decode(raw, as_torch=True, device=dev, max_elements=None)),
            ("device decode, id_coding=packed", lambda: mucsc.decode(packed, as_torch=True, device=dev,
                                                                     max_elements=None)),
            ("host decode", lambda: mucsc.decode(blob, as_torch=True, max_elements=None).to(dev)),
        ]
        if args.stages:
            rows = rows[:1] + [(f"  {w}", None, t) for w, t in stages(x, args.z, args.repeat, torch, dev)] + rows[1:]
            rows += [(f"  {w}", None, t) for w, t in assembly(x, args.z, raw, args.repeat, torch, dev)]
        if args.stages:
            rows += [(f"  {w}", None, t) for w, t in lane_stages(x, args.z, args.repeat, torch, dev)]
        if args.selection is not None:
            rows += [(f"  {w}", None, t) for w, t in selection_stages(x, args.selection, args.repeat, torch, dev)]
        for codec in filter(None, args.codecs.split(",")):
            rows += codec_rows(x, codec, dev)
        for what, fn, *given in rows:
            t = given[0] if given else best_time(fn, args.repeat, torch, dev)
            if t is None:  # a heading
                print(f"{d:>14,}  {what}", flush=True)
                continue
            if isinstance(t, str):  # a stage that did not run, and why
                print(f"{d:>14,}  {what:<30} {t}", flush=True)
                continue
            print(f"{d:>14,}  {what:<30} {t:>9.4f} {4 * d / t / 1e9:>8.2f}", flush=True)
        del x
        if dev.type == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
