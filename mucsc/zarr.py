"""The mucsc codec as a zarr v3 array-to-bytes codec (a *serializer*), named ``"mucsc"``: LOSSY.

Every chunk comes back with quantisation error (unbiased by default; ``rounding``, ``bits=``,
``max_error=`` as for :func:`mucsc.encode`): never use it for data that must round-trip exactly.

    >>> import zarr, mucsc.zarr
    >>> a = zarr.create_array("x.zarr", shape=(1000, 1000), chunks=(250, 1000), dtype="float32",
    ...                       serializer=mucsc.zarr.MucscCodec(z=16), compressors=None, fill_value=0.0)

zarr v3 chunks reach a serializer as typed arrays, so unlike the numcodecs codec no dtype is
configured; the chunk's dtype and shape come from the array metadata.  Each chunk is encoded by
:class:`mucsc.numcodecs.Mucsc` (same determinism and limits); its message already zstd-compresses
what pays, so no extra compressor is needed.  Registered with zarr through the ``zarr.codecs``
entry point (installed package) and on import of this module.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any, Self

import numpy as np
from zarr.abc.codec import ArrayBytesCodec
from zarr.core.array_spec import ArraySpec
from zarr.core.buffer import Buffer, NDBuffer
from zarr.registry import register_codec

import mucsc
from mucsc.numcodecs import Mucsc

NAME = "mucsc"


@dataclasses.dataclass(frozen=True)
class MucscCodec(ArrayBytesCodec):
    """Lossy zarr v3 serializer: one mucsc message per chunk, encoded and decoded on worker threads.  ``codec``/``seed``/``compress``/``params``
    as for :class:`mucsc.numcodecs.Mucsc` (seed None: derived from each chunk's bytes)."""

    is_fixed_size = False
    config: dict[str, Any]

    def __init__(self, *, codec: str = "mucsc", seed: int | None = None, compress: str | int = "auto",
                 **params: Any) -> None:
        # validated (and defaults resolved) by the numcodecs codec; the dtype there is a placeholder
        cfg = Mucsc(codec=codec, seed=seed, compress=compress, **params).get_config()
        for k in ("id", "dtype"):
            cfg.pop(k)
        object.__setattr__(self, "config", cfg)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Self:
        if data.get("name") != NAME:
            raise mucsc.FormatError(f"expected codec name {NAME!r}, got {data.get('name')!r}")
        return cls(**dict(data.get("configuration") or {}))

    def to_dict(self) -> dict[str, Any]:
        return {"name": NAME, "configuration": dict(self.config)}

    def validate(self, *, shape: Any, dtype: Any, chunk_grid: Any) -> None:
        native = dtype.to_native_dtype()
        if native.kind != "f":
            raise mucsc.ParameterError(f"the mucsc serializer stores float arrays, not {native}")

    def _numcodec(self, chunk_spec: ArraySpec) -> Mucsc:
        return Mucsc(dtype=chunk_spec.dtype.to_native_dtype().str, **self.config)

    async def _encode_single(self, chunk_array: NDBuffer, chunk_spec: ArraySpec) -> Buffer | None:
        arr = np.ascontiguousarray(chunk_array.as_numpy_array())
        # CPU work off the event loop: zarr runs chunks concurrently, each on a worker thread
        blob = await asyncio.to_thread(self._numcodec(chunk_spec).encode, arr)
        return chunk_spec.prototype.buffer.from_bytes(blob)

    async def _decode_single(self, chunk_bytes: Buffer, chunk_spec: ArraySpec) -> NDBuffer:
        flat = await asyncio.to_thread(self._numcodec(chunk_spec).decode, chunk_bytes.as_numpy_array())
        size = int(np.prod(chunk_spec.shape))
        if flat.size != size:
            raise mucsc.FormatError(f"chunk decodes to {flat.size} values, the chunk shape holds {size}")
        return chunk_spec.prototype.nd_buffer.from_numpy_array(flat.reshape(chunk_spec.shape))

    def compute_encoded_size(self, input_byte_length: int, chunk_spec: ArraySpec) -> int:
        raise NotImplementedError  # variable-size output, like any compressor


register_codec(NAME, MucscCodec)
