"""A message file read group by group: streamed decompression and random access (``mucsc.open``).

:class:`MessageFile` reads the preamble, the section headers (32 bytes each, payloads skipped) and
HEAD; a group's payloads are read (``os.pread``) only when that group is decoded.  Memory is one
group's sections and its decoded values, not the model.

Integrity: :func:`mucsc.decode` checks the CRC-32 of the whole message first.  A
:class:`MessageFile` does so when ``check_crc`` is set (one sequential read of the file in 16 MiB
pieces: what ``mucsc decompress`` does); :func:`open` does not, by default, since reading one
tensor must not read the model.  Every payload is still checked as it is decoded (lengths against
the group's elements before anything is allocated, zstd framing, the codec's own rules), so a
damaged or hostile file gives an error or wrong values of the damaged group, never a crash or a
huge allocation; ``open(path, check_crc=True)`` pays the pass for full integrity.  An authenticated
message is read unverified here (verification needs the whole message: ``mucsc.decode(keys=...)``).
"""

from __future__ import annotations

import builtins
import collections
import concurrent.futures
import os
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from mucsc.codec import parallel
from mucsc.codec.api import messages as api
from mucsc.codec.backends.tensors import AS_TORCH, bf16_bits, from_record, saturate
from mucsc.codec.codecs.base import codec_class
from mucsc.codec.wire import container as fmt
from mucsc.errors import LimitError, ParameterError
from mucsc.optional import require_torch

__all__ = ["MessageFile", "CheckpointFile", "open", "bf16_bits"]

DECODE_AHEAD_MAX = 4  # groups MessageFile.records decodes at once at most (memory: that many groups)


class MessageFile:
    """An open message file (see the module docstring).  ``max_elements`` / ``max_expansion``: as
    :func:`mucsc.decode`'s, checked against HEAD when the file is opened (``check_output`` False: only
    ``max_expansion``'s bound on HEAD itself, as :func:`mucsc.inspect`)."""

    def __init__(self, f: Any, *, max_elements: int | None = api.DEFAULT_MAX_ELEMENTS,
                 max_expansion: float | None = api.DEFAULT_MAX_EXPANSION, check_crc: bool = True,
                 check_output: bool = True) -> None:
        api.check_reader_args(b"", max_elements=max_elements, max_expansion=max_expansion)
        size = os.fstat(f.fileno()).st_size
        max_header = None if max_expansion is None else int(max(api.HEADER_FLOOR_BYTES, min(
            max_expansion, api.HEADER_EXPANSION) * size))
        try:
            self.msg = fmt.read_message_file(f, max_header, check_crc=check_crc)
        except MemoryError:
            raise LimitError("out of memory while reading the message header") from None
        self.header = self.msg.header
        if check_output:  # False: only HEAD is wanted (mucsc info), nothing is decoded
            api.check_limits(self.header, self.msg.size, max_elements, max_expansion,
                             api.section_bytes_by_group(self.msg))
        self.group_of = {ri: gi for gi, g in enumerate(self.header.groups) for ri in g.records}
        self.index = {r.name: i for i, r in enumerate(self.header.records)}

    def info(self) -> api.MessageInfo:
        """What :func:`mucsc.inspect` reports (the trailer, if any, unverified)."""
        from mucsc.codec.wire import auth

        return api.summarize(self.msg, auth.summary(self.msg.auth, verified=False) if self.msg.auth else None)

    def decode_group(self, gi: int, *, threads: int = 1, bfloat16_bits: bool = False) -> np.ndarray:
        """Group ``gi``'s flat vector (threads inside the codec; the result never depends on them).
        ``bfloat16_bits``: when every record of a lossy group is bfloat16, its values come as the
        records keep them, rounded to bfloat16 bit patterns (uint16; :func:`record_values` takes them
        as they are), the rounding applied to the codec's lookup table where its decode is one: no
        float32 vector and no pass over it."""
        group = self.header.groups[gi]
        bits = bfloat16_bits and all(self.header.records[ri].dtype == "bfloat16" for ri in group.records)
        table_map = _to_bf16 if bits else None
        return self._decoding(lambda msg, g, grp: api._decode_group(msg, g, grp, table_map=table_map), gi, threads)

    def _group_values(self, gi: int, threads: int) -> np.ndarray | list[np.ndarray]:
        """Group ``gi`` as :meth:`_split` takes it: its records' arrays when one is narrower than the
        group's values (decoded into them a piece at a time, FORMAT.md 3.2), else its vector (bfloat16
        bit patterns for an all-bfloat16 group)."""
        if api._narrows(self.header, self.header.groups[gi]):
            return self._decoding(api._decode_records, gi, threads)
        return self.decode_group(gi, threads=threads, bfloat16_bits=True)

    def _decoding(self, decoder: Any, gi: int, threads: int) -> Any:
        try:
            with parallel.using(threads):
                return decoder(self.msg, gi, self.header.groups[gi])
        except MemoryError:
            raise LimitError("out of memory while decoding: the group decodes to more than this machine "
                             "can hold") from None

    def records(self, names: Iterable[str] | None = None, *, bfloat16: str = "float32",
                threads: int = 1) -> Iterator[tuple[fmt.Record, Any]]:
        """(record, values) for every record (or those named), in record order; each group is decoded
        once, in the order of its first wanted record, ahead of the caller on worker threads, one group
        per thread (``threads``; 0: every core; at most DECODE_AHEAD_MAX): decoding overlaps the caller's writing, and the groups'
        sequential decoders (rANS) run side by side; memory: one group per thread and the one being
        written.  A group's other records are kept until their turn (a pool of small tensors; a group
        of one tensor, the common case, is dropped as soon as it is yielded).
        ``bfloat16``: how bfloat16 records come back: "float32" (exact widening of the bfloat16
        values), "bits" (their uint16 bit patterns, for a writer of bfloat16 files without torch) or
        "torch" (a torch.bfloat16 tensor); every other record is numpy of its dtype, or torch with "torch"."""
        order = self.write_order(names)
        wanted = {self.index[r.name] for r in order}
        groups = list(dict.fromkeys(self.group_of[self.index[r.name]] for r in order))  # in first-use order
        waiting: dict[int, Any] = {}
        depth = min(parallel.resolve(threads), DECODE_AHEAD_MAX)
        inner = threads if depth == 1 else 1  # several workers: one thread each (the values never differ)
        with concurrent.futures.ThreadPoolExecutor(depth) as pool:
            ahead = collections.deque(self._prefetch(pool, groups, g, wanted, bfloat16, inner)
                                      for g in range(depth))
            g = depth
            for rec in order:
                ri = self.index[rec.name]
                if ri not in waiting:
                    waiting.update(ahead.popleft().result())  # the next group, decoded while others were written
                    ahead.append(self._prefetch(pool, groups, g, wanted, bfloat16, inner))
                    g += 1
                yield rec, waiting.pop(ri)

    def _prefetch(self, pool: Any, groups: list[int], g: int, wanted: set[int], bfloat16: str,
                  threads: int) -> Any:
        """Group ``groups[g]`` decoded and split on ``pool`` (one worker: at most one group ahead of the
        caller, so memory is two groups at most); a finished future when there is none."""
        if g >= len(groups):
            done: concurrent.futures.Future = concurrent.futures.Future()
            done.set_result({})
            return done
        gi = groups[g]
        def work() -> dict[int, Any]:
            with parallel.using(threads):  # the bfloat16 rounding of the split too
                return dict(self._split(gi, self._group_values(gi, threads), wanted, bfloat16))

        return pool.submit(work)

    def write_order(self, names: Iterable[str] | None = None) -> list[fmt.Record]:
        """The records :meth:`records` yields, in that order (record order; all, or those named)."""
        if names is None:
            return list(self.header.records)
        wanted = {self.index[n] for n in names}
        return [r for ri, r in enumerate(self.header.records) if ri in wanted]

    def _split(self, gi: int, flat: np.ndarray | list[np.ndarray], wanted: set[int], bfloat16: str
               ) -> Iterator[tuple[int, Any]]:
        """(record index, values) of group ``gi``'s wanted records, cut from its vector ``flat`` (or
        given as its records' arrays, :meth:`_group_values`)."""
        group = self.header.groups[gi]
        lossless = codec_class(group.codec).lossless
        offset = 0
        for j, ri in enumerate(group.records):
            rec = self.header.records[ri]
            part = flat[j] if isinstance(flat, list) else flat[offset: offset + rec.size]
            offset += rec.size
            if ri in wanted:
                yield ri, record_values(part, rec, lossless, bfloat16)


def record_values(part: np.ndarray, rec: fmt.Record, lossless: bool, bfloat16: str) -> Any:
    """A record's slice of its group's vector in the record's dtype and shape (see
    :meth:`MessageFile.records` for ``bfloat16``); a lossless group carries bfloat16 as its bits."""
    torch = bfloat16 == "torch"
    if rec.dtype == "bfloat16":  # a lossless group's bits, a lossy group's values or their bits already
        bits = part.view(np.uint16) if lossless or part.dtype == np.uint16 else _to_bf16(part)
        if bfloat16 == "bits":
            return bits.reshape(rec.shape)
        wide = (bits.astype(np.uint32) << 16).view(np.float32).reshape(rec.shape)
        if not torch:
            return wide
        t = require_torch(AS_TORCH)
        return t.from_numpy(bits.view(np.int16).reshape(rec.shape).copy()).view(t.bfloat16)
    return from_record(part, rec.dtype, rec.shape, torch)


def _to_bf16(values: np.ndarray) -> np.ndarray:
    """float32 values as a bfloat16 record stores them: saturated, rounded, as uint16 bit patterns."""
    return bf16_bits(saturate(values, "bfloat16"))


class CheckpointFile:
    """``mucsc.open(path)``: a message file read one tensor at a time, like safetensors' ``safe_open``.

    ``keys()`` lists the tensor names, ``metadata()`` the message's meta, ``get_tensor(name)`` reads
    and decodes only the group holding ``name`` (a tensor inside a shared group decodes its whole
    group; the last group decoded is kept, so reading every tensor of a shared group decodes it once).
    ``framework``: "np" (numpy; bfloat16 widened to float32) or "pt" (torch, bfloat16 kept).
    """

    def __init__(self, path: str | os.PathLike, framework: str = "np", *,
                 max_elements: int | None = api.DEFAULT_MAX_ELEMENTS,
                 max_expansion: float | None = api.DEFAULT_MAX_EXPANSION, check_crc: bool = False,
                 threads: int = 1) -> None:
        if framework not in ("np", "numpy", "pt", "torch"):
            raise ParameterError(f"framework must be 'np' or 'pt', got {framework!r}")
        self._torch = framework in ("pt", "torch")
        if self._torch:
            require_torch("framework='pt'")
        self._threads = threads
        self._f = builtins.open(path, "rb")  # OSError as open() raises it
        try:
            self._file = MessageFile(self._f, max_elements=max_elements, max_expansion=max_expansion,
                                     check_crc=check_crc)
        except BaseException:
            self._f.close()
            raise
        self._cached: tuple[int, np.ndarray] | None = None

    def __enter__(self) -> CheckpointFile:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        self._cached = None
        self._f.close()

    def keys(self) -> list[str]:
        """The tensor names, in the message's record order."""
        return [r.name for r in self._file.header.records]

    def metadata(self) -> dict[str, str]:
        return dict(self._file.header.meta)

    def info(self) -> api.MessageInfo:
        return self._file.info()

    def get_tensor(self, name: str) -> Any:
        """Tensor ``name``, decoded from its group alone (KeyError naming it when absent)."""
        ri = self._file.index.get(name)
        if ri is None:
            raise KeyError(f"no tensor named {name!r} in this message")
        gi = self._file.group_of[ri]
        if self._cached is not None and self._cached[0] == gi:
            flat = self._cached[1]
        else:
            self._cached = None
            flat = self._file.decode_group(gi, threads=self._threads, bfloat16_bits=True)
            if len(self._file.header.groups[gi].records) > 1:
                self._cached = (gi, flat)
        group = self._file.header.groups[gi]
        offset = sum(self._file.header.records[i].size for i in group.records[: group.records.index(ri)])
        rec = self._file.header.records[ri]
        return record_values(flat[offset: offset + rec.size], rec, codec_class(group.codec).lossless,
                             "torch" if self._torch else "float32")


def open(path: str | os.PathLike, framework: str = "np", **kwargs: Any) -> CheckpointFile:  # noqa: A001
    """Open a .mucsc file for reading tensor by tensor (:class:`CheckpointFile`; a context manager)."""
    return CheckpointFile(path, framework, **kwargs)
