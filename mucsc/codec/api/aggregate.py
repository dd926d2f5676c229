"""``mucsc.Aggregator``: the weighted mean of many messages in O(d) memory, for a federated server.

A FedAvg server needs sum_k w_k x_k / sum_k w_k, not the K decoded updates: decoding them all into a
list first holds K x d floats (1,000 clients of a 10M-parameter model: 40 GB).  An Aggregator keeps
one float64 running sum laid out like the first message's tensors and adds each message into it as
it arrives, through its codec's :meth:`~mucsc.Codec.accumulator` (a mucsc group adds its centroids
straight from its IDs: no decoded float vector per message).

Deterministic: element i of the sum is ``((0 + w_1 x_1[i]) + w_2 x_2[i]) + ...`` in float64, in the
order of the ``add`` calls, whatever the threads; the mean equals that of the decodes (float64) up to
the final division.  A message is checked whole (authentication, limits, structure, every section)
before any of it is added: an ``add`` that raises leaves the aggregator as it was.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from typing import Any

import numpy as np

from mucsc.codec import parallel
from mucsc.codec.api.messages import (DEFAULT_MAX_ELEMENTS, DEFAULT_MAX_EXPANSION, _max_header, check_all_read,
                                      check_limits, check_reader_args, malformed_as_format_error, open_group)
from mucsc.codec.backends.tensors import from_record
from mucsc.codec.codecs.base import add_scaled
from mucsc.codec.wire import auth
from mucsc.codec.wire import container as fmt
from mucsc.codec.wire.auth import Keys
from mucsc.errors import InputError, LimitError, ParameterError

_FLOATS = ("float16", "bfloat16", "float32", "float64")


class Aggregator:
    """A running weighted sum of decoded mucsc messages; :meth:`result` is their weighted mean.

    >>> agg = mucsc.Aggregator()
    >>> for blob, n in replies:
    ...     agg.add(blob, weight=n)          # same keyword arguments as mucsc.decode for checks
    >>> mean = agg.result()                  # an array, or a dict of arrays, like the first message

    Every message must hold the same tensors as the first (container, names, dtypes, shapes; the
    codecs and groups may differ): another structure raises :class:`InputError` and is not added.
    The sum is float64 (8 bytes per element, whatever the number of messages); ``result`` gives each
    tensor its decoded dtype (bfloat16 as float32, as :func:`mucsc.decode`; integer tensors rounded).
    """

    def __init__(self) -> None:
        self._records: tuple[fmt.Record, ...] | None = None
        self._container = ""
        self._offset: dict[str, int] = {}
        self._acc: np.ndarray | None = None
        self._count = 0
        self._total = 0.0

    @property
    def count(self) -> int:
        """Messages added."""
        return self._count

    @property
    def total_weight(self) -> float:
        """The sum of the weights added."""
        return self._total

    def add(self, blob: bytes | bytearray | memoryview, weight: float = 1.0, *, keys: Keys | None = None,
            context: bytes | str | None = None, require_auth: bool | None = None,
            max_elements: int | None = DEFAULT_MAX_ELEMENTS, max_expansion: float | None = DEFAULT_MAX_EXPANSION,
            threads: int = 1) -> None:
        """Add ``weight`` times the message's decoded tensors to the sum.

        ``weight``: a finite number >= 0 (FedAvg: the client's example count).  ``keys``, ``context``,
        ``require_auth``, ``max_elements``, ``max_expansion`` and ``threads`` check and bound the
        message exactly as in :func:`mucsc.decode` (an :class:`AuthError`, :class:`LimitError` or
        :class:`FormatError` before anything is added)."""
        check_reader_args(blob, max_elements=max_elements, max_expansion=max_expansion)
        w = _check_weight(weight)
        auth.check(blob, keys, context, require_auth)  # first: a forged message costs one hash
        try:
            with parallel.using(threads):
                msg = fmt.read_message(blob, _max_header(blob, max_expansion))
                check_limits(msg.header, msg.size, max_elements, max_expansion)
                self._check_structure(msg.header)
                adders = [self._prepare(msg, gi, group) for gi, group in enumerate(msg.header.groups)]
                if self._acc is None:
                    self._start(msg.header)
                for add in adders:  # everything is checked: from here nothing can fail
                    add(w)
        except MemoryError:
            raise LimitError("out of memory while decoding: the message decodes to more than this machine "
                             "can hold") from None
        self._count += 1
        self._total += w

    def result(self) -> Any:
        """The weighted mean: an array for messages of one array, else a dict in the first message's
        order.  Raises :class:`InputError` before any message (or with a total weight of 0)."""
        if not self._total > 0 and self._acc is not None:
            raise InputError("Aggregator.result(): the weights add up to 0, so there is no weighted mean")
        return self._tensors("result", self._total)

    def weighted_sum(self) -> Any:
        """The weighted sum itself (sum of weight x decoded message), structured as :meth:`result`:
        for weights that are already normalised (they add up to 1 only up to rounding), or a sum."""
        return self._tensors("weighted_sum", 1.0)

    def _tensors(self, what: str, divisor: float) -> Any:
        if self._acc is None or self._records is None:
            raise InputError(f"Aggregator.{what}(): no message was added")
        out = {}
        for rec in self._records:
            part = self._acc[self._offset[rec.name]: self._offset[rec.name] + rec.size]
            part = part / divisor if divisor != 1.0 else part.copy()  # never a view of the sum
            if rec.dtype not in _FLOATS:
                part = np.rint(part)
            out[rec.name] = from_record(part, rec.dtype, rec.shape, as_torch=False)
        return out[self._records[0].name] if self._container == "tensor" else out

    # -- internals ------------------------------------------------------------------------------

    def _check_structure(self, header: fmt.Header) -> None:
        if self._records is None:
            return
        mine = (self._container, [(r.name, r.dtype, r.shape) for r in self._records])
        theirs = (header.container, [(r.name, r.dtype, r.shape) for r in header.records])
        if mine != theirs:
            raise InputError(f"message {self._count + 1} holds {_describe(*theirs)}, but the first message "
                             f"added holds {_describe(*mine)}: an Aggregator averages messages of one structure")

    def _start(self, header: fmt.Header) -> None:
        """The sum, laid out as the first message's groups (so that each of its groups is one slice)."""
        order = [ri for g in header.groups for ri in g.records]
        offset, self._offset = 0, {}
        for ri in order:
            self._offset[header.records[ri].name] = offset
            offset += header.records[ri].size
        self._records, self._container = header.records, header.container
        self._acc = np.zeros(offset, np.float64)

    def _prepare(self, msg: fmt.Message, gi: int, group: fmt.Group) -> Callable[[float], None]:
        """Check group ``gi`` whole; ``add(weight)`` that adds it to the sum (which may not exist yet)."""
        cls, n, dtype, sections = open_group(msg, gi, group)
        with malformed_as_format_error(gi, group):
            if cls.lossless:  # raw bits of the record dtype: decoded, as decode gives them back
                x = _lossless_values(cls.decode_array(n, group.params, sections, dtype), group.dtype)
                add_group = lambda acc, w: add_scaled(acc, w, x)  # noqa: E731
            else:
                add_group = cls.accumulator(n, group.params, sections, dtype)
        check_all_read(gi, group, sections)
        records = [msg.header.records[ri] for ri in group.records]

        def add(weight: float) -> None:
            acc = self._acc
            start = self._offset[records[0].name]
            if all(self._offset[r.name] == start + o for r, o in zip(records, _starts(records))):
                add_group(acc[start: start + n], weight)  # the usual case: the group is one slice
                return
            part = np.zeros(n, np.float64)  # another grouping than the first message's
            add_group(part, weight)
            for r, o in zip(records, _starts(records)):
                at = self._offset[r.name]
                acc[at: at + r.size] += part[o: o + r.size]
        return add


def _starts(records: list[fmt.Record]) -> list[int]:
    return [int(v) for v in np.cumsum([0] + [r.size for r in records[:-1]])]


def _lossless_values(x: np.ndarray, dtype: str) -> np.ndarray:
    """A lossless group's decoded values as numbers (bfloat16 comes as its 16 bits)."""
    if dtype == "bfloat16":
        return (x.astype(np.uint32) << 16).view(np.float32)
    return x


def _check_weight(weight: Any) -> float:
    ok = isinstance(weight, numbers.Real) and not isinstance(weight, bool)
    if not ok or not math.isfinite(float(weight)) or float(weight) < 0:
        raise ParameterError(f"weight must be a finite number >= 0, got {weight!r}")
    return float(weight)


def _describe(container: str, records: list[tuple[str, str, tuple[int, ...]]]) -> str:
    if container == "tensor" and records:
        return f"one {records[0][1]} array of shape {records[0][2]}"
    shown = ", ".join(f"{name!r} {dtype}{list(shape)}" for name, dtype, shape in records[:4])
    return f"{len(records)} tensors ({shown}{', ...' if len(records) > 4 else ''})"
