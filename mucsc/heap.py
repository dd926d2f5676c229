"""Keep freed heap memory mapped in a process that encodes or decodes in a loop.

An encode allocates and frees several MB of temporaries (the solver's sample, its prefix sums, the
IDs).  With glibc's defaults the freed top of the heap is given back to the kernel (and blocks above
the mmap threshold are unmapped), so the next encode page-faults the same memory in again.  On the
2-core VM of docs/performance.md a z = 16 encode of 301,021 floats took 11-16 ms that way and 9 ms with
the memory kept, and the DDP hook's step went from 3.04x to 2.20x the default allreduce.
:func:`keep_freed_memory` raises the two thresholds for the whole process (the same as the
``MALLOC_TRIM_THRESHOLD_`` / ``MALLOC_MMAP_THRESHOLD_`` environment variables): a long-running job
that owns its process (a DDP training loop) trades up to ``trim_bytes`` of retained free memory for it.

A decoded array of 4 MiB and more is not glibc's: the compiled decoders write it on memory mapped for
it on huge pages (``kernels.output_array``), and a freed one is kept for the next decode, up to
:data:`DECODED_OUTPUTS` bytes in all by default (glibc keeps blocks under its 32 MiB mmap threshold
the same way).  :func:`keep_decoded_outputs` sets that cap; 0 gives the memory back as each array goes.
"""

from __future__ import annotations

import ctypes
import functools

from mucsc.codec import kernels

M_TRIM_THRESHOLD = -1  # glibc <malloc.h>
M_MMAP_THRESHOLD = -3
MAX_MMAP_THRESHOLD = 32 << 20  # glibc refuses more (HEAP_MAX_SIZE / 2 on 64-bit)
DECODED_OUTPUTS = 64 << 20  # the compiled kernels' default cap on freed decode outputs kept (at most 4)


@functools.cache
def _mallopt():
    """glibc's ``mallopt`` or None (another C library, or no C library to load)."""
    try:
        libc = ctypes.CDLL(None)
        if not hasattr(libc, "gnu_get_libc_version"):  # musl and others: mallopt is absent or a no-op
            return None
        fn = libc.mallopt
    except (OSError, AttributeError):
        return None
    fn.argtypes, fn.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return fn


def keep_freed_memory(trim_bytes: int = 128 << 20, mmap_bytes: int = MAX_MMAP_THRESHOLD) -> bool:
    """Keep up to ``trim_bytes`` of freed memory at the heap's top, and serve allocations below
    ``mmap_bytes`` from the heap; process-wide.  True where glibc accepted both settings."""
    if not 0 < mmap_bytes <= MAX_MMAP_THRESHOLD or not 0 < trim_bytes < 1 << 31:
        raise ValueError(f"need 0 < mmap_bytes <= {MAX_MMAP_THRESHOLD} and 0 < trim_bytes < 2^31")
    fn = _mallopt()
    if fn is None:
        return False
    return bool(fn(M_TRIM_THRESHOLD, trim_bytes)) and bool(fn(M_MMAP_THRESHOLD, mmap_bytes))


def keep_decoded_outputs(max_bytes: int = DECODED_OUTPUTS) -> int | None:
    """Keep up to ``max_bytes`` (at most 4 arrays' worth) of freed decode outputs mapped for the next
    decodes; 0 keeps none and gives back what is kept now.  Process-wide.  Returns the previous cap, or
    None without the compiled kernels (the outputs are then numpy's, and glibc's thresholds apply)."""
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 0:
        raise ValueError(f"max_bytes must be an integer >= 0, got {max_bytes!r}")
    pool = kernels.compiled("huge_buffer_pool")
    return None if pool is None else int(pool(max_bytes)[0])
