"""A byte budget (``bits=`` / ``size=``) for a streamed encoding (:func:`mucsc.encode_to`): the budget
planner's passes over a :class:`~mucsc.codec.api.stream_encode.TensorSource`.

Pass 1 (:func:`budget_choices`) reads each tensor once: the policy's per-tensor decision
(:meth:`Policy.choose`: 1-D norms as fp16, lossless and small tensors), for a coded tensor its
summary (:func:`mucsc.codec.ratecontrol.budget.summarize`: O(sample) memory, nothing encoded), for a
carried one its bytes (an upper bound: each as its own uncompressed group); then the split
(:class:`~mucsc.codec.ratecontrol.budget.Budget`).  Pass 2 is :func:`encode_to` reading each tensor
again and calling the returned ``choose``: a coded tensor is encoded there, once, in record order
(the writer may choose a window's tensors side by side: each waits for the one before it, so the
last groups' correction sees the exact bytes of every coded group before them), with the generator
of the group index the writer will give it, so the bytes are those of any thread count."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from mucsc.codec import ratecontrol
from mucsc.codec.api import messages as api
from mucsc.codec.api.policy import POOL_MAX_BYTES, Planned, Policy, flat_float
from mucsc.codec.api.stream_encode import _tensor
from mucsc.codec.codecs.base import Codec, get_codec
from mucsc.codec.wire import container as fmt
from mucsc.errors import ParameterError

__all__ = ["budget_applies", "budget_choices"]


def budget_applies(codec: Codec, elements: int) -> bool:
    """Whether ``codec``'s byte budget over ``elements`` elements is planned from summaries (then a
    streamed encoding takes :func:`budget_choices`)."""
    return ratecontrol.budget.applies(codec, elements)


def budget_choices(source: Any, codec: str | Codec = "mucsc", *, policy: Policy, seed: int = 0,
                   compress: str | int = "auto", meta: Mapping[str, str] | None = None, key: Any = None,
                   key_id: str | None = None, context: bytes | str | None = None, container: str = "dict",
                   **params: Any) -> Any:
    """Pass 1 over ``source`` and the split: the ``choose=`` that :func:`mucsc.encode_to` takes for
    this budget (the same ``codec``, ``policy``, ``seed``, ``compress``, ``meta``, key and ``container``
    as that call).  Each coded tensor is encoded once, in pass 2."""
    level = api._zstd_level(compress)
    codec_obj = api._container_codec(codec, params, compressing=level is not None)
    records = tuple(fmt.Record(str(n), str(d), tuple(int(s) for s in shape)) for n, d, shape in source.entries)
    elements = sum(r.size for r in records)
    if not budget_applies(codec_obj, elements):
        raise ParameterError(f"codec {codec_obj.name!r}: no byte budget planned from summaries here")
    signer = api._signer(key, key_id, context)
    goal = ratecontrol.Goal.of(codec_obj)
    reach = ratecontrol.budget.max_bits(goal, elements)
    carried: dict[int, str] = {}  # tensor -> "fp16" / "raw"
    coded: list[int] = []
    summaries = []
    carried_bytes, carried_groups = 0, []
    fp16 = get_codec("fp16")
    for i, rec in enumerate(records):
        t = _tensor(rec, source.read(i))
        x = flat_float(t) if t.is_float else None  # widened once, for the policy and the summary
        choice = policy.choose(i, t, codec_obj, seed, fp16, x=x)
        if isinstance(choice, Planned):
            if choice.codec is not codec_obj:
                raise ParameterError(f"{rec.name}: the policy chose a fixed coding under a budget")
            coded.append(i)
            summaries.append(ratecontrol.budget.summarize(codec_obj, x, level, reach))
        else:
            carried[i] = choice
            carrier = fp16 if choice == "fp16" else get_codec("raw")
            x, gdtype = api._group_vector(carrier, [t])
            enc = carrier.encode_array(x, None)
            carried_bytes += sum(fmt.section_bytes(s.tobytes(), False, None) for s in enc.sections)
            carried_groups.append(fmt.Group(carrier.name, enc.params, (i,), gdtype))
        del t, x
    groups = _group_indices(records, coded, carried)
    trailer = signer.trailer_bytes if signer is not None else 0
    meta = api.check_meta(meta)
    dtypes = {i: ("float64" if records[i].dtype == "float64" else "float32") for i in coded}

    def head_bytes(chosen: list[dict]) -> int:  # every carried tensor a group: more than the pools' HEAD
        gs = [fmt.Group(codec_obj.name, p, (i,), dtypes[i]) for i, p in zip(coded, chosen)] + carried_groups
        gs.sort(key=lambda g: g.records[0])
        return fmt.section_bytes(fmt.Header(records, tuple(gs), container, meta).to_json(), True, level)

    fixed = fmt.PREAMBLE.size + fmt.TRAILER.size + trailer + carried_bytes
    ctx = ratecontrol.PlanContext(level, elements, fixed, lambda k: api._group_rng(seed, groups[coded[k]]),
                                  head_bytes)
    return _Choose(ratecontrol.budget.Budget(codec_obj, summaries, ctx), coded, carried, groups, seed)


def _group_indices(records: tuple[fmt.Record, ...], coded: list[int], carried: dict[int, str]) -> dict[int, int]:
    """The group index :func:`encode_to`'s writer gives each tensor: groups numbered as their first
    member is read (a coded tensor or a large carried one: its own group; small carried ones: one
    pool per carrier, fp16 or the raw dtype)."""
    out: dict[int, int] = {}
    pools: dict[str, int] = {}
    count = 0
    mine = set(coded)
    for i, rec in enumerate(records):
        if i in mine or rec.nbytes > POOL_MAX_BYTES:
            out[i], count = count, count + 1
            continue
        key = "fp16" if carried[i] == "fp16" else rec.dtype
        if key not in pools:
            pools[key], count = count, count + 1
        out[i] = pools[key]
    return out


class _Choose:
    """Pass 2's ``choose(i, t)``: carried tensors as pass 1 decided; coded ones encoded here, in
    order (a tensor waits for the coded tensor before it)."""

    def __init__(self, budget: Any, coded: list[int], carried: dict[int, str], groups: dict[int, int], seed: int):
        self.budget, self.carried, self.groups, self.seed = budget, carried, groups, seed
        self.order = {i: k for k, i in enumerate(coded)}
        self.turn = threading.Condition()
        self.failed: BaseException | None = None

    def __call__(self, i: int, t: Any) -> str | Planned:
        if i in self.carried:
            return self.carried[i]
        k = self.order[i]
        x = flat_float(t)
        with self.turn:
            self.turn.wait_for(lambda: self.failed is not None or len(self.budget.written) == k)
            if self.failed is not None:
                raise ParameterError("an earlier tensor of the budget failed") from self.failed
            try:
                c, enc = self.budget.encode(k, x, lambda: api._group_rng(self.seed, self.groups[i]))
            except BaseException as exc:
                self.failed = exc
                raise
            finally:
                self.turn.notify_all()
        return Planned(c, (i,), enc)

    @property
    def re_encodes(self) -> int:
        return self.budget.re_encodes

