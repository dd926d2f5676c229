"""What ``none`` and ``fp16`` share: every element stored in one float wire dtype (section VALS)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from typing import Any, ClassVar

import numpy as np

from mucsc.codec.backends.dispatch import backend_for, backend_on
from mucsc.codec.codecs.base import F32_MAX, PART, Codec, EncodedGroup, Section, array_from, section
from mucsc.errors import FormatError


class CastCodec(Codec):
    """Subclasses set ``name`` and ``wire`` (a little-endian float dtype) and may set ``limit`` (the
    magnitude values are clipped to before the cast)."""

    wire: ClassVar[str]
    limit: ClassVar[float | None] = None
    accepts_device = True  # a cast is elementwise: done on the tensor's device, only the wire bytes cross
    draws = False

    @dataclasses.dataclass(frozen=True)
    class Params:
        pass

    def check_input(self, x: np.ndarray, label: str) -> None:
        """:meth:`Codec.check_input` by finiteness alone where that is all it takes (no limit, or a
        float32 vector, within any limit of at least FLT_MAX once finite): one pass instead of min
        and max, which a cast needs for nothing else (~6 us of a ``none`` encode of 1e4 floats).
        Input that fails it is checked again by the exact rule, for its error message."""
        limit = self.input_limit
        if (limit is None or (x.dtype == np.float32 and limit >= F32_MAX)) and bool(np.isfinite(x).all()):
            return
        super().check_input(x, label)

    def section_sizes(self, n: int, *, positions_bytes: int | None = None, centroids: int | None = None,
                      estimate: bool = False) -> dict[str, int]:
        return {"VALS": np.dtype(self.wire).itemsize * n}

    def encode_array(self, x: np.ndarray, rng: np.random.Generator) -> EncodedGroup:
        be = backend_for(x)
        x = be.vector(x)
        v = be.cast(x, self.wire, self.limit)  # no copy when x is already in the wire dtype
        return EncodedGroup({}, (Section("VALS", be.payload(v)),),  # the values themselves: copied once, by the writer
                            {"J": lambda: be.sq_error(v, x)})

    @classmethod
    def decode_on_device(cls, n: int, params: Mapping[str, Any], sections: Mapping[str, memoryview],
                         dtype: np.dtype, device) -> Any:
        """:meth:`decode_array` on ``device``: the wire values are copied over and widened there."""
        be = backend_on(device)
        v = be.wire_values(section(sections, "VALS", np.dtype(cls.wire).itemsize * n), cls.wire, n, device)
        if not be.all_finite(v):
            raise FormatError(f"{cls.name}: values must be finite")
        return be.astype(v, dtype)

    @classmethod
    def decode_array(cls, n: int, params: Mapping[str, Any], sections: Mapping[str, memoryview],
                     dtype: np.dtype) -> np.ndarray:
        return cls._wire_values(n, sections).astype(dtype)

    @classmethod
    def decode_parts(cls, n: int, params: Mapping[str, Any], sections: Mapping[str, memoryview],
                     dtype: np.dtype) -> Iterator[np.ndarray]:
        v = cls._wire_values(n, sections)  # a view of the section: only the pieces are new
        for a in range(0, n, PART):
            yield v[a: a + PART].astype(dtype)

    @classmethod
    def _wire_values(cls, n: int, sections: Mapping[str, memoryview]) -> np.ndarray:
        v = array_from(section(sections, "VALS", np.dtype(cls.wire).itemsize * n), cls.wire)
        if not np.all(np.isfinite(v)):
            raise FormatError(f"{cls.name}: values must be finite")
        return v
