"""Streamed encoding: a checkpoint read, encoded and written one tensor at a time.

:func:`encode_to` takes a :class:`TensorSource` (names, dtypes and shapes known up front, each
tensor's values read on demand: a memory-mapped or ``pread`` safetensors file, a zip member) and
writes the message to a binary file.  Each tensor is read, its carrier chosen by the
:class:`~mucsc.codec.api.policy.Policy` (the same per-tensor decision :func:`mucsc.encode` makes),
encoded, and its sections appended to a scratch spool (:class:`~mucsc.codec.wire.container.MessageSpool`)
before the next window of tensors is read; the HEAD that lists the groups is written at the end, then
the spool is copied after it.  Peak memory is about the largest tensor (as float32) times the codec's
working factor, plus one window of small tensors (:data:`WINDOW_BYTES`), plus the pooled small tensors
(1-D norms and biases, at most POOL_MAX_BYTES each): not the model.

Bytes: the groups, their parameters and payloads are those of :func:`mucsc.encode` with the same
policy, codec and seed; only two things differ, both decoding to the same values: a lossless pool's
sections come after the coded groups (they are complete only at the end), and a tensor that the
policy carries as fp16 or raw and that is larger than ``POOL_MAX_BYTES`` gets an fp16/raw group of its
own instead of joining the pool (a pool held in memory would grow with the model).

**The hook for budgets** (``--bits`` / ``--size``): a budget is split across all tensors, so the
per-tensor decision cannot be made from one tensor.  A two-phase planner runs its pass 1 itself
(``source.read(i)`` for each i, keeping a small summary per tensor), plans, and passes
``choose=lambda i, t: ...`` returning each tensor's decision in the policy's terms: ``"raw"``,
``"fp16"``, or ``Planned(fixed_codec, (i,))`` (no encoding: the writer encodes tensor ``i`` once with
that codec and group ``gi``'s generator, as :func:`mucsc.encode` does).  Pass 2 is this function
reading each tensor again.  Without ``choose``, a codec that sets a message-wide goal is refused here
(:class:`ParameterError`): :func:`mucsc.encode` plans it over the tensors held in memory.
"""

from __future__ import annotations

import dataclasses
import math
import tempfile
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from mucsc.codec import parallel, ratecontrol
from mucsc.codec.api import messages as api
from mucsc.codec.api.policy import POOL_MAX_BYTES, Planned, Policy
from mucsc.codec.backends.tensors import Tensor, name_label, to_tensor
from mucsc.codec.codecs.base import Codec, codec_class, get_codec
from mucsc.codec.wire import container as fmt
from mucsc.errors import InputError, ParameterError

__all__ = ["TensorSource", "encode_to", "streamable", "WINDOW_BYTES"]

# Tensors smaller than parallel.GROUP_PARALLEL_MAX elements are read and encoded side by side in
# windows of at most this many bytes (as float32); a larger tensor is a window of its own, with every
# thread inside its codec.  The window bounds what is held across threads: its tensors and their
# encodings stay until the window is spooled (a window of 1M-element tensors at 64 MiB held 110 MB).
WINDOW_BYTES = 16 << 20
# Tensors of at least GROUP_PARALLEL_MAX elements are read and encoded side by side too, one per
# thread, up to this many bytes (as float32) in a window: most of a large tensor's encode runs on one
# thread (the nearest-level pass, the rANS coder), so alone it left the other cores idle.  The
# largest tensors (an embedding of 32.8M elements: 131 MB) stay alone: the peak is not raised.
LARGE_WINDOW_BYTES = 64 << 20


class TensorSource(Protocol):
    """Named tensors known up front and read one at a time (what :func:`encode_to` streams from).

    ``entries[i]``: (name, record dtype as in FORMAT.md 2.4, shape).  ``read(i)``: tensor i's values,
    a numpy array of that dtype and shape (bfloat16: its uint16 bit patterns) or a torch tensor; it
    may be called more than once for the same i (a two-phase planner reads every tensor twice)."""

    entries: Sequence[tuple[str, str, tuple[int, ...]]]

    def read(self, i: int) -> Any: ...


Choose = Callable[[int, Tensor], "str | Planned"]


def streamable(codec: Codec) -> bool:
    """Whether :func:`encode_to` encodes with ``codec`` without a budget planner's ``choose``: a codec
    that sets no budget over the whole message (``bits=`` / ``size=``)."""
    return not ratecontrol.needs_plan(codec)


def encode_to(out: Any, source: TensorSource, codec: str | Codec = "mucsc", *, policy: Policy,
              seed: int = 0, compress: str | int = "auto", meta: Mapping[str, str] | None = None,
              key: Any = None, key_id: str | None = None, context: bytes | str | None = None,
              threads: int = 1, progress: api.Progress | None = None, container: str = "dict",
              choose: Choose | None = None, spool_dir: str | None = None,
              **params: Any) -> api.EncodeStats:
    """Encode ``source`` tensor by tensor into the binary file ``out`` (see the module docstring);
    returns the statistics :func:`mucsc.encode_with_stats` would.  ``container="tensor"``: the source
    holds one bare array.  ``spool_dir``: where the scratch spool lives (an unnamed temporary file;
    default: the system's temporary directory; put it on the output's file system).  ``choose``:
    the budget planner's per-tensor decisions (module docstring).  The rest as :func:`mucsc.encode`."""
    api._check_progress(progress)
    if not isinstance(policy, Policy):
        raise ParameterError("streamed encoding groups tensor by tensor: it needs a mucsc.Policy")
    with parallel.using(threads) as nthreads:
        level = api._zstd_level(compress)
        codec_obj = api._container_codec(codec, params, compressing=level is not None)
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise ParameterError(f"seed must be a non-negative integer, got {seed!r}")
        policy.check_codec(codec_obj)
        if choose is None and ratecontrol.needs_plan(codec_obj):
            raise ParameterError(f"codec {codec_obj.name!r} sets a budget for the whole message: streamed "
                                 "encoding needs the budget planner's per-tensor choices (choose=)")
        req = api._Request(codec_obj, int(seed), False, level, api.check_meta(meta), policy,
                           api._signer(key, key_id, context), nthreads, True, progress)
        records = _records(source, container)
        with tempfile.TemporaryFile(dir=spool_dir) as spool:
            writer = _StreamWriter(source, records, req, choose, fmt.MessageSpool(spool, level, nthreads))
            return writer.run(out, container)


def _records(source: TensorSource, container: str) -> tuple[fmt.Record, ...]:
    if container not in ("dict", "tensor"):
        raise ParameterError(f"container must be 'dict' or 'tensor', got {container!r}")
    entries = list(source.entries)
    if not entries:
        raise InputError("nothing to encode: the source holds no tensors")
    if container == "tensor" and len(entries) != 1:
        raise ParameterError(f"a bare array is one tensor; the source holds {len(entries)}")
    records = tuple(fmt.Record(str(n), str(d), tuple(int(s) for s in shape)) for n, d, shape in entries)
    bad = [r for r in records if r.dtype not in fmt.RECORD_DTYPES]
    if bad:
        raise InputError(f"{name_label(bad[0].name)}: dtype {bad[0].dtype} cannot be encoded")
    api._check_header_limits(records)
    return records


@dataclasses.dataclass
class _Pending:
    """A group whose members are known and whose encoding is done or to do."""

    codec: Codec
    members: list[int]
    encoded: Any = None


class _StreamWriter:
    """One :func:`encode_to` call: windows of tensors read, chosen, encoded, spooled."""

    def __init__(self, source: TensorSource, records: tuple[fmt.Record, ...], req: api._Request,
                 choose: Choose | None, spool: fmt.MessageSpool) -> None:
        self.source, self.records, self.req, self.spool = source, records, req, spool
        self.choose = choose or (lambda i, t: req.policy.choose(i, t, req.codec, req.seed, self.fp16))
        self.raw, self.fp16 = get_codec("raw"), get_codec("fp16")
        self.groups: dict[int, fmt.Group] = {}
        self.pools: dict[str, int] = {}  # pool key ("fp16" or a raw dtype) -> its group index
        self.pending: dict[int, _Pending] = {}  # pools, written at the end
        self.held: dict[int, Tensor] = {}  # pooled tensors' values
        self.gstats: dict[int, api.GroupStats] = {}
        self.errors: dict[int, tuple[float | None, float]] = {}
        self.reporter = api._Reporter(req.progress, sum(r.size for r in records))
        self.count = 0  # groups numbered so far

    def run(self, out: Any, container: str) -> api.EncodeStats:
        for window in _windows([r.size * 4 for r in self.records], [r.size for r in self.records],
                               self.req.threads):
            self._window(window)
        for gi in sorted(self.pending):  # the pools, complete now
            self._emit(gi, self.pending.pop(gi), self.held)
        self.held.clear()
        groups = tuple(self.groups[gi] for gi in range(len(self.groups)))
        header = fmt.Header(self.records, groups, container, self.req.meta)
        head = api._check_header(header)
        minor = max((codec_class(g.codec).format_minor(g.params) for g in groups), default=0)
        size = self.spool.finish(out, header, minor=max(minor, api._minor_needed(header)), auth=self.req.signer,
                                 head=head)
        self.reporter.finish()
        return self._stats(size, header)

    def _window(self, window: list[int]) -> None:
        """Read and choose the window's tensors side by side, number their groups in record order,
        encode the new groups side by side, spool them in group order."""
        chosen = parallel.run(self._read_and_choose, window) if len(window) > 1 else [
            self._read_and_choose(window[0])]
        fresh: list[tuple[int, _Pending, dict[int, Tensor]]] = []
        for i, (t, choice) in zip(window, chosen):
            if isinstance(choice, Planned):
                gi = self._new_group()
                fresh.append((gi, _Pending(choice.codec, [i], choice.encoded), {i: t}))
            elif choice in ("raw", "fp16"):
                carrier = self.fp16 if choice == "fp16" else self.raw
                if self.records[i].nbytes > POOL_MAX_BYTES:
                    fresh.append((self._new_group(), _Pending(carrier, [i]), {i: t}))
                else:
                    self._pool(i, t, choice if choice == "fp16" else self.records[i].dtype, carrier)
            else:
                raise ParameterError(f"choose() returned {choice!r} for tensor {i}: 'raw', 'fp16' or a Planned")
        del chosen
        run = parallel.run if len(fresh) > 1 else lambda f, items: [f(it) for it in items]
        done = run(lambda item: self._encode(*item), fresh)
        for (gi, _, _), (group, secs) in zip(fresh, done):
            self._spool(gi, group, secs)
        self.reporter.add(sum(self.records[i].size for i in window))

    def _read_and_choose(self, i: int) -> tuple[Tensor, Any]:
        t = _tensor(self.records[i], self.source.read(i))
        return t, self.choose(i, t)

    def _new_group(self) -> int:
        """The next group index: groups are numbered as their first member is read (record order)."""
        self.count += 1
        return self.count - 1

    def _pool(self, i: int, t: Tensor, key: str, carrier: Codec) -> None:
        gi = self.pools.get(key)
        if gi is None:
            gi = self.pools[key] = self._new_group()
            self.pending[gi] = _Pending(carrier, [])
        self.pending[gi].members.append(i)
        self.held[i] = t

    def _encode(self, gi: int, p: _Pending, tensors: Mapping[int, Tensor]) -> tuple[fmt.Group, list]:
        ready = {gi: p.encoded} if p.encoded is not None else {}
        group, secs, gstat, errs = api._encode_group(gi, {gi: (p.codec, p.members)}, ready, tensors, self.req)
        self.gstats[gi] = gstat
        self.errors.update(errs)
        return group, secs

    def _emit(self, gi: int, p: _Pending, tensors: Mapping[int, Tensor]) -> None:
        self._spool(gi, *self._encode(gi, p, tensors))

    def _spool(self, gi: int, group: fmt.Group, secs: list) -> None:
        for g, tag, data, compressible in secs:
            self.spool.add(g, tag, data, compressible)
        self.groups[gi] = group

    def _stats(self, size: int, header: fmt.Header) -> api.EncodeStats:
        records = header.records
        tstats: list[api.TensorStats | None] = [None] * len(records)
        for gi, g in enumerate(header.groups):
            n = sum(records[i].size for i in g.records)
            bits = 8 * self.spool.group_bytes.get(gi, 0) / n if n else None
            for i in g.records:
                rel, err = self.errors[i]
                tstats[i] = api.TensorStats(records[i].name, records[i].dtype, records[i].shape, g.codec, gi,
                                            bits, rel, err)
        gstats = tuple(self.gstats[gi] for gi in range(len(header.groups)))
        return api.EncodeStats(size, sum(r.nbytes for r in records), sum(r.size for r in records), gstats,
                               tuple(tstats))


def _windows(nbytes: Sequence[int], sizes: Sequence[int], threads: int = 1) -> list[list[int]]:
    """Consecutive tensor indices in windows: small tensors together up to WINDOW_BYTES; tensors of
    at least GROUP_PARALLEL_MAX elements together up to ``threads`` of them and LARGE_WINDOW_BYTES
    (alone when one thread, or when larger: then its codec uses every thread)."""
    out: list[list[int]] = []
    cur: list[int] = []
    held, large = 0, False
    for i, (b, n) in enumerate(zip(nbytes, sizes)):
        big = n >= parallel.GROUP_PARALLEL_MAX
        cap, most = (LARGE_WINDOW_BYTES, threads) if big else (WINDOW_BYTES, len(nbytes))
        if cur and (big != large or held + b > cap or len(cur) >= most):
            out.append(cur)
            cur, held = [], 0
        cur.append(i)
        held, large = held + b, big
    if cur:
        out.append(cur)
    return out


def _tensor(rec: fmt.Record, value: Any) -> Tensor:
    """The source's tensor as the encoder takes it, checked against the entry it was announced as."""
    if rec.dtype == "bfloat16" and isinstance(value, np.ndarray):
        if value.dtype != np.uint16:
            raise InputError(f"{name_label(rec.name)}: bfloat16 values must come as uint16 bit patterns, "
                             f"got {value.dtype}")
        t = Tensor(rec.name, "bfloat16", np.ascontiguousarray(value))
    else:
        t = to_tensor(rec.name, value)
    shape = tuple(int(s) for s in t.array.shape)
    if t.dtype != rec.dtype or math.prod(shape) != rec.size or shape != rec.shape:
        raise InputError(f"{name_label(rec.name)}: read as {t.dtype} {list(shape)}, announced as {rec.dtype} "
                         f"{list(rec.shape)}")
    return t
