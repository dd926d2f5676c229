"""A torch DDP communication hook that sends each gradient bucket as a mucsc message.

    >>> from mucsc.ddp import MucscHookState, mucsc_hook
    >>> state = MucscHookState(process_group=None, codec="mucsc", z=16)
    >>> ddp_model.register_comm_hook(state, mucsc_hook)

Per bucket, from iteration ``start_iter`` on: every rank encodes its gradient bucket, the ranks
all-gather one slot each (the message's length and the message, padded to a size all ranks know: the
longest message of the bucket's previous iteration plus a slack), and every rank averages the decoded
messages in rank order (its own decode read from its encoder, see below).  All ranks sum the same
decoded values with the same arithmetic in the same order, so the replicas stay bitwise identical.  Before ``start_iter`` the hook is a plain
averaging allreduce: DDP rebuilds its buckets after the first iteration, and per-bucket error feedback
needs stable buckets.  Each bucket has its own :class:`mucsc.Compressor`: biased codecs (top-k,
signSGD, B-MUCSC, ...) get per-bucket error feedback (what the other ranks did not receive is added
to that bucket's next gradient), and ``dgc`` its momentum correction and masking (``momentum=``).
The hook returns a pending future: one worker thread per state encodes, gathers and decodes the buckets
in the order DDP hands them over (the same on every rank, so the collectives match), while backward
goes on computing the next buckets; DDP waits for the futures only at the end of backward.  The
iteration's last bucket (``bucket.is_last()``: no backward left to overlap) runs in the hook once the
worker is done, which spares a thread wake-up and a GIL handoff (2.8 ms median from hook entry to
encode start on the worker, 0.3 ms inline, on 2 shared cores).
A rank does not decode its own message: the encoder's lookup (levels and IDs) gives what its peers
decode from it, bit for bit (:meth:`mucsc.Compressor.compress_decoded`: one gather, 0.08 ms against a
0.5 ms decode of a 301k-float bucket); an inline bucket on the host is encoded where it lies (no copy),
and the rank-order sum is written straight into the bucket's buffer.

Encoding settings the hook chooses unless given (what is cheapest per step at about the same bytes):
zstd level 1 (``compress=1``) and, for codecs with an ``id_coding`` parameter, packed IDs
(``id_coding="packed"``): on a 301k-float gradient bucket at z=16 that skips the lane coder and its zstd
comparison and saves ~1.5 ms of the ~12 ms encode, at 1 % fewer bytes than the codec's defaults (0.4 %
more on i.i.d. Gaussian data, where lane coding wins).  A goal (bits= / size= / max_error=) then weighs
packed IDs only; pass ``id_coding="auto"`` (and ``compress="auto"``) for the codec's own defaults.

When it pays: a ring allreduce sends about 2 (P - 1) / P bucket sizes from each of P ranks; the
all-gather sends P - 1 message sizes.  With compression ratio R the hook moves fewer bytes when
P < 2 R, and it saves time only when the links, not the codec (tens of MB/s per core) or the P decodes
per bucket, are the bottleneck: few ranks on slow links.  On fast local links allreduce wins.
See docs/integrations.md for a measurement.
Only the public ``mucsc`` API is used.  (No ``from __future__ import annotations`` here: DDP checks
the hook's annotations against the real ``dist.GradBucket`` and ``Future[Tensor]`` objects.)
"""

import concurrent.futures
import dataclasses
import threading
from typing import Any

import numpy as np

try:
    import torch
    import torch.distributed as dist
except ImportError as exc:  # the hook is only for torch users; say what is missing
    raise ImportError("mucsc.ddp needs torch (pip install torch)") from exc

import mucsc
from mucsc import heap


@dataclasses.dataclass
class HookStats:
    """Bytes of this rank, by phase.  ``message_bytes``: its mucsc messages (what the codec produced);
    ``sent_bytes``: its contribution to the all-gathers (the 8-byte length and the message padded to
    the slot, plus what overflowed the slot; a ring all-gather forwards P - 1 such pieces through every
    rank);
    ``allreduce_bytes``: bucket bytes of the plain allreduce iterations before ``start_iter``."""

    message_bytes: int = 0
    sent_bytes: int = 0
    allreduce_bytes: int = 0
    compressed_buckets: int = 0
    raw_bucket_bytes: int = 0  # uncompressed size of the compressed buckets, for the ratio

    @property
    def ratio(self) -> float:
        return self.raw_bucket_bytes / self.message_bytes if self.message_bytes else float("nan")


class MucscHookState:
    """State of :func:`mucsc_hook`: codec, seeds, iteration counter, per-bucket residuals, byte counts.

    ``process_group``: the group DDP averages over (None: the default group).  ``codec`` and ``params``
    (e.g. ``z=16``) are passed to :func:`mucsc.encode`; ``seed`` makes every message reproducible
    (message seed = f(seed, iteration, bucket, rank)).  ``error_feedback=None`` enables it exactly for
    biased lossy codecs.  ``start_iter`` (>= 2 with error feedback) iterations use plain allreduce.
    ``overlap`` (default): compressed buckets run on a worker thread, so encoding and the all-gathers
    overlap the rest of backward, except an iteration's last bucket (nothing left to overlap), which
    runs inside the hook once the worker is done; False runs every bucket inside the hook (the future
    is already complete).
    ``compress`` (default zstd level 1) and, unless given, ``id_coding="packed"`` are the hook's
    per-step choices (see the module's docstring).  ``codec`` may be a :class:`mucsc.Settings` instead
    (codec, parameters, seed, compress, error feedback; taken as they are); bad settings raise
    :class:`mucsc.SettingsError`.  ``keep_heap`` (default) calls
    :func:`mucsc.heap.keep_freed_memory` for the training process, so that each step's encode does
    not page-fault its temporaries in again (``heap_kept``: whether the C library took it).
    """

    def __init__(self, process_group: Any = None, codec: str = "mucsc", seed: int = 0, start_iter: int = 2,
                 *, error_feedback: bool | None = None, compress: str | int = 1, overlap: bool = True,
                 keep_heap: bool = True, **params: Any) -> None:
        if isinstance(codec, mucsc.Settings):  # the whole configuration (the hook's defaults do not apply)
            settings = codec
            codec, params = settings.codec, dict(settings.params)
            seed, compress, error_feedback = settings.seed, settings.compress, settings.error_feedback
            probe = mucsc.Compressor(settings)
        else:
            params = _hook_defaults(codec, params)
            # the codec, its parameters, its memory's options (e.g. DGC's momentum), the seed and the zstd
            # level, checked as every API checks them (mucsc.Settings: a SettingsError)
            probe = mucsc.Compressor(codec, error_feedback=error_feedback, compress=compress, seed=seed, **params)
        self.settings = probe.settings
        self.error_feedback = probe.error_feedback
        if isinstance(start_iter, bool) or not isinstance(start_iter, int) or start_iter < 0:
            raise mucsc.ParameterError(f"start_iter must be a non-negative integer, got {start_iter!r}")
        if self.error_feedback and start_iter < 2:
            raise mucsc.ParameterError("with error feedback start_iter must be >= 2: DDP rebuilds its buckets "
                                       "after the first iteration, so residuals kept per bucket would not match")
        self.process_group = process_group
        self.codec, self.params, self.seed, self.start_iter = codec, dict(params), seed, start_iter
        self.compress = compress
        self.overlap = bool(overlap)
        self.lock = threading.Lock()  # the stats, written by the worker, read by the training loop
        self._worker: concurrent.futures.ThreadPoolExecutor | None = None
        self.pending: concurrent.futures.Future | None = None  # the worker's last job
        self.iter = 0
        self.compressors: dict[int, Any] = {}  # per bucket index: codec + error-feedback memory
        self.slots: dict[int, tuple[int, int]] = {}  # per bucket index: the all-gather slot's bytes, slack
        self.stats = HookStats()
        # the encodes' temporaries stay mapped between steps (mucsc.heap: 3.04x -> 2.20x allreduce)
        self.heap_kept = heap.keep_freed_memory() if keep_heap else False

    @property
    def residuals(self) -> dict[int, np.ndarray]:
        """What error feedback still owes the other ranks, per bucket index (empty without it)."""
        return {i: c.residual[""] for i, c in self.compressors.items() if "" in c.residual}

    def worker(self) -> concurrent.futures.ThreadPoolExecutor:
        """The one thread that runs the compressed buckets in hook order (made on first use)."""
        if self._worker is None:
            self._worker = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="mucsc-ddp")
        return self._worker

    def drain(self) -> None:
        """Wait until the worker has run every bucket handed to it (their futures are set)."""
        if self.pending is not None:
            self.pending.result()  # complete() never raises: errors go to the bucket's future
            self.pending = None

    def close(self) -> None:
        """Stop the worker thread (after the last iteration; a later hook call starts a new one)."""
        if self._worker is not None:
            self._worker.shutdown(wait=True)
            self._worker = None
        self.pending = None

    def message_seed(self, bucket_index: int, rank: int, iteration: int | None = None) -> int:
        """The encoder seed of one message: distinct per iteration (default: the current one), bucket
        and rank, reproducible."""
        it = self.iter if iteration is None else iteration
        ss = np.random.SeedSequence([self.seed, it, bucket_index, rank])
        return int(ss.generate_state(2, np.uint64)[0] >> np.uint64(1))

    def encode_bucket(self, flat: np.ndarray, bucket_index: int, rank: int, iteration: int | None = None) -> bytes:
        """This rank's message for one bucket (float32/64 vector) in ``iteration`` (default: the current
        one), through the bucket's own :class:`mucsc.Compressor` (its error-feedback memory; DGC's
        momentum follows the iteration)."""
        it = self.iter if iteration is None else iteration
        return self.compressor(bucket_index, flat).compress(flat, self.message_seed(bucket_index, rank, it), epoch=it)

    def encode_bucket_decoded(self, flat: np.ndarray, bucket_index: int, rank: int,
                              iteration: int | None = None) -> tuple[bytes, np.ndarray]:
        """:meth:`encode_bucket` and what every rank decodes from the message, bit for bit
        (:meth:`mucsc.Compressor.compress_decoded`: read from the encoder's lookup where the codec
        kept one, a gather instead of a decode)."""
        it = self.iter if iteration is None else iteration
        comp = self.compressor(bucket_index, flat)
        return comp.compress_decoded(flat, self.message_seed(bucket_index, rank, it), epoch=it)

    def compressor(self, bucket_index: int, flat: np.ndarray) -> Any:
        """The bucket's own :class:`mucsc.Compressor` (made on first use); an InputError when the
        bucket no longer has the size its error-feedback residual was kept for."""
        comp = self.compressors.get(bucket_index)
        if comp is None:
            comp = self.compressors[bucket_index] = mucsc.Compressor(
                self.codec, error_feedback=self.error_feedback, compress=self.compress, **self.params)
        r = comp.residual.get("")
        if r is not None and r.shape != flat.shape:
            raise mucsc.InputError(f"bucket {bucket_index} changed size ({r.shape[0]} -> {flat.shape[0]}); "
                                   "was start_iter reached before DDP rebuilt its buckets?")
        return comp


def _hook_defaults(codec: Any, params: dict[str, Any]) -> dict[str, Any]:
    """``params`` plus packed IDs where the codec has an ``id_coding`` parameter the user left out and
    accepts packed IDs with the other parameters (dithered rounding, for one, does not)."""
    if "id_coding" in params or isinstance(codec, mucsc.Codec):  # a Codec object carries its own choice
        return dict(params)
    try:
        if "id_coding" not in mucsc.codec_class(codec).param_specs():
            return dict(params)
        mucsc.Compressor(codec, **params, id_coding="packed")
    except mucsc.MucscError:  # an unknown codec or parameters refused: the constructor says why below
        return dict(params)
    return {**params, "id_coding": "packed"}


def mucsc_hook(state: "MucscHookState", bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: average the bucket over the group through mucsc messages.

    Returns at once with a pending future: the bucket's values are copied out, and encoding, the
    all-gather and the decodes run on the state's worker thread while backward goes on producing the
    next buckets; DDP waits on the future only at the end of backward.  The iteration's last bucket
    runs in the hook itself, after the worker's buckets."""
    group = state.process_group if state.process_group is not None else dist.group.WORLD
    world = dist.get_world_size(group)
    buf = bucket.buffer()
    try:
        if state.iter < state.start_iter:
            state.stats.allreduce_bytes += buf.numel() * buf.element_size()
            buf.div_(world)
            return (dist.all_reduce(buf, group=group, async_op=True).get_future()
                    .then(lambda fut: fut.value()[0]))
        work_dtype = torch.float64 if buf.dtype == torch.float64 else torch.float32
        inline = not state.overlap or bucket.is_last()
        # inline, a host bucket of the working dtype is encoded where it is (its sum is written there
        # only after the encode); else a copy taken now: the worker must not read a buffer DDP may
        # reuse once the future is done
        flat = _host_view(buf, np.dtype(np.float64 if work_dtype == torch.float64 else np.float32)) if inline else None
        if flat is None:
            flat = buf.detach().to("cpu", work_dtype, copy=True).numpy()
        # the iteration is taken now: the worker may run after this hook has advanced state.iter
        job = _BucketJob(state, flat, bucket.index(), dist.get_rank(group), state.iter, group, world, buf)
        if inline:
            # the last bucket of an iteration has no backward left to overlap: it runs here, after the
            # worker's jobs (collectives in hook order), sparing a thread wake-up and a GIL handoff
            state.drain()
            return _done(job.run())
        fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
        state.pending = state.worker().submit(job.complete, fut)
        return fut
    finally:
        if bucket.is_last():  # bucket 0 is the last one reduced in an iteration
            state.iter += 1


def _done(tensor: torch.Tensor) -> torch.futures.Future[torch.Tensor]:
    fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    fut.set_result(tensor)
    return fut


@dataclasses.dataclass
class _BucketJob:
    """One bucket's compressed average: encode, all-gather the messages, decode, average.

    Collectives of one process group must be issued in the same order on every rank: the state's one
    worker thread runs the jobs in the order DDP calls the hook, which is the same on every rank."""

    state: "MucscHookState"
    flat: np.ndarray
    index: int
    rank: int
    iteration: int
    group: Any
    world: int
    buf: torch.Tensor

    def complete(self, fut: torch.futures.Future[torch.Tensor]) -> None:
        try:
            fut.set_result(self.run())
        except BaseException as exc:  # noqa: BLE001 - surfaces in DDP's wait on the future
            fut.set_exception(exc)

    def run(self) -> torch.Tensor:
        state, flat, buf = self.state, self.flat, self.buf
        # this rank's message and what every rank decodes from it (the encoder's lookup: no decode)
        blob, mine = state.encode_bucket_decoded(flat, self.index, self.rank, self.iteration)
        mine = self.checked(mine, self.rank)
        # no codec's message for a bucket comes near twice its raw bytes plus framing (flat may be the
        # bucket itself: the sum below overwrites its values, not its size or dtype)
        limit = 2 * flat.nbytes + (1 << 20)
        messages, sent = _gather_messages(blob, state.slots, self.index, limit, self.world, self.group, buf.device)
        # Every rank sums the same decoded values in rank order with the same float arithmetic (a rank's
        # own lookup is what its peers decode from the gathered bytes): identical replicas.  The first
        # two are added straight into the target (no copy of the first), the rest in place.
        total, in_place = _sum_target(buf, flat.dtype)
        first = None
        for r, message in enumerate(messages):
            decoded = mine if r == self.rank else self.decode(message, r)
            if r == 0:
                first = decoded
            else:
                np.add(first if r == 1 else total, decoded, out=total)
        if self.world == 1:
            np.copyto(total, first)
        if self.world & (self.world - 1):
            np.divide(total, self.world, out=total)
        else:  # a power of two: x * 2^-k is x / 2^k bit for bit (one exact scaling, rounded once), 2.5x faster
            np.multiply(total, total.dtype.type(1 / self.world), out=total)
        with state.lock:
            st = state.stats
            st.message_bytes += len(blob)
            st.sent_bytes += sent
            st.compressed_buckets += 1
            st.raw_bucket_bytes += buf.numel() * buf.element_size()
        if not in_place:
            buf.copy_(torch.from_numpy(total))
        return buf

    def decode(self, message: Any, rank: int) -> np.ndarray:
        """Rank ``rank``'s message for this bucket, as the bucket's dtype."""
        # a peer's message must hold exactly this bucket's values: that bounds what decoding allocates
        return self.checked(mucsc.decode(message, max_elements=self.flat.size, max_expansion=None), rank)

    def checked(self, decoded: np.ndarray, rank: int) -> np.ndarray:
        """Rank ``rank``'s decoded message as the bucket's dtype; a FormatError unless it holds the
        bucket's values (``flat`` keeps its size and dtype when the sum overwrites it)."""
        if decoded.shape != self.flat.shape:
            raise mucsc.FormatError(f"rank {rank}'s message for bucket {self.index} holds {decoded.size} "
                                    f"values, the bucket {self.flat.size}")
        return decoded.astype(self.flat.dtype, copy=False)


def _sum_target(buf: torch.Tensor, dtype: np.dtype) -> tuple[np.ndarray, bool]:
    """Where the average is summed, and whether that is the bucket itself: its own memory when it is a
    contiguous host buffer of the working dtype (no copy back), else a new host array."""
    view = _host_view(buf, dtype)
    return (view, True) if view is not None else (np.empty(buf.numel(), dtype), False)


def _host_view(buf: torch.Tensor, dtype: np.dtype) -> np.ndarray | None:
    """The bucket's own memory as a flat numpy array when it is a contiguous host buffer of ``dtype``,
    else None."""
    if buf.device.type == "cpu" and buf.dtype in (torch.float32, torch.float64) and buf.is_contiguous():
        view = buf.detach().view(-1).numpy()
        if view.dtype == dtype:
            return view
    return None


_LENGTH = 8  # bytes of the int64 message length in front of each rank's slot


def _gather_messages(blob: bytes, slots: dict[int, tuple[int, int]], index: int, limit: int, world: int, group: Any,
                     device: Any) -> tuple[list[memoryview], int]:
    """All ranks' messages for one bucket, in rank order, and the bytes this rank contributed.

    One all-gather of fixed slots: each rank sends its message's length and its first ``cap`` bytes,
    zero-padded (all_gather needs equal sizes).  Every rank then knows every length; only when some
    message was longer than ``cap`` does a second all-gather carry the rest (padded to the longest
    rest).  A declared length over ``limit`` is refused before anything is allocated for it.  The slot
    starts empty (the first compressed iteration gathers lengths, then messages) and then holds the
    longest message of the last iteration plus a slack, so later iterations need one collective.  All
    ranks see the same lengths, so they take the same branch and set the same next ``cap``."""
    cap, slack = slots.get(index, (0, 0))
    slot = np.zeros(_LENGTH + cap, dtype=np.uint8)
    slot[:_LENGTH] = np.array([len(blob)], dtype="<i8").view(np.uint8)
    head = min(cap, len(blob))
    slot[_LENGTH:_LENGTH + head] = np.frombuffer(blob, dtype=np.uint8, count=head)
    rows = _all_gather(torch.from_numpy(slot), world, group, device)
    lengths = rows[:, :_LENGTH].copy().view("<i8").ravel().tolist()
    for r, n in enumerate(lengths):  # checked before anything is allocated for them
        if not 0 < n <= limit:
            raise mucsc.FormatError(f"rank {r} declared a {n}-byte message for bucket {index} (at most {limit})")
    longest = max(lengths)
    sent = slot.size
    rests = None
    if longest > cap:  # someone's message did not fit: gather what is left of every message
        rest = np.zeros(longest - cap, dtype=np.uint8)
        mine = np.frombuffer(blob, dtype=np.uint8)[cap:]
        rest[:mine.size] = mine
        rests = _all_gather(torch.from_numpy(rest), world, group, device)
        sent += rest.size
    # zstd'd lengths drift by ~0.1 % per step: the slot keeps a slack, doubled after an overflow (to 1/16)
    if not slack:
        slack = longest // 256 + 64
    elif rests is not None:
        slack = min(2 * slack, longest // 16 + 64)
    slots[index] = (longest + slack, slack)
    messages = []
    for r, n in enumerate(lengths):
        body = rows[r, _LENGTH:_LENGTH + min(n, cap)]
        if n > cap:
            body = np.concatenate([body, rests[r, :n - cap]])
        messages.append(memoryview(body))
    return messages, sent


def _all_gather(mine: torch.Tensor, world: int, group: Any, device: Any) -> np.ndarray:
    """``world`` equal-sized uint8 vectors, one per rank, as the rows of a host array."""
    out = torch.empty((world, mine.numel()), dtype=torch.uint8, device=device)
    dist.all_gather(list(out.unbind(0)), mine.to(device), group=group)
    return out.cpu().numpy()
