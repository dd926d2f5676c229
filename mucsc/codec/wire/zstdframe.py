"""A section payload its codec already compressed with zstd (to choose a layout), handed to the
container's writer so it stores that frame instead of compressing the same bytes again.

Its own module, below the container, so a codec can build one without importing the container
(codecs never do: the container is the API's)."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class ZstdFrame:
    """``compressible=`` for a section whose codec already compressed its payload (to choose a
    layout): the frame at ``level`` (``parallel.zstd_compressor``'s, whatever its thread count).
    Truthy like ``True``; a writer at the same level stores this frame instead of compressing the
    same bytes again (the same message bytes, one zstd pass fewer), one at another level compresses."""

    level: int
    frame: bytes
