"""The public API: ``encode``, ``encode_with_stats``, ``decode``, ``inspect``, ``verify``.

Everything above the codecs (the CLI, the simulator, other systems) goes through these functions.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import numbers
import operator
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from mucsc.codec.wire import auth
from mucsc.codec.wire import container as fmt
from mucsc.codec import parallel
from mucsc.codec.wire.auth import AuthSummary, Keys
from mucsc.codec import ratecontrol
from mucsc.codec.codecs.base import Codec, EncodedGroup, codec_class, get_codec
from mucsc.codec.backends import torch_transfer
from mucsc.codec.backends.tensors import saturate_into
from mucsc.codec.api.policy import Policy, measure
from mucsc.codec.backends.tensors import (AS_TORCH, Tensor, from_record, is_torch_tensor, name_label, on_host,
                                          to_device, to_tensors)
from mucsc.errors import FormatError, InputError, LimitError, MucscError, ParameterError, UnknownCodecError
from mucsc.optional import require_torch

DEFAULT_ZSTD_LEVEL = fmt.DEFAULT_ZSTD_LEVEL
# Decoding untrusted input (FORMAT.md 3, "Decoder limits"): a message may declare far more output
# than its bytes carry (a constant tensor, the mean-filled rest of a sparse codec), so by default
# the decoded size is bounded by a multiple of the message size, with a floor so that small
# messages always decode, and by an element count.  Callers who trust a message raise or lift them.
DEFAULT_MAX_ELEMENTS = 1 << 28  # 1 GiB of float32
DEFAULT_MAX_EXPANSION = 4096  # decoded bytes per message byte (B-MUCSC at keep 0.001 is ~1500)
EXPANSION_FLOOR_BYTES = 64 << 20  # output always allowed, whatever the message size
HEADER_FLOOR_BYTES = 1 << 20  # HEAD's raw length always allowed (parsed JSON takes up to ~30x its bytes)
# HEAD's raw length per message byte beyond the floor: a real HEAD takes a few bytes per message byte
# (measured: 2.4 for 6000 tensors of 4 elements with a group each, zstd HEAD 78x smaller than its JSON);
# the decoded tensors' bound (max_expansion, 4096) would let 4 KB inflate to 16 MiB of JSON
HEADER_EXPANSION = 16
SECTION_BYTES_PER_ELEMENT = 16  # no codec needs more raw bytes per element in one section
SECTION_SLACK_BYTES = 1 << 20  # ... plus this (centroid tables, scales)
# A group above max_elements still decodes when its sections hold at least one byte per this many
# bytes it decodes to: a coded tensor takes bits per element (the default model mode: 3-8 bits per
# float32), a constant or mean-filled one declares its output without bytes to show for it.
GROUP_EXPANSION = 256


@dataclasses.dataclass(frozen=True)
class GroupStats:
    """What the encoder knows about one group: its codec, size and error statistics."""

    codec: str
    records: tuple[str, ...]
    elements: int
    stats: dict[str, float]
    # the group codec's parameters (Codec.get_config without "codec") with what its encoding settled
    # (EncodedGroup.resolved: a goal's z, an "auto" id_coding as "packed" or "rans")
    config: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class TensorStats:
    """One tensor's measured quality: its group's codec and bits per element (a shared group's bits
    are spread evenly over its elements) and ``rel_error`` = ||decode - x|| / ||x|| (0 for lossless;
    None when x is all zero but its decoding is not; ``abs_error`` = ||decode - x|| then says how far)."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    codec: str
    group: int
    bits_per_element: float | None
    rel_error: float | None
    abs_error: float


@dataclasses.dataclass(frozen=True)
class EncodeStats:
    """Totals of one encoding.  ``J`` is the exact expected squared error E||decode - x||^2 summed over
    groups whose codec reports it (None when some lossy group does not)."""

    message_bytes: int
    original_bytes: int
    elements: int
    groups: tuple[GroupStats, ...]
    tensors: tuple[TensorStats, ...] = ()

    @property
    def ratio(self) -> float:
        """Tensor bytes (the records' dtype sizes, not the input file) / message bytes."""
        return self.original_bytes / self.message_bytes

    @property
    def bits_per_element(self) -> float:
        return 8 * self.message_bytes / self.elements if self.elements else math.nan

    @property
    def J(self) -> float | None:
        vals = [g.stats.get("J") for g in self.groups]
        return None if any(v is None for v in vals) else float(sum(vals))

    def to_dict(self) -> dict[str, Any]:
        return {"message_bytes": self.message_bytes, "original_bytes": self.original_bytes,
                "elements": self.elements, "ratio": self.ratio, "bits_per_element": self.bits_per_element,
                "J": self.J, "groups": [dataclasses.asdict(g) for g in self.groups],
                "tensors": [tensor_dict(t) for t in self.tensors]}


def tensor_dict(t: TensorStats) -> dict[str, Any]:
    """The JSON form of one tensor's figures (the keys of ``"tensors"`` in every report)."""
    return {"name": t.name, "dtype": t.dtype, "shape": list(t.shape), "codec": t.codec, "group": t.group,
            "bits_per_element": t.bits_per_element, "rel_error": t.rel_error, "abs_error": t.abs_error}


def encode(data: Any, codec: Any = "mucsc", *, seed: int | None = None, shared: bool = True,
           compress: str | int = "auto", meta: Mapping[str, str] | None = None,
           policy: Policy | None = None, key: Any = None, key_id: str | None = None,
           context: bytes | str | None = None, threads: int = 1, progress: Progress | None = None,
           **params: Any) -> bytes:
    """Encode an array, a torch tensor or a mapping of them into one mucsc message.

    ``codec`` is a name with its ``params`` (e.g. ``"mucsc", z=16``) or a :class:`Codec` object
    (``get_codec("mucsc", z=16)``: the same bytes); it applies to every float tensor; non-float tensors are
    carried losslessly.  ``shared=True`` encodes all float tensors as one vector with one codebook
    (the paper's flattened update); False gives each tensor its own.  ``compress="auto"`` stores
    compressible sections zstd-compressed when smaller ("off": fixed-width, the paper's byte counts;
    an int: that zstd level).  ``policy`` (a :class:`mucsc.Policy`) replaces ``shared`` by the
    checkpoint-grade grouping: a codebook per tensor, lossless carriers where coding is not smaller,
    optionally a per-tensor error target.  The same input, parameters and seed give the same bytes,
    for any ``threads`` (threads used within and across groups; 0: all cores).

    ``key`` (32 secret bytes for BLAKE2b, or an Ed25519 private key) with ``key_id`` appends an
    authentication tag that also covers ``context`` (not stored; e.g. ``b"run-4/round-9/up"``): the
    receiver must give the same context.  See docs/security.md.

    ``progress``: a callable ``progress(done, total)``, called (serialised, from the encoding threads)
    as work finishes, in elements: each tensor's elements count once per pass over them (a
    ``policy``'s trial encodings are a pass, the message's groups another); the last call has
    ``done == total``.  For a progress bar; the bytes never depend on it.

    ``codec`` may also be a :class:`mucsc.Settings` (codec, parameters, seed, shared, compress,
    threads, key): then it is the whole configuration, and only ``seed`` (this message's), ``meta``,
    ``policy``, ``context`` and ``progress`` may be given next to it.
    """
    # a mucsc.Settings (imported lazily: it builds on this module); a name is not (no failed lookup)
    if type(codec) is not str and hasattr(codec, "encode_kwargs"):
        codec, seed, shared, compress, threads, key, key_id = _from_settings(
            codec, seed, shared, compress, threads, key, key_id, params)
    return _encode(data, codec, 0 if seed is None else seed, shared, compress, meta, params, policy,
                   _signer(key, key_id, context), threads, want_stats=False, progress=progress)[0]


def _from_settings(settings: Any, seed: Any, shared: Any, compress: Any, threads: Any, key: Any, key_id: Any,
                   params: Mapping[str, Any]) -> tuple:
    """encode's arguments from a Settings; a SettingsError when others were given next to it."""
    from mucsc.errors import SettingsError

    if params or (shared, compress, threads, key, key_id) != (True, "auto", 1, None, None):
        raise SettingsError("encode(data, settings): codec parameters, shared, compress, threads and the key "
                            "come from the Settings; change them there (settings.replace(...))")
    kw = settings.encode_kwargs()
    return (kw["codec"], settings.seed if seed is None else seed, kw["shared"], kw["compress"], kw["threads"],
            kw.get("key"), kw.get("key_id"))


def encode_with_stats(data: Any, codec: str | Codec = "mucsc", *, seed: int = 0, shared: bool = True,
                      compress: str | int = "auto", meta: Mapping[str, str] | None = None,
                      policy: Policy | None = None, key: Any = None, key_id: str | None = None,
                      context: bytes | str | None = None, threads: int = 1,
                      progress: Progress | None = None, **params: Any) -> tuple[bytes, EncodeStats]:
    """Like :func:`encode`, also returning :class:`EncodeStats` (J, sizes, ratio, and each tensor's
    measured error: every lossy group is decoded once more to measure it)."""
    return _encode(data, codec, seed, shared, compress, meta, params, policy, _signer(key, key_id, context),
                   threads, want_stats=True, progress=progress)


def encode_decoded(data: Any, codec: str | Codec = "mucsc", *, seed: int = 0, shared: bool = True,
                   compress: str | int = "auto", threads: int = 1, **params: Any) -> tuple[bytes, Any]:
    """``(message, decode(message))`` for a sender that needs what its receivers reconstruct (error
    feedback, an all-gather that averages every rank's message with its own): the message is
    :func:`encode`'s (same arguments, same bytes), and the decoded value is bit for bit what
    ``decode(message, max_elements=None, max_expansion=None)`` returns.  For a message of one array
    whose one group's codec kept the lookup its decode is (``EncodedGroup.lookup``: a clustering's
    wire levels and IDs) it is one gather of those (0.08 ms for 301k float32 values, against 0.5 ms
    to parse, decompress and unpack the message); otherwise the message is decoded."""
    own = _OwnDecode()
    blob = _encode(data, codec, seed, shared, compress, None, params, None, None, threads, want_stats=False,
                   own=own)[0]
    header = own.header
    lookup = own.lookups.get(0)
    if lookup is None or header is None or header.container != "tensor" or _narrows(header, header.groups[0]):
        return blob, decode(blob, max_elements=None, max_expansion=None, threads=threads)
    rec = header.records[0]
    with parallel.using(threads):
        flat = parallel.take(*lookup)
    return blob, from_record(flat, rec.dtype, rec.shape, as_torch=False)


@dataclasses.dataclass
class _OwnDecode:
    """What :func:`encode_decoded` keeps of one encode: each group's ``EncodedGroup.lookup`` (None
    where the codec kept none), by group index, and the message's header."""

    lookups: dict[int, tuple[np.ndarray, np.ndarray] | None] = dataclasses.field(default_factory=dict)
    header: fmt.Header | None = None


def _signer(key: Any, key_id: str | None, context: Any) -> auth.Signer | None:
    """The trailer writer for ``key``; checked before any encoding work."""
    if key is None:
        if key_id is not None or context is not None:
            raise ParameterError("key_id and context need a key to authenticate the message with")
        return None
    if key_id is None:
        raise ParameterError("an authenticated message needs a key_id (the receiver looks the key up by it)")
    return auth.Signer(key, key_id, context)


def as_codec(codec: str | Codec, **params: Any) -> Codec:
    """A :class:`Codec` from a name and parameters, or the given Codec object itself (no parameters)."""
    if isinstance(codec, Codec):
        if params:
            raise ParameterError(f"parameters {', '.join(map(repr, sorted(params)))} given next to a codec "
                                 f"object; set them in get_codec({codec.name!r}, ...) instead")
        return codec
    if not isinstance(codec, str):
        raise ParameterError(f"codec must be a name or a mucsc.Codec, got {type(codec).__name__}")
    return get_codec(codec, **params)


def _container_codec(codec: str | Codec, params: Mapping[str, Any], compressing: bool) -> Codec:
    """``as_codec(codec, **params).for_container(compressing)``; for a name with hashable parameters
    memoised (codecs are immutable values; building and resolving one is ~50 us of a small encode).
    The key holds each value's type: ``z=True`` is refused as before, never served ``z=1``'s codec."""
    if isinstance(codec, str):
        try:
            return _named_codec(codec, tuple(sorted(zip(params, map(type, params.values()), params.values()))),
                                compressing)
        except TypeError:  # unhashable parameters (or unorderable names: as_codec names the problem)
            pass
    return as_codec(codec, **params).for_container(compressing=compressing)


@functools.lru_cache(maxsize=256)
def _named_codec(name: str, params: tuple, compressing: bool) -> Codec:
    return get_codec(name, **{k: v for k, _, v in params}).for_container(compressing=compressing)


Progress = Callable[[int, int], Any]


def _check_progress(progress: Any) -> Progress | None:
    """``progress`` itself when it is None or callable, else a ParameterError (before any work)."""
    if progress is not None and not callable(progress):
        raise ParameterError(f"progress must be a callable progress(done, total), got {type(progress).__name__}")
    return progress


class _Reporter:
    """Adds up finished work and passes ``(done, total)`` to the caller's ``progress`` callable, one
    call at a time (groups may finish on several threads at once)."""

    def __init__(self, progress: Progress | None, total: int, sizes: Sequence[int] = ()) -> None:
        self.progress, self.total, self.done = _check_progress(progress), int(total), 0
        self._lock = threading.Lock() if progress is not None else None  # add() returns at once without one
        self.sizes = sizes  # tensor i's share of a policy's planning
        self._credit: dict[int, int] = {}  # what trial() already counted of tensor i's share

    def trial(self, i: int) -> None:
        """A trial encoding of tensor i's search: an eighth of what is left of its share (the number
        of trials is not known in advance; 20 trials count 93%), so one long tensor moves the bar."""
        if self.progress is None:
            return
        c = self._credit.get(i, 0)
        step = (self.sizes[i] - c) // 8
        if step > 0:
            self._credit[i] = c + step
            self.add(step)

    def tensor_done(self, i: int) -> None:
        """Tensor i's choice is made: the rest of its share."""
        if self.progress is None:
            return
        self.add(self.sizes[i] - self._credit.pop(i, 0))

    def add(self, n: int) -> None:
        if self.progress is None:
            return
        with self._lock:
            self.done = min(self.done + int(n), self.total)
            self.progress(self.done, self.total)

    def finish(self) -> None:
        """The final ``(total, total)`` call (once, and only if it was not the last call already)."""
        if self.progress is not None and (self.done < self.total or self.total == 0):
            self.add(self.total - self.done)


# The reporter of a call without ``progress``: every method returns at once (one object for all such
# calls, not one built per encode)
_SILENT = _Reporter(None, 0)


class _Request(NamedTuple):
    """One encode call's settings, checked: the codec (resolved for the container), the seed, how
    groups are formed (``shared`` / ``policy``), zstd level, meta, signer, threads, whether to measure.
    Immutable; a named tuple rather than a frozen dataclass because it is made in one step, not a
    field at a time (~1 us of every encode call)."""

    codec: Codec
    seed: int
    shared: bool
    level: int | None
    meta: dict[str, str]
    policy: Policy | None
    signer: auth.Signer | None
    threads: int
    want_stats: bool
    progress: Progress | None = None
    own: _OwnDecode | None = None  # encode_decoded's collector of the groups' lookups


def _encode(data, codec, seed, shared, compress, meta, params, policy, signer, threads, want_stats,
            progress=None, own=None):
    if progress is not None:
        _check_progress(progress)
    with parallel.using(threads) as nthreads:
        level = _zstd_level(compress)
        codec = _container_codec(codec, params, compressing=level is not None)
        if type(seed) is not int and (isinstance(seed, bool) or not isinstance(seed, np.integer)) or seed < 0:
            raise ParameterError(f"seed must be a non-negative integer, got {seed!r}")
        # meta before any work: the reader's rules (FORMAT.md 2.4) at the writer
        req = _Request(codec, int(seed), shared, level, check_meta(meta), policy, signer, nthreads, want_stats,
                       progress, own)
        return _encode_request(data, req)


def _encode_request(data: Any, req: _Request) -> tuple[bytes, EncodeStats | None]:
    """The message (and its statistics when asked): groups planned, encoded side by side, written."""
    container, tensors = to_tensors(data)
    if container == "dict" and not tensors:
        raise InputError("nothing to encode: the mapping is empty")
    records = tuple(fmt.Record(t.name, t.dtype, tuple(map(int, t.array.shape))) for t in tensors)
    _check_header_limits(records)
    tsizes = [r.size for r in records]
    reporter = (_Reporter(req.progress, sum(tsizes) * (2 if req.policy is not None else 1), tsizes)
                if req.progress is not None else _SILENT)
    plan, ready = _plan_message(tensors, container, req, reporter)
    sizes = [tsizes[m[0]] if len(m) == 1 else sum(tsizes[i] for i in m) for _, m in plan]

    def encode_group(gi: int) -> tuple[fmt.Group, list, GroupStats | None, dict]:
        out = _encode_group(gi, plan, ready, tensors, req)
        reporter.add(sizes[gi])
        return out

    # small groups side by side, large ones one after another with every thread (parallel.run_groups)
    done = parallel.run_groups(encode_group, sizes)
    groups, sections, minor = [], [], 0  # the groups' header entries, sections and format minor, in order
    for (gcodec, _), (group, secs, _, _) in zip(plan, done):
        groups.append(group)
        sections += secs
        minor = max(minor, gcodec.format_minor(group.params))
    measured = ((tuple(d[2] for d in done if d[2] is not None), {k: v for d in done for k, v in d[3].items()})
                if req.want_stats else None)  # (group statistics, errors): gathered only when asked for
    del done
    header = fmt.Header(records, tuple(groups), container, req.meta)
    head = _check_header(header)
    if req.own is not None:
        req.own.header = header
    blob = fmt.write_message(header, sections, zstd_level=req.level, auth=req.signer,
                             minor=max(minor, _minor_needed(header)), threads=req.threads, head=head)
    reporter.finish()
    return blob, (_message_stats(blob, header, *measured) if measured is not None else None)


def _plan_message(tensors: list[Tensor], container: str, req: _Request, reporter: _Reporter
                  ) -> tuple[list[tuple[Codec, list[int]]], dict[int, EncodedGroup]]:
    """(codec, member tensors) per group, and the groups already encoded while planning (the
    policy's trials, the other groups of a budget); a goal is resolved here (rate control)."""
    ready: dict[int, EncodedGroup] = {}
    if req.policy is not None:
        planned = req.policy.plan(tensors, req.codec, req.seed, on_tensor=reporter.tensor_done,
                                  on_trial=reporter.trial)
        plan = [(p.codec, list(p.members)) for p in planned]
        ready = {gi: p.encoded for gi, p in enumerate(planned) if p.encoded is not None}
    else:
        plan = _plan_groups(tensors, req.codec, req.shared)
    if ratecontrol.needs_plan(req.codec) and any(c is req.codec for c, _ in plan):
        trailer = req.signer.trailer_bytes if req.signer is not None else 0
        plan, ready = _resolve_plan(plan, tensors, req.codec, container, req.meta, req.seed, req.level, trailer,
                                    ready)
    return plan, ready


def _encode_group(gi: int, plan: list[tuple[Codec, list[int]]], ready: dict[int, EncodedGroup],
                  tensors: list[Tensor], req: _Request) -> tuple[fmt.Group, list, GroupStats | None, dict]:
    """Group ``gi`` encoded (or taken from ``ready``): its header entry, sections, statistics and
    its members' errors (the last two only when measuring)."""
    gcodec, members = plan[gi]
    if gi in ready:  # encoded while planning: its vector is built again only if its error is not known
        enc: EncodedGroup = ready.pop(gi)
        x, gdtype = None, _group_dtype(gcodec, [tensors[i] for i in members])
    else:
        x, gdtype = _group_vector(gcodec, [tensors[i] for i in members])
        x = _for_codec(gcodec, x)
        enc = gcodec.encode_array(x, _group_rng(req.seed, gi) if gcodec.draws else None)
        if req.own is not None:
            req.own.lookups[gi] = enc.lookup
    secs = [(gi, s.tag, s.payload(), s.compressible) for s in enc.sections]
    if not req.want_stats:
        return fmt.Group(gcodec.name, enc.params, tuple(members), gdtype), secs, None, {}
    errs = _member_errors(gcodec, enc, x, members, tensors)
    del x
    stats = {k: float(v() if callable(v) else v) for k, v in enc.stats.items()}
    if gcodec.lossless:
        stats.setdefault("J", 0.0)
    config = {**{k: v for k, v in gcodec.get_config().items() if k != "codec"}, **enc.resolved}
    gstat = GroupStats(gcodec.name, tuple(tensors[i].name for i in members),
                       sum(tensors[i].size for i in members), stats, config)
    return fmt.Group(gcodec.name, enc.params, tuple(members), gdtype), secs, gstat, errs


def _message_stats(blob: bytes, header: fmt.Header, gstats: tuple[GroupStats, ...],
                   errors: dict[int, tuple[float, float]]) -> EncodeStats:
    """What :func:`encode_with_stats` reports: sizes, per-group statistics, per-tensor bits and errors."""
    records = header.records
    gbytes = _group_bytes(blob)
    tstats: list[TensorStats | None] = [None] * len(records)
    for gi, g in enumerate(header.groups):
        n = sum(records[i].size for i in g.records)
        bits = 8 * gbytes.get(gi, 0) / n if n else None
        for i in g.records:
            rel, err = errors[i]
            tstats[i] = TensorStats(records[i].name, records[i].dtype, records[i].shape, g.codec, gi, bits,
                                    rel, err)
    return EncodeStats(len(blob), sum(r.nbytes for r in records), sum(r.size for r in records), gstats,
                       tuple(tstats))


def _host(x: Any) -> np.ndarray:
    """A group vector on the host (torch tensors left on their device are copied over)."""
    return x.cpu().numpy() if is_torch_tensor(x) else x


def _for_codec(codec: Codec, x: Any) -> Any:
    """The group vector as ``codec`` takes it: a codec without a torch path encodes on the host."""
    return x if codec.accepts_device else _host(x)


def _group_rng(seed: int, gi: int) -> np.random.Generator:
    """Group ``gi``'s generator (FORMAT.md 4.3): default_rng([seed, gi]), i.e.
    Generator(PCG64(SeedSequence([seed, gi]))), with the SeedSequence and the words PCG64 draws
    from it memoised (its entropy hashing and generate_state are ~3 us of the ~4 us a generator
    costs, paid per group and call; the stream is the same)."""
    return np.random.Generator(np.random.PCG64(_seed_sequence(int(seed), int(gi))))


class _MemoSeedSequence(np.random.bit_generator.ISpawnableSeedSequence):
    """A SeedSequence whose ``generate_state`` results are kept (a pure function of its entropy and
    the arguments; callers get a fresh copy); spawning goes to the SeedSequence itself."""

    def __init__(self, ss: np.random.SeedSequence) -> None:
        self.ss = ss
        self._words: dict[tuple[int, Any], np.ndarray] = {}

    @property
    def n_children_spawned(self) -> int:
        return self.ss.n_children_spawned

    def generate_state(self, n_words: int, dtype: Any = np.uint32) -> np.ndarray:
        key = (n_words, dtype)
        words = self._words.get(key)
        if words is None:
            words = self.ss.generate_state(n_words, dtype)
            if len(self._words) < 8:
                self._words[key] = words.copy()
            return words
        return words.copy()

    def spawn(self, n_children: int) -> list[np.random.SeedSequence]:
        return self.ss.spawn(n_children)


def _seed_sequence(seed: int, gi: int) -> _MemoSeedSequence:
    """SeedSequence([seed, gi]), memoised: PCG64 only reads it (generate_state is a pure function).
    A codec that spawns children from its generator changes it (``n_children_spawned``), so a
    sequence that has spawned is replaced, and the next call's children are the same again."""
    key = (seed, gi)
    ss = _SEED_SEQUENCES.get(key)
    if ss is None or ss.n_children_spawned:
        ss = _MemoSeedSequence(np.random.SeedSequence([seed, gi]))
        with _SEED_SEQUENCES_LOCK:  # encodes may run on several threads
            if len(_SEED_SEQUENCES) >= _SEED_SEQUENCE_COUNT:
                del _SEED_SEQUENCES[next(iter(_SEED_SEQUENCES))]  # the oldest
            _SEED_SEQUENCES[key] = ss
    return ss


_SEED_SEQUENCES: dict[tuple[int, int], _MemoSeedSequence] = {}
_SEED_SEQUENCE_COUNT = 4096
_SEED_SEQUENCES_LOCK = threading.Lock()


def _encode_others(plan, mine: set[int], tensors, seed: int, level: int, ready: dict) -> int:
    """The section bytes of the groups not in ``mine`` (part of a budget over the whole message),
    each encoded once: into ``ready`` unless it is there already."""
    total = 0
    for gi, (gcodec, members) in enumerate(plan):
        if gi in mine:
            continue
        if gi not in ready:
            x, _ = _group_vector(gcodec, [tensors[i] for i in members])
            ready[gi] = gcodec.encode_array(_for_codec(gcodec, x), _group_rng(seed, gi))
        total += sum(fmt.section_bytes(s.tobytes(), s.compressible, level) for s in ready[gi].sections)
    return total


def _resolve_plan(plan, tensors, codec, container, meta, seed, level, auth_bytes=0, ready=None):
    """Let ``codec`` see its groups and the rest of the message before encoding (a byte budget over
    the whole message, ``bits=`` / ``size=``).  The other groups are encoded here (their exact size is
    part of the budget; ``ready`` ones were already) and returned with the plan so they are not
    encoded twice.  ``auth_bytes``: the authentication trailer's size, also part of the message."""
    mine = [gi for gi, (c, _) in enumerate(plan) if c is codec]
    ready = dict(ready or {})
    other_bytes = _encode_others(plan, set(mine), tensors, seed, level, ready)
    records = tuple(fmt.Record(t.name, t.dtype, tuple(int(s) for s in t.array.shape)) for t in tensors)
    dtypes = [_group_dtype(c, [tensors[i] for i in m]) for c, m in plan]
    meta = dict(meta or {})

    def head_bytes(params: list[dict[str, Any]]) -> int:
        by_group = dict(zip(mine, params))
        groups = tuple(fmt.Group(c.name, by_group[gi] if gi in by_group else ready[gi].params, tuple(m),
                                 dtypes[gi]) for gi, (c, m) in enumerate(plan))
        return fmt.section_bytes(fmt.Header(records, groups, container, meta).to_json(), True, level)

    fixed = fmt.PREAMBLE.size + fmt.TRAILER.size + auth_bytes + other_bytes
    ctx = ratecontrol.PlanContext(level, sum(t.size for t in tensors), fixed,
                                  lambda i: _group_rng(seed, mine[i]), head_bytes)
    if ratecontrol.budget.applies(codec, ctx.elements):
        return _encode_budget(plan, mine, tensors, codec, ctx, seed, ready)
    # planning tries several encodings of each group: on the host (a device group is copied once)
    xs = [_host(_group_vector(codec, [tensors[i] for i in plan[gi][1]])[0]) for gi in mine]
    done: dict[int, EncodedGroup] = {}  # groups the planner already encoded as chosen
    chosen = ratecontrol.plan(codec, xs, ctx, done)
    if chosen is None:
        return plan, ready
    ready.update({mine[i]: _held(chosen[i], enc, xs[i], len(plan[mine[i]][1])) for i, enc in done.items()})
    del xs
    if len(chosen) != len(mine):
        raise RuntimeError(f"codec {codec.name!r} planned {len(chosen)} groups, expected {len(mine)}")
    plan = list(plan)
    for gi, c in zip(mine, chosen):
        plan[gi] = (c, plan[gi][1])
    return plan, ready


def _encode_budget(plan, mine, tensors, codec, ctx, seed, ready):
    """A byte budget from the groups' summaries (:mod:`mucsc.codec.ratecontrol.budget`): each of
    ``codec``'s groups summarised one at a time (its vector dropped after), the budget split over
    the summaries, then each group encoded once, in order, into ``ready``."""
    b = ratecontrol.budget
    reach = b.max_bits(ratecontrol.Goal.of(codec), ctx.elements)
    summaries = []
    for gi in mine:
        x = _host(_group_vector(codec, [tensors[i] for i in plan[gi][1]])[0])
        summaries.append(b.summarize(codec, x, ctx.zstd_level, reach))
        del x
    budget = b.Budget(codec, summaries, ctx)
    plan = list(plan)
    for k, gi in enumerate(mine):
        x = _host(_group_vector(codec, [tensors[i] for i in plan[gi][1]])[0])
        c, enc = budget.encode(k, x, lambda gi=gi: _group_rng(seed, gi))
        ready[gi] = _held(c, enc, x, len(plan[gi][1]))
        plan[gi] = (c, plan[gi][1])
        del x
    return plan, ready


def _held(codec: Codec, enc: EncodedGroup, x: np.ndarray, members: int) -> EncodedGroup:
    """An encoding held until the message is written, without its lookup (the IDs: a byte or two per
    element of every held group); a group of one tensor is measured first (what the report needs)."""
    if enc.lookup is None:
        return enc
    measured = measure(codec, enc, x)[0][:2] if members == 1 else enc.measured
    return dataclasses.replace(enc, lookup=None, measured=measured)


def _group_dtype(codec: Codec, members: list[Tensor]) -> str:
    """The dtype a group is encoded in (as :func:`_group_vector` decides, without building it)."""
    if codec.lossless:
        return members[0].dtype
    return "float64" if any(t.dtype == "float64" for t in members) else "float32"


def _member_errors(codec: Codec, enc: EncodedGroup, x: np.ndarray | None, members: tuple[int, ...],
                   tensors: list[Tensor]) -> dict[int, tuple[float | None, float]]:
    """Per record of a group: (||decode - x|| / ||x||, ||decode - x||) (``x``: the group vector, None
    when not built: built here if needed): as the policy measured it, or
    measured now (:func:`~mucsc.codec.api.policy.measure`: from the encoding's lookup, else by
    decoding the group from its sections as the receiver will; lossless groups: exactly 0)."""
    if codec.lossless:
        return {i: (0.0, 0.0) for i in members}
    if enc.measured is not None and len(members) == 1:  # measured when the policy checked its bound
        found = [enc.measured]
    else:
        if x is None:
            x = _group_vector(codec, [tensors[i] for i in members])[0]
        x = _host(x)  # a group encoded on a device is measured on the host
        ends = np.cumsum([0] + [tensors[i].size for i in members]).tolist()
        found = [m[:2] for m in measure(codec, enc, x, list(zip(ends[:-1], ends[1:])))]
    return {i: ((0.0 if err == 0 else None) if norm == 0 else err / norm, err)
            for i, (norm, err) in zip(members, found)}


def _minor_needed(header: fmt.Header) -> int:
    """The oldest minor version that can represent ``header`` (FORMAT.md: writers emit the oldest):
    1.1 for a lossless group holding several records, else 1.0."""
    for g in header.groups:
        if len(g.records) > 1 and codec_class(g.codec).lossless:
            return 1
    return 0


def _group_bytes(blob: bytes) -> dict[int, int]:
    """Bytes each group takes in the message: its sections' headers, payloads and padding."""
    return section_bytes_by_group(fmt.read_message(blob))


def _zstd_level(compress: str | int) -> int | None:
    if compress == "auto":
        return DEFAULT_ZSTD_LEVEL
    if compress == "off":
        return None
    if isinstance(compress, int) and not isinstance(compress, bool) and 1 <= compress <= 22:
        return compress
    raise ParameterError(f"compress must be 'auto', 'off' or a zstd level 1..22, got {compress!r}")


def _plan_groups(tensors: list[Tensor], codec: Codec, shared: bool) -> list[tuple[Codec, list[int]]]:
    """Float tensors go to ``codec`` (one group, or one each); others to the lossless raw codec."""
    if len(tensors) == 1 and tensors[0].is_float and not codec.lossless:  # one array: one group
        return [(codec, [0])]
    floats = [i for i, t in enumerate(tensors) if t.is_float and not codec.lossless]
    plan: list[tuple[Codec, list[int]]] = []
    if floats:
        plan += [(codec, floats)] if shared else [(codec, [i]) for i in floats]
    if len(floats) < len(tensors):
        raw, lossy = get_codec("raw"), set(floats)
        plan += [(raw, [i]) for i in range(len(tensors)) if i not in lossy]
    plan.sort(key=lambda p: p[1][0])  # groups in record order: deterministic and easy to read
    return plan


def _group_vector(codec: Codec, members: list[Tensor]) -> tuple[np.ndarray, str]:
    """The flat vector a codec encodes, and the dtype it works in (for lossy codecs checked finite
    and within the codec's ``input_limit``, so that the message written always decodes)."""
    if codec.lossless:  # one record, or (format 1.1) several of one dtype
        if len({t.dtype for t in members}) != 1:
            raise ValueError("a lossless group holds records of one dtype")
        parts = [np.ascontiguousarray(on_host(t).array).reshape(-1) for t in members]
        return (parts[0] if len(parts) == 1 else np.concatenate(parts)), members[0].dtype
    gdtype = "float64" if any(t.dtype == "float64" for t in members) else "float32"
    if any(t.on_device for t in members):  # stays on the device (the torch backend encodes it there)
        parts = [(t.name, t.array if t.on_device else t.as_float()) for t in members]
        return torch_transfer.group_vector(parts, gdtype, codec.input_limit, codec.name), gdtype
    parts = [np.ascontiguousarray(t.as_float(), dtype=gdtype).reshape(-1) for t in members]
    for t, p in zip(members, parts):
        codec.check_input(p, name_label(t.name))
    x = parts[0] if len(parts) == 1 else _adjacent_view(parts)
    if x is None:
        x = np.concatenate(parts)
    return x, gdtype


def _adjacent_view(parts: list[np.ndarray]) -> np.ndarray | None:
    """One read-only vector over parts that already lie back to back in memory, else None.

    Tensors read from one file buffer (safetensors) usually do; viewing them saves a full copy of a
    shared group.  The view lives only while the caller's arrays do, i.e. during the encode call.
    """
    parts = [p for p in parts if p.size]
    if not parts:
        return None
    addr = parts[0].__array_interface__["data"][0]
    for p in parts:
        if p.__array_interface__["data"][0] != addr or not p.flags.c_contiguous:
            return None
        addr += p.nbytes
    n = sum(p.size for p in parts)
    return np.lib.stride_tricks.as_strided(parts[0], shape=(n,), strides=(parts[0].itemsize,), writeable=False)


def check_meta(meta: Any) -> dict[str, str]:
    """``meta`` as the header will carry it, checked against the reader's rules (FORMAT.md 2.4):
    strings to strings (no silent str() of keys or values), valid Unicode, HEAD within its limit."""
    if meta is None:
        return {}
    if not isinstance(meta, Mapping):
        raise InputError(f"meta must be a mapping of strings to strings, got {type(meta).__name__}")
    out: dict[str, str] = {}
    for k, v in meta.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise InputError(f"meta must map strings to strings; got {k!r}: {v!r} "
                             f"({type(k).__name__}: {type(v).__name__})")
        _check_text(k, "meta key")
        _check_text(v, f"meta[{k!r}]")
        out[k] = v
    size = sum(len(k.encode("utf-8")) + len(v.encode("utf-8")) for k, v in out.items())
    if size > fmt.MAX_HEADER_BYTES:
        raise LimitError(f"meta holds {size} bytes; the whole header is limited to {fmt.MAX_HEADER_BYTES}")
    return out


def _check_text(s: str, what: str) -> None:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InputError(f"{what} is not valid Unicode text (a lone surrogate at index {exc.start}): "
                         f"{s[:40]!r}") from None


def _check_header_limits(records: tuple[fmt.Record, ...]) -> None:
    """The reader's limits on the record table, before any encoding work."""
    if len(records) > fmt.MAX_RECORDS:
        raise LimitError(f"{len(records)} tensors exceed the limit of {fmt.MAX_RECORDS}")
    for r in records:
        try:
            name_bytes = len(r.name.encode("utf-8")) if r.name else 0
        except UnicodeEncodeError:
            _check_text(r.name, "tensor name")  # raises, naming the lone surrogate
            raise
        if name_bytes > fmt.MAX_NAME_BYTES:
            raise LimitError(f"tensor name longer than {fmt.MAX_NAME_BYTES} bytes: {r.name[:40]!r}...")
        if len(r.shape) > fmt.MAX_RANK:
            raise LimitError(f"tensor {r.name!r} has rank {len(r.shape)} > {fmt.MAX_RANK}")
        if r.size > fmt.MAX_ELEMENTS:
            raise LimitError(f"tensor {r.name!r} has more than {fmt.MAX_ELEMENTS} elements")


def _check_header(header: fmt.Header) -> bytes:
    """The finished header passes the reader's own checks: never write a message we cannot read.
    Returns its JSON (HEAD's payload).  ``parse_header`` is a pure function of those bytes, so a
    header that passed before (the same shapes and codec, round after round) is not parsed again,
    nor, when its parameters are plain values, serialised again (:func:`_header_key`)."""
    key = _header_key(header)
    if key is not None:
        raw = _HEADER_JSON.get(key)
        if raw is not None:
            return raw
    raw = header.to_json()
    if len(raw) > fmt.MAX_HEADER_BYTES:
        raise LimitError(f"the header (record table and meta) would take {len(raw)} bytes, more than the "
                         f"limit of {fmt.MAX_HEADER_BYTES}")
    if raw in _VALID_HEADERS:
        _remember(_HEADER_JSON, key, raw)
        return raw
    try:
        fmt.parse_header(raw)
    except FormatError as exc:
        raise InputError(f"cannot encode this input: its header would be invalid ({exc})") from None
    if len(raw) <= _VALID_HEADER_BYTES:
        _remember(_VALID_HEADERS, raw, None)
        _remember(_HEADER_JSON, key, raw)
    return raw


def _remember(memo: dict, key: Any, value: Any) -> None:
    """``memo[key] = value`` (not for key None), the oldest entry dropped beyond _VALID_HEADER_COUNT."""
    if key is None:
        return
    with _VALID_HEADERS_LOCK:  # encodes may run on several threads
        if len(memo) >= _VALID_HEADER_COUNT:
            del memo[next(iter(memo))]  # the oldest (dicts keep insertion order)
        memo[key] = value


def _header_key(header: fmt.Header) -> tuple | None:
    """A key that equals another header's only when both serialise to the same JSON: the records
    (names, dtypes, int shapes), container, meta, and each group's codec, dtype, members and its
    parameters' names, types and values; None unless every parameter is a plain str, int, bool, None
    or float (a float by its repr: -0.0 == 0.0, but their JSON differs)."""
    groups = []
    for g in header.groups:
        values = tuple(g.params.values())
        types = tuple(map(type, values))
        if not _PLAIN_TYPES.issuperset(types):  # floats by their repr (others: no key)
            if not _PLAIN_OR_FLOAT.issuperset(types):
                return None
            values = tuple(repr(v) if t is float else v for t, v in zip(types, values))
        groups.append((g.codec, g.dtype, g.records, tuple(g.params), types, values))
    # the records as plain tuples: hashing and comparing a Record calls its dataclass methods
    return tuple(map(_RECORD_FIELDS, header.records)), header.container, tuple(header.meta.items()), tuple(groups)


_RECORD_FIELDS = operator.attrgetter("name", "dtype", "shape")


_PLAIN_TYPES = frozenset((str, int, bool, type(None)))
_PLAIN_OR_FLOAT = _PLAIN_TYPES | {float}
# Headers that passed parse_header (bounded: at most 64 of up to 64 KiB each), and the JSON of
# recent headers by _header_key (the same bound).
_VALID_HEADERS: dict[bytes, None] = {}
_HEADER_JSON: dict[tuple, bytes] = {}
_VALID_HEADER_COUNT, _VALID_HEADER_BYTES = 64, 1 << 16
_VALID_HEADERS_LOCK = threading.Lock()


# ---------------------------------------------------------------------------------------------- decode

def decode(blob: bytes | bytearray | memoryview, *, as_torch: bool = False, device: Any = None,
           max_elements: int | None = DEFAULT_MAX_ELEMENTS,
           max_expansion: float | None = DEFAULT_MAX_EXPANSION, keys: Keys | None = None,
           context: bytes | str | None = None, require_auth: bool | None = None,
           threads: int = 1, progress: Progress | None = None) -> Any:
    """Decode a message: an array for a message made from one array, else a dict of arrays.

    Original dtypes and shapes are restored (bfloat16 comes back as float32 numpy, or bfloat16 torch
    with ``as_torch``).  ``device`` (with ``as_torch``, e.g. "cuda"): tensors are returned there, and
    codecs with a torch decoder unpack and gather on it (only the packed bytes are copied over).
    Limits for untrusted input (LimitError before anything large is allocated):
    ``max_elements`` bounds the elements, ``max_expansion`` the decoded bytes per message byte
    (outputs up to 64 MiB always pass).  None lifts a limit (the spec's own limits still hold).

    ``keys`` (a mapping key id -> key, or a callable key id -> key) makes the tag mandatory and
    checks it over the raw bytes with ``context`` before anything is parsed (:class:`AuthError`
    otherwise).  ``require_auth`` defaults to ``keys is not None``; False accepts unauthenticated
    messages while still verifying authenticated ones.  Without keys an authenticated message
    decodes unverified (:func:`inspect` reports it so).
    ``threads``: threads used within and across groups (0: all cores); the result never depends on it.
    A message that is not bytes-like, or a limit that is not None or a non-negative number, raises
    :class:`ParameterError` (a MucscError: one ``except MucscError`` covers every untrusted input).
    ``progress``: a callable ``progress(done, total)`` in elements, called as groups finish (as for
    :func:`encode`).
    """
    check_reader_args(blob, max_elements=max_elements, max_expansion=max_expansion)
    _check_progress(progress)
    if device is not None and not as_torch:
        raise ParameterError("device= needs as_torch=True")
    if as_torch:
        require_torch(AS_TORCH)  # fail before any work
        if device is not None:
            device = torch_transfer.device(device)
    auth.check(blob, keys, context, require_auth)  # first: a forged message costs one hash
    try:
        with parallel.using(threads):
            return _decode(blob, as_torch, max_elements, max_expansion, device, progress)
    except MemoryError:
        raise LimitError("out of memory while decoding: the message decodes to more than this machine "
                         "can hold") from None


def check_reader_args(blob: Any, **limits: Any) -> None:
    """ParameterError (a MucscError, so a server's one ``except MucscError`` covers it) for a message
    that is not bytes-like, or a limit that is neither None nor a non-negative number: the documented
    behaviour of :func:`decode`, :func:`verify` and :func:`inspect` for arguments of the wrong type."""
    try:
        memoryview(blob)
    except TypeError:
        raise ParameterError(f"a message is bytes, bytearray or memoryview, not {type(blob).__name__}") from None
    for name, value in limits.items():
        integral = name == "max_elements"
        ok = isinstance(value, numbers.Integral if integral else numbers.Real) and not isinstance(value, bool)
        if value is not None and not (ok and value >= 0):
            kind = "a non-negative integer" if integral else "a non-negative number"
            raise ParameterError(f"{name} must be {kind} or None, got {value!r}")


def check_limits(header: fmt.Header, message_bytes: int, max_elements: int | None,
                 max_expansion: float | None, group_bytes: Mapping[int, int] | None = None) -> None:
    """LimitError when the header declares more output than the caller's limits allow.

    ``max_elements`` bounds each *group* (what decoding one group allocates at once), not the model:
    a checkpoint of 10^9 parameters in groups of 10^8 decodes one group at a time.  The default
    (DEFAULT_MAX_ELEMENTS) is also relative: a larger group passes when its sections are at least
    1/GROUP_EXPANSION of what it decodes to (``group_bytes``: its sections' bytes; a coded tensor
    takes bits per element, a constant or mean-filled one declares its output from nothing), so no
    tensor that ``mucsc compress`` wrote is refused; any other value is a hard cap per group.
    ``max_expansion`` bounds the whole message's decoded bytes against its size (FORMAT.md 3.1)."""
    gbytes = group_bytes or {}
    for gi, g in enumerate(header.groups):
        n = sum(header.records[i].size for i in g.records)
        if max_elements is None or n <= max_elements:
            continue
        nbytes = sum(header.records[i].nbytes for i in g.records)
        have = gbytes.get(gi, 0)
        if max_elements != DEFAULT_MAX_ELEMENTS or nbytes > GROUP_EXPANSION * have:
            raise LimitError(f"group {gi} holds {n} elements in {have} bytes, more than max_elements="
                             f"{max_elements} (pass a larger max_elements, or None, to decode it; CLI: "
                             "--max-elements)")
    total = sum(r.size for r in header.records)
    nbytes = sum(r.nbytes for r in header.records)
    if max_expansion is not None:
        budget = max(EXPANSION_FLOOR_BYTES, max_expansion * message_bytes)
        if nbytes > budget:
            raise LimitError(
                f"a message of {message_bytes} bytes declares {nbytes} bytes of tensors ({total} elements), "
                f"{nbytes / message_bytes:.0f}x its size: more than max_expansion={max_expansion:g} allows "
                "for untrusted input (if you trust it, pass max_expansion=None; CLI: --max-expansion none)")


def section_bytes_by_group(msg: fmt.Message) -> dict[int, int]:
    """Bytes each group takes in a parsed message: its sections' headers, payloads and padding."""
    out: dict[int, int] = {}
    for s in msg.sections:
        if s.group != fmt.MESSAGE_GROUP:
            out[s.group] = out.get(s.group, 0) + fmt.SECTION.size + s.stored_bytes + fmt.padding(s.stored_bytes)
    return out


def _max_header(blob: Any, max_expansion: float | None) -> int | None:
    """The bound on HEAD's raw length for this message: HEADER_EXPANSION (or ``max_expansion`` when
    smaller) times its size, at least HEADER_FLOOR_BYTES; None (only the spec's 16 MiB) when
    ``max_expansion`` is None."""
    if max_expansion is None:
        return None
    return int(max(HEADER_FLOOR_BYTES, min(max_expansion, HEADER_EXPANSION) * memoryview(blob).nbytes))


def _decode(blob, as_torch: bool, max_elements: int | None, max_expansion: float | None,
            device: Any = None, progress: Progress | None = None) -> Any:
    msg = fmt.read_message(blob, _max_header(blob, max_expansion))
    header = msg.header
    check_limits(header, msg.size, max_elements, max_expansion, section_bytes_by_group(msg))
    out: dict[str, Any] = {}
    sizes = [sum(header.records[i].size for i in g.records) for g in header.groups]
    reporter = _Reporter(progress, sum(sizes))

    def decode_group(gi: int) -> Any:
        group = header.groups[gi]
        narrows = device is None and _narrows(header, group)
        flat = _decode_records(msg, gi, group) if narrows else _decode_group(msg, gi, group, device)
        reporter.add(sizes[gi])
        return flat

    flats = parallel.run_groups(decode_group, sizes)
    for gi, group in enumerate(header.groups):
        flat = flats[gi]
        flats[gi] = None
        offset = 0
        lossless = codec_class(group.codec).lossless  # known: _decode_group found it
        # decoded on a device: the records' views in one op (a slice each would be an op each)
        parts = flat if isinstance(flat, list) else None if isinstance(flat, np.ndarray) else \
            flat.split([header.records[ri].size for ri in group.records])
        for j, ri in enumerate(group.records):
            rec = header.records[ri]
            part = flat[offset: offset + rec.size] if parts is None else parts[j]
            offset += rec.size
            if lossless and rec.dtype == "bfloat16":  # a lossless group decodes bfloat16 as its bits
                part = (part.astype(np.uint32) << 16).view(np.float32)
            out[rec.name] = to_device(from_record(part, rec.dtype, rec.shape, as_torch), device)
    ordered = {r.name: out[r.name] for r in header.records}
    reporter.finish()
    return ordered[header.records[0].name] if header.container == "tensor" else ordered


def _decode_dtype(msg: fmt.Message, gi: int, group: fmt.Group, cls: type[Codec]) -> np.dtype:
    """The dtype group ``gi`` decodes to, after checking its records fit its codec (FORMAT.md 2.2)."""
    records = msg.header.records
    if not cls.lossless:
        if group.dtype not in ("float32", "float64"):
            raise FormatError(f"group {gi}: codec {group.codec!r} works in float32/float64, not {group.dtype}")
        if any(records[i].dtype not in fmt.FLOAT_DTYPES for i in group.records):
            raise FormatError(f"group {gi}: lossy codec {group.codec!r} on a non-float record")
        implied = _group_dtype(cls, [records[i] for i in group.records])
        if group.dtype != implied:  # FORMAT.md 2.4: float64 exactly when a record is float64
            raise FormatError(f"group {gi}: dtype {group.dtype}, but its records' dtypes imply {implied}")
        return np.dtype(group.dtype)
    if not group.records or any(records[i].dtype != group.dtype for i in group.records):
        raise FormatError(f"group {gi}: a lossless group holds records of its own dtype")
    if len(group.records) > 1 and msg.minor < 1:
        raise FormatError(f"group {gi}: a lossless group of several records needs format 1.1")
    return np.dtype("<u2") if group.dtype == "bfloat16" else np.dtype(group.dtype).newbyteorder("<")


def _decode_group(msg: fmt.Message, gi: int, group: fmt.Group, device: Any = None,
                  table_map: Callable[[np.ndarray], np.ndarray] | None = None) -> np.ndarray:
    """Group ``gi`` decoded (on ``device`` when given and the codec can); ``table_map``: an
    elementwise map of a lossy group's values, applied to its lookup table where the codec's decode
    is one (``Codec.decode_mapped``), else to the decoded vector."""
    cls, n, dtype, sections = open_group(msg, gi, group)
    on_device = device is not None and hasattr(cls, "decode_on_device") and not cls.lossless
    with malformed_as_format_error(gi, group):
        if on_device:
            flat = cls.decode_on_device(n, group.params, sections, dtype, device)
        elif table_map is not None and not cls.lossless:
            flat = cls.decode_mapped(n, group.params, sections, dtype, table_map)
            flat = table_map(cls.decode_array(n, group.params, sections, dtype)) if flat is None else flat
        else:
            flat = cls.decode_array(n, group.params, sections, dtype)
    if tuple(getattr(flat, "shape", ())) != (n,) or not (on_device or isinstance(flat, np.ndarray)):
        raise FormatError(f"group {gi} ({group.codec}): decoder returned the wrong number of values")
    check_all_read(gi, group, sections)
    return flat


# the record dtypes narrower than a lossy group's values (FORMAT.md 2.4; bfloat16 decodes as float32)
_NARROWER = {"float64": ("float32", "float16"), "float32": ("float16",)}


def _narrows(header: fmt.Header, group: fmt.Group) -> bool:
    """Whether a record of ``group`` stores its values narrower than the group decodes them."""
    narrower = _NARROWER.get(group.dtype, ())
    return any(header.records[i].dtype in narrower for i in group.records)


def _decode_records(msg: fmt.Message, gi: int, group: fmt.Group) -> list[np.ndarray]:
    """Group ``gi`` decoded straight into its records' flat arrays, a piece of its codec's
    ``decode_parts`` at a time, each record's piece saturated and cast as :func:`from_record` does:
    the group's vector is never whole, so a float16 record of a float32 group costs its own size
    plus a piece, not the group's float32 values too (FORMAT.md 3.2)."""
    cls, n, dtype, sections = open_group(msg, gi, group)
    records = [msg.header.records[i] for i in group.records]
    narrower = _NARROWER.get(group.dtype, ())
    dtypes = [np.dtype(r.dtype) if r.dtype in narrower else dtype for r in records]
    wrong = FormatError(f"group {gi} ({group.codec}): decoder returned the wrong number of values")
    outs: list[np.ndarray] = []
    j = at = got = 0  # the record being filled, its values so far, the group's values so far
    with malformed_as_format_error(gi, group):
        for part in cls.decode_parts(n, group.params, sections, dtype):
            if not isinstance(part, np.ndarray) or part.ndim != 1 or got + part.size > n:
                raise wrong
            got += part.size
            if not outs:  # allocated once the decoder's checks before its first piece have passed
                outs = [np.empty(r.size, dt) for r, dt in zip(records, dtypes)]
            s = 0
            while s < part.size:
                while at == outs[j].size:
                    j, at = j + 1, 0
                m = min(part.size - s, outs[j].size - at)
                saturate_into(part[s: s + m], outs[j][at: at + m], records[j].dtype)
                s, at = s + m, at + m
    if got != n:
        raise wrong
    check_all_read(gi, group, sections)
    return outs or [np.empty(0, dt) for dt in dtypes]


def open_group(msg: fmt.Message, gi: int, group: fmt.Group) -> tuple[type[Codec], int, np.dtype, Any]:
    """(codec class, element count, decoded dtype, sections) of group ``gi``, its header checked."""
    try:
        cls = codec_class(group.codec)
    except UnknownCodecError:
        raise FormatError(f"group {gi} uses codec {group.codec!r}, which this decoder does not know") from None
    n = sum(msg.header.records[i].size for i in group.records)
    dtype = _decode_dtype(msg, gi, group, cls)
    # every section of this group is bounded by its element count before it is decompressed
    return cls, n, dtype, msg.group_sections(gi, max_raw=SECTION_BYTES_PER_ELEMENT * n + SECTION_SLACK_BYTES)


@contextlib.contextmanager
def malformed_as_format_error(gi: int, group: fmt.Group) -> Iterator[None]:
    """A codec's decoder failing on untrusted data with a Python error: a FormatError naming the group."""
    try:
        yield
    except MucscError:
        raise
    except (ValueError, TypeError, IndexError, OverflowError, KeyError) as exc:
        raise FormatError(f"group {gi} ({group.codec}): malformed data ({exc})") from None


def check_all_read(gi: int, group: fmt.Group, sections: Any) -> None:
    """FORMAT.md 2.3: a critical section the decoder did not read (does not understand) rejects the message."""
    unread = sections.unread()
    if unread:
        raise FormatError(f"group {gi} ({group.codec}): unknown critical section(s) "
                          f"{', '.join(map(repr, unread))}")


# ---------------------------------------------------------------------------------------------- inspect

@dataclasses.dataclass(frozen=True)
class SectionSummary:
    tag: str
    group: int | None
    encoding: str
    stored_bytes: int
    raw_bytes: int


@dataclasses.dataclass(frozen=True)
class GroupSummary:
    index: int
    codec: str
    params: dict[str, Any]
    dtype: str
    records: tuple[str, ...]
    elements: int
    bytes: int  # payload and section headers of this group's sections


@dataclasses.dataclass(frozen=True)
class RecordSummary:
    name: str
    dtype: str
    shape: tuple[int, ...]
    group: int


@dataclasses.dataclass(frozen=True)
class MessageInfo:
    """A summary of a message, from its header and section table (payloads are not decoded)."""

    version: str
    size: int
    container: str
    records: tuple[RecordSummary, ...]
    groups: tuple[GroupSummary, ...]
    sections: tuple[SectionSummary, ...]
    original_bytes: int
    elements: int
    meta: dict[str, str]
    auth: AuthSummary | None = None  # the authentication trailer, verified or not; None: 1.0 message

    @property
    def ratio(self) -> float:
        """original bytes / message bytes ("N x smaller")."""
        return self.original_bytes / self.size

    @property
    def bits_per_element(self) -> float:
        return 8 * self.size / self.elements if self.elements else math.nan

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["ratio"] = self.ratio
        d["bits_per_element"] = None if not self.elements else self.bits_per_element
        return d


def inspect(blob: bytes | bytearray | memoryview, *, keys: Keys | None = None,
            context: bytes | str | None = None, require_auth: bool | None = None,
            max_expansion: float | None = DEFAULT_MAX_EXPANSION) -> MessageInfo:
    """Summarise a message: records, groups with codec and parameters, bytes per section, ratio, and
    its authentication trailer (algorithm and key id; ``verified`` only when ``keys`` checked it).

    Payloads are not decoded; ``max_expansion`` (as :func:`decode`'s, with a 1 MiB floor) bounds the
    raw length of a zstd-encoded HEAD before it is inflated and parsed."""
    check_reader_args(blob, max_expansion=max_expansion)
    verified = auth.check(blob, keys, context, require_auth)
    try:
        msg = fmt.read_message(blob, _max_header(blob, max_expansion))
    except MemoryError:
        raise LimitError("out of memory while reading the message header") from None
    return summarize(msg, verified or (auth.summary(msg.auth, verified=False) if msg.auth is not None else None))


def summarize(msg: fmt.Message, auth_summary: AuthSummary | None = None) -> MessageInfo:
    """:class:`MessageInfo` of a parsed message (from a buffer or a file: nothing is decoded)."""
    h = msg.header
    group_of = {ri: gi for gi, g in enumerate(h.groups) for ri in g.records}
    secs = tuple(SectionSummary(s.tag, None if s.group == fmt.MESSAGE_GROUP else s.group, s.encoding,
                                s.stored_bytes, s.raw_bytes) for s in msg.sections)
    gbytes = section_bytes_by_group(msg)
    groups = tuple(
        GroupSummary(gi, g.codec, g.params, g.dtype, tuple(h.records[i].name for i in g.records),
                     sum(h.records[i].size for i in g.records), gbytes.get(gi, 0))
        for gi, g in enumerate(h.groups))
    records = tuple(RecordSummary(r.name, r.dtype, r.shape, group_of[i]) for i, r in enumerate(h.records))
    return MessageInfo(f"{fmt.MAJOR}.{msg.minor}", msg.size, h.container, records, groups, secs,
                       sum(r.nbytes for r in h.records), sum(r.size for r in h.records), dict(h.meta),
                       auth_summary)


def verify(blob: bytes | bytearray | memoryview, *, max_elements: int | None = DEFAULT_MAX_ELEMENTS,
           max_expansion: float | None = DEFAULT_MAX_EXPANSION, keys: Keys | None = None,
           context: bytes | str | None = None, require_auth: bool | None = None, threads: int = 1) -> None:
    """Check the tag (with ``keys``), the checksum and that every record decodes; raises
    :class:`AuthError` or a FormatError subclass if not.  The limits and ``threads`` are :func:`decode`'s."""
    decode(blob, max_elements=max_elements, max_expansion=max_expansion, keys=keys, context=context,
           require_auth=require_auth, threads=threads)


