"""Deterministic multi-threading of one message: chunks of a group, and groups side by side.

The compiled kernels, numpy's element-wise loops and zstd release the GIL, so a few Python threads
running them on slices of one vector use several cores.  Bytes never depend on the thread count:

* chunk boundaries are fixed multiples of :data:`CHUNK` elements, whatever ``threads`` is, so a chunk
  computes exactly what the single pass computes there (the rounding pass's uniforms come from the
  counter stream of spec/FORMAT.md 4.3, element i's from counter i; ``CHUNK`` is a multiple of 8, so
  every chunk of packed IDs is whole bytes for any width);
* per-chunk results are combined in chunk order (J is summed in that order for every ``threads``);
* zstd always runs in its multi-threaded mode (see :func:`zstd_compressor`);
* decoding, one thread decompresses a zstd-coded ID section (one frame: sequential) while the others
  unpack the chunks it has finished (:func:`unpack_take`); the CRC-32 is taken in parts (:func:`crc32`).

``threads`` is set for a call with :func:`using` (the API does this) and read by the codecs through
:func:`current`, so codec signatures stay as they are.
"""

from __future__ import annotations

import contextvars
import functools
import itertools
import os
import threading
import weakref
import zlib
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import numpy as np

from mucsc.codec import kernels
from mucsc.errors import ParameterError

__all__ = ["CHUNK", "GROUP_PARALLEL_MAX", "resolve", "using", "current", "spans", "run", "run_spans",
           "run_groups", "bounds", "pack", "pack_array", "PackedIds", "unpack_take", "crc32", "crc32_combine",
           "copy_crc32", "zstd_compressor"]

T = TypeVar("T")

# Elements per chunk: 4 MiB of float32, long enough that the per-call overhead (~20 us) is noise and
# short enough that 2..16 threads share a 1e7-element vector evenly.  A multiple of 8 (packing) and
# even (float32 elements 2j and 2j + 1 share one random word).
CHUNK = 1 << 20
# Groups smaller than this are encoded/decoded side by side, one thread each; larger ones one after
# the other with every thread inside (they have enough chunks to share).
GROUP_PARALLEL_MAX = 2 * CHUNK
MAX_THREADS = 1024

_threads: contextvars.ContextVar[int] = contextvars.ContextVar("mucsc_threads", default=1)
# bounds() of the arrays seen during one API call (id -> (weak reference, bounds)): the API's finite
# check and the codec's solver ask for the same vector's min and max
_bounds_memo: contextvars.ContextVar[dict | None] = contextvars.ContextVar("mucsc_bounds", default=None)
_pools: dict[int, ThreadPoolExecutor] = {}
_pools_lock = threading.Lock()


def resolve(threads: Any) -> int:
    """The thread count for a ``threads`` argument: a positive int as given, 0 or None: all cores."""
    if type(threads) is int and 0 < threads <= MAX_THREADS:  # the usual argument, as it is
        return threads
    if threads is None or (isinstance(threads, (int, np.integer)) and not isinstance(threads, bool)
                           and threads == 0):
        return available_cores()
    if isinstance(threads, bool) or not isinstance(threads, (int, np.integer)) or threads < 0:
        raise ParameterError(f"threads must be a non-negative integer (0: all cores), got {threads!r}")
    return int(min(threads, MAX_THREADS))


def available_cores() -> int:
    """Cores this process may run on (the affinity mask where the OS has one)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def using(threads: Any) -> _Using:
    """Run the body with ``threads`` threads (see :func:`resolve`); ``with`` yields the resolved count."""
    return _Using(resolve(threads))


class _Using:
    """:func:`using`'s context: a class, not a ``contextlib`` generator (~1 us less per API call,
    a fixed cost of every small encode and decode)."""

    __slots__ = ("n", "_tokens")

    def __init__(self, n: int) -> None:
        self.n = n

    def __enter__(self) -> int:
        self._tokens = (_threads.set(self.n), _bounds_memo.set({}))
        return self.n

    def __exit__(self, *exc: Any) -> None:
        token, memo = self._tokens
        _bounds_memo.reset(memo)
        _threads.reset(token)


def current() -> int:
    """The thread count of the enclosing :func:`using` (1 outside any)."""
    return _threads.get()


def spans(n: int, chunk: int | None = None) -> list[tuple[int, int]]:
    """[start, end) of the fixed chunks of ``range(n)`` (one empty span for n = 0)."""
    chunk = chunk or CHUNK
    return [(s, min(s + chunk, n)) for s in range(0, n, chunk)] or [(0, 0)]


def _forget_pools() -> None:
    """In a forked child the pools' threads do not exist: start new ones when needed."""
    global _pools_lock
    _pools.clear()
    _pools_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pools)


def _pool(workers: int) -> ThreadPoolExecutor:
    with _pools_lock:
        pool = _pools.get(workers)
        if pool is None:
            pool = _pools[workers] = ThreadPoolExecutor(workers, thread_name_prefix="mucsc")
        return pool


def run(fn: Callable[[T], Any], items: Sequence[T], threads: int | None = None) -> list[Any]:
    """``[fn(item) for item in items]`` on up to ``threads`` threads (default :func:`current`).

    The caller's thread works too; items are taken in order by whichever thread is free.  Inside
    the workers :func:`current` is 1, so nested calls run serially (no pool waits on itself).  If
    several items fail, the exception of the first failing item is raised, as a loop would.
    """
    t = current() if threads is None else threads
    t = min(t, len(items))
    if t <= 1:
        return [fn(it) for it in items]
    results: list[Any] = [None] * len(items)
    errors: dict[int, BaseException] = {}
    counter = itertools.count()  # next() on it is atomic under the GIL
    ctx = contextvars.copy_context()

    def worker() -> None:
        _threads.set(1)
        for i in iter(counter.__next__, None):
            if i >= len(items) or errors:
                return
            try:
                results[i] = fn(items[i])
            except BaseException as exc:  # noqa: BLE001 -- re-raised in the caller below
                errors[i] = exc
                return

    futures = [_pool(t - 1).submit(ctx.copy().run, worker) for _ in range(t - 1)]
    token = _threads.set(1)
    try:
        worker()
    finally:
        _threads.reset(token)
        for f in futures:  # a worker that never started (busy pool) has nothing left to do
            if not f.cancel():
                f.result()
    if errors:
        raise errors[min(errors)]
    return results


def run_spans(fn: Callable[[int, int], Any], n: int, chunk: int | None = None) -> list[Any]:
    """``fn(start, end)`` for every fixed chunk of ``range(n)``, results in chunk order."""
    if n <= (chunk or CHUNK):  # one chunk (every small message): no spans, no pool machinery
        return [fn(0, n)]
    return run(lambda se: fn(*se), spans(n, chunk))


def run_groups(fn: Callable[[int], T], sizes: Sequence[int]) -> list[T]:
    """``fn(i)`` for every group i (``sizes[i]`` elements), results in group order.

    With several threads, groups below :data:`GROUP_PARALLEL_MAX` elements run side by side (one
    thread each), larger ones one after the other with all threads inside.  Errors are raised as a
    loop over the groups would raise them: the first failing group's.
    """
    t = current()
    if t <= 1 or len(sizes) <= 1:
        return [fn(i) for i in range(len(sizes))]
    small = [i for i, s in enumerate(sizes) if s < GROUP_PARALLEL_MAX]
    if len(small) <= 1:
        return [fn(i) for i in range(len(sizes))]
    out: list[Any] = [None] * len(sizes)
    errors: dict[int, BaseException] = {}

    def one(i: int) -> None:
        try:
            out[i] = fn(i)
        except Exception as exc:  # noqa: BLE001 -- re-raised below, in group order
            errors[i] = exc

    run(one, small, t)
    for i in range(len(sizes)):
        if errors and min(errors) < i:
            break
        if sizes[i] >= GROUP_PARALLEL_MAX:
            one(i)
    if errors:
        raise errors[min(errors)]
    return out


def bounds(x: np.ndarray) -> tuple[float, float]:
    """(min x, max x) of a non-empty 1-D array, over the fixed chunks in parallel (NaN propagates).

    Inside :func:`using`, a second call for the same array object returns the first call's result
    (the array is not modified during one API call; a weak reference tells a new array at a reused
    address apart)."""
    memo = _bounds_memo.get()
    if memo is not None:
        hit = memo.get(id(x))
        if hit is not None and hit[0]() is x:
            return hit[1]
    if x.size <= CHUNK or current() <= 1:
        kernel = kernels.compiled("minmax")  # one pass; None where numpy's reductions must answer
        out = kernel(x) if kernel is not None else None
        if out is None:  # the ufuncs' reductions without ndarray.min's wrappers
            out = float(np.minimum.reduce(x, axis=None)), float(np.maximum.reduce(x, axis=None))
    else:
        parts = run_spans(lambda s, e: (x[s:e].min(), x[s:e].max()), x.size)
        out = float(np.min([p[0] for p in parts])), float(np.max([p[1] for p in parts]))
    if memo is not None:
        try:
            memo[id(x)] = (weakref.ref(x), out)
        except TypeError:  # an array subclass without weak references: no memo
            pass
    return out


def pack(ids: np.ndarray, width: int) -> PackedIds:
    """``bitpack.pack(ids, width)``'s bytes as a payload packed when the message is written
    (:class:`PackedIds`: straight into the message, no array of packed IDs of its own)."""
    return PackedIds(ids, width)


def pack_array(ids: np.ndarray, width: int) -> np.ndarray:
    """``bitpack.pack(ids, width)`` as a uint8 array, over the fixed chunks in parallel (the same
    bytes: every chunk but the last holds a multiple of 8 values, i.e. whole bytes for any width),
    each chunk's bytes put straight into the one output array (no bytes objects, no join)."""
    from mucsc.codec.wire import bitpack

    if ids.size <= CHUNK or current() <= 1 or width == 0:
        return bitpack.pack_array(ids, width)
    out = np.empty(bitpack.packed_size(ids.size, width), np.uint8)

    def one(s: int, e: int) -> None:
        out[s * width // 8: bitpack.packed_size(e, width)] = bitpack.pack_array(ids[s:e], width)
    run_spans(one, ids.size)
    return out


class PackedIds:
    """IDs packed ``width`` bits wide (``bitpack.pack``'s bytes) as a ``format.Payload``: packed when
    the message is written, chunk by chunk straight into it on ``current()`` threads, each chunk's
    CRC-32 taken while it is in cache -- the packed IDs never get an array of their own there, nor
    a copy.  :meth:`host` packs them into one (once) when something needs them on the host first
    (zstd, rate control's sizes, a decode of the encoding); the IDs are let go of then."""

    def __init__(self, ids: np.ndarray, width: int) -> None:
        from mucsc.codec.wire import bitpack

        self._ids, self.width = ids, width
        self.nbytes = bitpack.packed_size(ids.size, width)
        self._host: np.ndarray | None = None

    def host(self) -> np.ndarray:
        """The packed bytes as a uint8 array."""
        if self._host is None:
            self._host, self._ids = pack_array(self._ids, self.width), None
        return self._host

    def tobytes(self) -> bytes:
        return self.host().tobytes()

    def write_into(self, out: Any) -> int:
        """Pack into the writable buffer ``out`` (``nbytes`` long); the CRC-32 of the bytes."""
        from mucsc.codec.wire import bitpack

        if self._host is not None:
            return copy_crc32(self._host, out)
        o, ids, w = np.frombuffer(out, np.uint8), self._ids, self.width
        if o.size != self.nbytes:
            raise ValueError(f"PackedIds: {self.nbytes} bytes into a buffer of {o.size}")

        def span(a: int, b: int, crc: int) -> int:  # IDs [a, b), a a multiple of CHUNK: whole bytes
            for s in range(a, b, CHUNK):
                e = min(s + CHUNK, b)
                piece = o[s * w // 8: bitpack.packed_size(e, w)]
                piece[...] = bitpack.pack_array(ids[s:e], w)
                crc = crc32_update(piece, crc)
            return crc
        return _crc_parts(ids.size if w else 0, 0, span, CHUNK,
                          lambda a, b: bitpack.packed_size(b, w) - a * w // 8)


def unpack_take(buf: Any, width: int, n: int, table: np.ndarray,
                check: Callable[[int], Exception], out: np.ndarray | None = None) -> np.ndarray:
    """``table[bitpack.unpack(buf, width, n)]`` chunk by chunk in parallel, without the full ID array.

    Every ID is checked against ``len(table)`` (``check(bad_id)`` builds the exception raised for
    the first chunk holding one, with that chunk's largest ID); the length and the padding bits are
    checked as ``bitpack.unpack`` checks them.  Widths 1, 2, 4 and 8 look whole bytes up in a
    256-entry table of the 8 / width values each byte holds (one gather per byte, no unpacking).

    ``buf`` may be a payload still being decompressed (``format.ZstdStream``: ``nbytes``, ``buffer``,
    ``read_to(pos)``, ``complete()``).  With several threads one of them then decompresses it chunk
    by chunk while the others unpack the chunks already there (zstd decoding of one frame is
    sequential, so this overlap is what lets a zstd-coded section scale); errors are the same as
    when decompressing first: the stream's, else the first bad chunk's.  ``out``: an array of n
    values of ``table``'s dtype to fill (default: a new one).
    """
    from mucsc.codec.wire import bitpack

    parts = spans(n)
    progressive = hasattr(buf, "read_to")
    if progressive and (current() <= 1 or len(parts) <= 1 or width == 0 or table.size == 0
                        or buf.nbytes != bitpack.packed_size(n, width)):
        buf, progressive = buf.complete(), False
    if width == 0 or table.size == 0 or (not progressive and len(buf) != bitpack.packed_size(n, width)):
        return _unpack_whole(buf, width, n, table, check)
    packed = buf.buffer if progressive else np.frombuffer(buf, np.uint8)
    out = _output(out, n, table.dtype)
    lookup = _ByteTable(table, width) if width in (1, 2, 4, 8) else None
    gather = _compiled_gather(lookup)

    def ids_of(s: int, e: int) -> np.ndarray:
        ids = bitpack.unpack(packed[s * width // 8: bitpack.packed_size(e, width)], width, e - s)
        if int(ids.max(initial=0)) >= table.size:
            raise check(int(ids.max()))
        return ids

    def one(s: int, e: int) -> None:
        # mode="clip": every index is in range (checked, or a byte into 256 rows), and the default
        # mode="raise" with out= would gather into a temporary and copy it (numpy buffers it)
        if lookup is None:
            np.take(table, ids_of(s, e), out=out[s:e], mode="clip")
            return
        per = lookup.per
        whole = (e - s) // per  # bytes holding per IDs each; s is a multiple of 8, so of per
        pb = packed[s // per: s // per + whole]
        if lookup.bad is not None and lookup.bad[pb].any():
            ids_of(s, e)  # raises with the chunk's largest ID
        if gather is not None:
            gather(pb, lookup.bytes, out[s: s + whole * per])
        else:
            np.take(lookup.rows, pb, out=out[s: s + whole * per].view(lookup.rows.dtype), mode="clip")
        if s + whole * per < e:  # the last byte holds fewer IDs, then zero padding bits
            out[s + whole * per: e] = table[ids_of(s + whole * per, e)]

    if not progressive:
        run_spans(one, n)
        return out
    _pipelined(buf, [bitpack.packed_size(e, width) for _, e in parts], one, parts)
    return out


def unpack_add(packed: np.ndarray, width: int, n: int, table: np.ndarray, acc: np.ndarray,
               step: int = 1 << 16) -> None:
    """``acc += table[bitpack.unpack(packed, width, n)]`` (``table`` and ``acc`` float64), in parallel
    over the fixed chunks of ``acc``, without the ID array or the gathered vector: ``step`` values at a
    time (a multiple of 8) are gathered into a small buffer, then added.  The caller has checked the
    packed bytes (length, padding) and the IDs (< ``len(table)``), as :func:`unpack_take` would."""
    from mucsc.codec.wire import bitpack

    if n == 0:
        return
    lookup = _ByteTable(table, width) if width in (1, 2, 4, 8) else None
    gather = _compiled_gather(lookup)

    def one(s: int, e: int) -> None:
        buf = np.empty(min(step, e - s), table.dtype)
        for a in range(s, e, step):  # a is a multiple of 8: its IDs start on a byte
            b = min(a + step, e)
            t = buf[: b - a]
            if lookup is None:
                ids = bitpack.unpack(packed[a * width // 8: bitpack.packed_size(b, width)], width, b - a)
                np.take(table, ids, out=t, mode="clip")
            else:
                per = lookup.per
                whole = (b - a) // per
                pb = packed[a // per: a // per + whole]
                if gather is not None:
                    gather(pb, lookup.bytes, t[: whole * per])
                else:
                    np.take(lookup.rows, pb, out=t[: whole * per].view(lookup.rows.dtype), mode="clip")
                if whole * per < b - a:  # the last byte holds fewer IDs
                    tail = a + whole * per
                    t[whole * per:] = table[bitpack.unpack(packed[tail * width // 8:], width, b - tail)]
            np.add(acc[a:b], t, out=acc[a:b])

    run_spans(one, n)


def take(table: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """``table[ids]`` for IDs known to be < ``len(table)`` (an encoder's own: ``EncodedGroup.lookup``):
    uint8 IDs through the compiled byte gather that :func:`unpack_take` uses for 8-bit IDs (numpy's
    fancy indexing converts them to intp first: 7x slower on 301k IDs), others by ``np.take``; in
    chunks on ``current()`` threads."""
    ids = np.ascontiguousarray(ids)
    out = np.empty(ids.size, table.dtype)
    lookup = _ByteTable(table, 8) if ids.dtype == np.uint8 and table.size else None
    gather = _compiled_gather(lookup)

    def one(s: int, e: int) -> None:
        if gather is not None:
            gather(ids[s:e], lookup.bytes, out[s:e])
        else:
            np.take(table, ids[s:e], out=out[s:e], mode="clip")

    if ids.size:
        run_spans(one, ids.size)
    return out


def _unpack_whole(buf: Any, width: int, n: int, table: np.ndarray, check: Callable[[int], Exception]) -> np.ndarray:
    """:func:`unpack_take` in one piece (no IDs, no table, or a length ``bitpack.unpack`` reports)."""
    from mucsc.codec.wire import bitpack

    ids = bitpack.unpack(buf, width, n)  # a bad length is reported here
    if width and int(ids.max(initial=0)) >= table.size:
        raise check(int(ids.max()))
    return table[ids] if table.size else np.empty(0, table.dtype)


def _output(out: np.ndarray | None, n: int, dtype: np.dtype) -> np.ndarray:
    """The array :func:`unpack_take` fills: ``out`` checked, or a new one.  Each chunk is written by
    the thread that computes it, so the output's pages are first touched (zeroed by the kernel) on
    all threads at once."""
    if out is None:
        return np.empty(n, dtype)
    if out.shape != (n,) or out.dtype != dtype or not out.flags.c_contiguous:
        raise ValueError(f"out must be a contiguous array of {n} {dtype} values")
    return out


def _compiled_gather(lookup: "_ByteTable | None") -> Callable | None:
    """The compiled byte gather for ``lookup`` where it applies (it reads the bytes as indices;
    numpy's take converts them to intp first), else None."""
    from mucsc.codec import kernels

    if lookup is None or lookup.bytes.size // 256 not in (1, 2, 4, 8, 16, 32, 64):
        return None
    return kernels.compiled("lookup_bytes")


class _Abandoned(Exception):
    """A consumer gave up because the producer failed (the producer's error is raised instead)."""


def _pipelined(stream: Any, needs: Sequence[int], one: Callable[[int, int], None],
               parts: Sequence[tuple[int, int]]) -> None:
    """``one(s, e)`` for every part, part i once ``stream.read_to(needs[i])`` has returned.

    Item 0 of :func:`run` is the producer (it reads the stream part by part, then takes parts like
    any other thread), items 1.. the parts, taken in order; a part whose bytes are not there yet
    waits for them on its own event (only its thread wakes when they arrive, however many threads
    wait).  :func:`run` raises the error of the lowest failing item: the stream's first."""
    ready = [threading.Event() for _ in parts]
    failed = False

    def produce() -> None:
        nonlocal failed
        try:
            for need, event in zip(needs, ready):
                stream.read_to(need)
                event.set()
        except BaseException:
            failed = True
            for event in ready:
                event.set()
            raise

    def consume(i: int) -> None:
        ready[i].wait()
        if failed:
            raise _Abandoned
        one(*parts[i])

    run(lambda i: produce() if i < 0 else consume(i), range(-1, len(parts)))


def byte_table(table: np.ndarray, width: int) -> "_ByteTable":
    """The 256-row table of the values each byte of IDs packed ``width`` (1, 2, 4, 8) bits wide holds
    (``rows``, ``bytes``, ``per``, ``bad``: see :class:`_ByteTable`)."""
    return _ByteTable(table, width)


class _ByteTable:
    """``rows[b]``: the per = 8 / width table values byte b holds (LSB first), as one item of
    per * itemsize bytes; ``bad[b]``: b holds an ID >= len(table) (None when none can)."""

    def __init__(self, table: np.ndarray, width: int):
        self.per = per = 8 // width
        index, self.bad = _byte_index(width, table.size)
        rows = np.ascontiguousarray(table[index])
        size = per * table.itemsize
        kind = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}.get(size, np.dtype((np.void, size)))
        self.rows = rows.view(kind).reshape(256)
        self.bytes = self.rows.view(np.uint8)  # the same table as 256 * size bytes


@functools.lru_cache(maxsize=64)
def _byte_index(width: int, k: int) -> tuple[np.ndarray, np.ndarray | None]:
    """(index, bad) of :class:`_ByteTable` for a table of k values: row b's IDs, clipped to k - 1,
    and which bytes hold an ID >= k (None when none can); a function of width and k only (every
    decode of a small group of packed IDs would build it again: ~5 us)."""
    ids = (np.arange(256)[:, None] >> (np.arange(8 // width) * width)) & ((1 << width) - 1)
    valid = ids < k
    bad = None if valid.all() else ~valid.all(axis=1)
    index = np.minimum(ids, k - 1)
    for a in (index, bad):
        if a is not None:
            a.setflags(write=False)
    return index, bad


def crc32_update(data: Any, crc: int = 0) -> int:
    """``zlib.crc32(data, crc)`` on the calling thread: the compiled kernel where built (carry-less
    multiplication, ~5x zlib 1.2's table CRC), else zlib; every CRC of a message goes through here
    or :func:`crc32`."""
    one = kernels.compiled("crc32")
    return one(data, crc) if one is not None else zlib.crc32(data, crc)


def crc32(data: memoryview, crc: int = 0) -> int:
    """``zlib.crc32(data, crc)`` (``crc``: the running CRC of what came before), over ``current()``
    equal parts in parallel for large data (both release the GIL), the parts' CRCs joined with
    :func:`crc32_combine`.  The compiled kernel where built (carry-less multiplication, ~5x zlib 1.2's
    table CRC), else zlib."""
    return _crc_parts(len(data), crc, lambda a, b, c: crc32_update(data[a:b], c))


def _crc_parts(n: int, crc: int | None, span: Callable[[int, int, int | None], int | None],
               align: int = 1, nbytes: Callable[[int, int], int] | None = None) -> int | None:
    """``span(a, b, init)`` over ``current()`` equal parts [a, b) of ``range(n)`` (multiples of
    ``align``), each returning the CRC of its bytes continued from ``init`` (the running ``crc``
    for the first part, 0 for the others; None throughout when ``crc`` is None), joined in order
    with :func:`crc32_combine`.  ``nbytes(a, b)``: the bytes of part [a, b) (default b - a).
    Small inputs or one thread: a single span."""
    t = current()
    if t <= 1 or n < 2 * CHUNK:
        return span(0, n, crc)
    step = -(-n // t)
    step += (-step) % align
    cuts = range(0, n, step)
    crcs = run(lambda a: span(a, min(a + step, n), None if crc is None else (crc if a == 0 else 0)), cuts, t)
    if crc is None:
        return None
    crc = crcs[0]
    for a, c in zip(cuts[1:], crcs[1:]):
        b = min(a + step, n)
        crc = crc32_combine(crc, c, nbytes(a, b) if nbytes is not None else b - a)
    return crc


# CRC-32 (reflected polynomial 0xEDB88320) arithmetic modulo P, as zlib's crc32_combine does it:
# crc(A + B) = crc(A) * x^(8 len B) + crc(B) over GF(2), with x^(2^k) mod P from a table.
_CRC_POLY = 0xEDB88320


def _multmodp(a: int, b: int) -> int:
    """a * b modulo P (bit 31 is x^0)."""
    m, p = 1 << 31, 0
    while True:
        if a & m:
            p ^= b
            if a & (m - 1) == 0:
                return p
        m >>= 1
        b = (b >> 1) ^ _CRC_POLY if b & 1 else b >> 1


_X2N = [1 << 30]  # x^(2^k) mod P: x^1, x^2, x^4, ...
for _ in range(31):
    _X2N.append(_multmodp(_X2N[-1], _X2N[-1]))


def x8n(n: int) -> int:
    """x^(8 n) modulo P: what a CRC register is multiplied by when n zero bytes follow."""
    p, k = 1 << 31, 3  # the product of x^(2^k) over the set bits of n, k >= 3
    while n:
        if n & 1:
            p = _multmodp(_X2N[k & 31], p)
        n >>= 1
        k += 1
    return p


def crc32_shift(crc: int, n: int) -> int:
    """The CRC-32 register ``crc`` advanced over n zero bytes (no pre- or post-inversion): the
    linear map that moves a part's CRC past the bytes that follow it."""
    return _multmodp(x8n(n), crc)


def crc32_combine(crc1: int, crc2: int, len2: int) -> int:
    """The CRC-32 of A followed by B from crc1 = crc(A), crc2 = crc(B) and B's length (zlib's
    ``crc32_combine``, which Python's zlib does not expose)."""
    return crc32_shift(crc1, len2) ^ crc2


# Bytes copied, then checksummed while they are still in the core's cache (L2 holds 512 KiB or more).
COPY_PIECE = 1 << 18


def _copy_span(src: np.ndarray, out: np.ndarray, crc: int | None) -> int | None:
    """``out[:] = src`` piece by piece, each piece's CRC taken right after it was copied."""
    for a in range(0, src.size, COPY_PIECE):
        piece = out[a: a + COPY_PIECE]
        piece[...] = src[a: a + COPY_PIECE]
        if crc is not None:
            crc = crc32_update(piece, crc)
    return crc


def copy_crc32(src: Any, out: Any, crc: int | None = 0) -> int | None:
    """Copy the bytes of ``src`` into the writable buffer ``out`` (the same length) and return
    ``zlib.crc32(src, crc)``, in one pass: each 256 KiB piece is checksummed right after it was
    copied, while it is in cache (the message writer's copy and CRC were two passes before).
    ``crc=None``: copy only, returns None.  Large buffers go in equal parts on ``current()``
    threads (a copy into fresh memory also faults its pages in on all of them)."""
    if not isinstance(src, np.ndarray) and not isinstance(out, np.ndarray):
        ms, mo = memoryview(src).cast("B"), memoryview(out).cast("B")
        if ms.nbytes <= COPY_PIECE:  # one piece: a slice copy and zlib, without the numpy views
            if ms.nbytes != mo.nbytes:  # (~1 us instead of ~10: a message writes ~11 small parts)
                raise ValueError(f"copy_crc32: {ms.nbytes} bytes into a buffer of {mo.nbytes}")
            mo[:] = ms
            return None if crc is None else crc32_update(mo, crc)
    s, o = np.frombuffer(src, np.uint8), np.frombuffer(out, np.uint8)
    if s.size != o.size:
        raise ValueError(f"copy_crc32: {s.size} bytes into a buffer of {o.size}")
    return _crc_parts(s.size, crc, lambda a, b, c: _copy_span(s[a:b], o[a:b], c), COPY_PIECE)


def zstd_compressor(level: int, threads: int):
    """A zstd compressor whose output depends on the data and ``level`` only, never on ``threads``.

    zstd's single-threaded mode (nbWorkers = 0) and its multi-threaded mode (nbWorkers >= 1) write
    different frames, but the multi-threaded mode cuts the input into jobs of a size set by the level
    (4 MiB at level 3) and writes the same single frame for any nbWorkers >= 1 (facebook/zstd#2238;
    #2327, fixed in zstd 1.4.7, made the one-shot path obey this too).  So the reference writer always
    uses the multi-threaded mode with at least one worker.  Inputs of at most one job come out
    byte-identical to the single-threaded mode (every spec vector is far smaller).
    """
    key = (int(level), max(1, int(threads)))
    cache = _ZSTD.compressors  # this thread's
    cctx = cache.get(key)
    if cctx is None:
        import zstandard

        if len(cache) >= _ZSTD_KEEP:  # the oldest goes (dicts keep insertion order)
            del cache[next(iter(cache))]
        cctx = cache[key] = zstandard.ZstdCompressor(level=key[0], write_content_size=True, write_checksum=False,
                                                     threads=key[1])
    return cctx


# Each thread's compressors by (level, threads), reused: a compressor is not safe to share between
# threads, every caller makes one-shot ``compress`` calls (a frame depends on the input and level
# only), and making one costs ~5 us and a worker thread, twice per encode call.  At most _ZSTD_KEEP
# per thread, so that contexts of levels no longer used do not keep their buffers.
class _ThreadCompressors(threading.local):
    """Each thread's zstd compressors by (level, threads): a zstd context serves one thread at a time."""

    def __init__(self) -> None:
        self.compressors: dict[tuple[int, int], Any] = {}


_ZSTD = _ThreadCompressors()
_ZSTD_KEEP = 4
