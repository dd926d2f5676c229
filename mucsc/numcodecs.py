"""A numcodecs codec (``codec_id="mucsc"``): lossy, unbiased compression of float chunks for zarr and
anything else that speaks numcodecs.

    >>> import numpy as np, numcodecs
    >>> codec = numcodecs.get_codec({"id": "mucsc", "dtype": "<f4", "z": 16})   # via the entry point
    >>> x = np.random.default_rng(0).normal(size=4096).astype("float32")
    >>> y = codec.decode(codec.encode(x))       # same shape-less float32 values, E[y] == x

Each chunk becomes one self-describing mucsc message (its own codebook), so a chunk decodes without
the config.  numcodecs hands codecs untyped buffers, hence ``dtype`` in the config.  The default seed
is derived from the chunk's bytes, so the same chunk always encodes to the same bytes.

Limits: floats only (lossy by design: never use it for data that must round-trip exactly); NaN and Inf
are rejected (so a NaN fill value fails on any partially written chunk: use a finite fill value);
zarr re-encodes a whole chunk on every partial write, and each re-encoding adds fresh quantisation
noise; one codebook per chunk (a chunk of a few hundred values pays the codebook's fixed cost).
Only the public ``mucsc`` API is used.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
from numcodecs.abc import Codec as _NumcodecsCodec
from numcodecs.compat import ensure_contiguous_ndarray, ndarray_copy

import mucsc

# Keys of the config that are ours; every other key is a parameter of the mucsc codec named ``codec``.
_OWN_KEYS = ("id", "dtype", "codec", "seed", "compress")
_FLOAT_DTYPES = ("float16", "float32", "float64")


def chunk_seed(data: np.ndarray) -> int:
    """A 63-bit encoder seed derived from a chunk's bytes (blake2b), so encoding is deterministic."""
    digest = hashlib.blake2b(memoryview(np.ascontiguousarray(data)).cast("B"), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


class Mucsc(_NumcodecsCodec):
    """Lossy numcodecs codec: float chunk -> one mucsc message (decodes to an approximation).

    ``dtype``: the element type of the buffers ``encode`` receives (float16/32/64, either byte order).
    ``codec``: a mucsc codec name (default "mucsc"; "bmucsc", "qsgd", ... work too) and ``params`` its
    parameters (e.g. ``z=16``).  ``seed``: fixed encoder seed, or None to derive it from each chunk.
    ``compress``: the container's zstd setting ("auto", "off" or a level).
    """

    codec_id = "mucsc"

    def __init__(self, dtype: str = "<f4", codec: str = "mucsc", seed: int | None = None,
                 compress: str | int = "auto", **params: Any) -> None:
        try:
            dt = np.dtype(dtype)
        except TypeError:
            raise mucsc.ParameterError(f"dtype {dtype!r} is not a numpy dtype") from None
        if dt.kind != "f" or dt.newbyteorder("=").name not in _FLOAT_DTYPES:
            raise mucsc.ParameterError(f"the mucsc numcodecs codec compresses float16/32/64 data, not {dt}"
                                       " (it is lossy: store integers with a lossless codec)")
        clash = sorted(set(params) & set(_OWN_KEYS))
        if clash:
            raise mucsc.ParameterError(f"{', '.join(clash)} cannot be a codec parameter here")
        # The name, parameters, seed (None: per chunk) and zstd level, checked as every API checks them
        # (mucsc.Settings: a SettingsError); the resolved config records every default, so a stored
        # array keeps encoding the same way if a default changes in a later version.
        settings = mucsc.Settings(codec, params, seed=0 if seed is None else seed, compress=compress)
        resolved = settings.codec_object().get_config()
        self.dtype = dt.str
        self.codec = resolved.pop("codec")
        self.seed = seed
        self.compress = compress
        self.params = resolved

    def get_config(self) -> dict[str, Any]:
        return {"id": self.codec_id, "dtype": self.dtype, "codec": self.codec, "seed": self.seed,
                "compress": self.compress, **self.params}

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Mucsc:
        config = dict(config)
        config.pop("id", None)
        return cls(**config)

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_config().items() if k != "id")
        return f"Mucsc({args})"

    def encode(self, buf: Any) -> bytes:
        """Encode a buffer of ``dtype`` values (any shape; stored flat) into one mucsc message."""
        raw = ensure_contiguous_ndarray(buf).view("u1").reshape(-1)
        dt = np.dtype(self.dtype)
        if raw.size % dt.itemsize:
            raise mucsc.InputError(f"buffer of {raw.size} bytes is not a whole number of {dt} values")
        x = raw.view(dt)
        if dt.byteorder == ">":
            x = x.astype(dt.newbyteorder("<"))
        seed = chunk_seed(raw) if self.seed is None else self.seed
        return mucsc.encode(x, self.codec, seed=seed, compress=self.compress, **self.params)

    def decode(self, buf: Any, out: Any = None) -> Any:
        """Decode a message into a flat array of ``dtype`` (or into ``out``, which must hold exactly
        as many bytes)."""
        data = ensure_contiguous_ndarray(buf).view("u1").reshape(-1)
        if out is None:  # untrusted storage: the decoder's default limits for untrusted input
            x = mucsc.decode(data.tobytes())
        else:  # the chunk's size is known: bound by it exactly (a constant chunk decodes at any ratio)
            itemsize = np.dtype(self.dtype).itemsize
            nbytes = ensure_contiguous_ndarray(out).nbytes
            try:
                x = mucsc.decode(data.tobytes(), max_elements=nbytes // itemsize, max_expansion=None)
            except mucsc.LimitError:
                have = mucsc.inspect(data.tobytes()).elements * itemsize
                if have != nbytes:
                    raise mucsc.InputError(f"out holds {nbytes} bytes, the chunk decodes to {have}") from None
                raise
        if not isinstance(x, np.ndarray):
            raise mucsc.FormatError("message holds several tensors; a mucsc chunk holds one array")
        x = np.ascontiguousarray(x.reshape(-1), dtype=np.dtype(self.dtype))
        if out is not None:
            nbytes = ensure_contiguous_ndarray(out).nbytes
            if nbytes != x.nbytes:
                raise mucsc.InputError(f"out holds {nbytes} bytes, the chunk decodes to {x.nbytes}")
            return ndarray_copy(x, out)
        return x


def register() -> None:
    """Register :class:`Mucsc` with numcodecs' registry (the ``numcodecs.codecs`` entry point does
    this on demand for an installed package; this covers running from a source tree)."""
    from numcodecs.registry import register_codec

    register_codec(Mucsc)


register()
