"""The step "IDSL's lane-parallel rANS" (spec/FORMAT.md 4.6) of cluster IDs: the coded section, with
what the fixed-Z "auto" coding compares it against (the IDS_ bytes zstd could store instead), and
the decoder's IDs.

``Host`` codes with :mod:`mucsc.codec.wire.lanes` (the compiled coder where built); ``Torch`` codes the
IDs where they live (:mod:`mucsc.codec.backends.torch_lanes`: only the counts and a sample cross before
the section is written).  Both give the same bytes."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from mucsc.codec import parallel
from mucsc.codec.backends import device_rounding, torch_lanes, torch_packing, torch_transfer
from mucsc.codec.wire import bitpack, lanes
from mucsc.errors import FormatError


@dataclasses.dataclass(frozen=True)
class LaneCoded:
    """An IDSL section: ``payload`` (host bytes, or bytes left on a device), its ``nbytes``, and for
    the "auto" comparison the ``size`` of the IDS_ bytes it competes with, ``part(a, b)`` giving
    their bytes [a, b) on the host, and ``seen`` (their structure screen when taken already, or None)."""

    payload: Any
    nbytes: int
    size: int = 0
    part: Callable[[int, int], np.ndarray] | None = None
    seen: Any = None


class Host:
    @staticmethod
    def lane_code(ids: np.ndarray, k: int, w: int, bits: int, auto: bool, spans: Sequence[tuple[int, int]],
                  screen: Callable[[np.ndarray], Any]) -> LaneCoded:
        """The IDSL section of ``ids`` < k with ``w``-bit symbols; with ``auto`` also the IDS_ bytes at
        ``bits`` wide it competes with, screened by ``screen`` while in cache.  ``spans``: the sample
        the comparison reads first (the device form brings it over with the counts)."""
        sym, counts = lanes.symbols_counted(ids, k, w)
        packed = seen = None
        if auto:
            packed = sym if bits == w else parallel.pack_array(ids, bits)
            seen = screen(packed)  # screened before coding, while the bytes are in cache
        data = lanes.payload(sym, w, lanes.alphabet(k, w), counts)
        if packed is None:
            return LaneCoded(data, len(data))
        return LaneCoded(data, len(data), packed.size, lambda a, b: packed[a:b], seen)

    @staticmethod
    def lane_decode_ids(payload: memoryview, n: int, k: int, device: Any = None) -> np.ndarray:
        """The n IDs (int64) of an IDSL payload, each checked < k."""
        sym, w = lanes.decode_symbols(payload, n, k)
        ids = sym.astype(np.int64) if w == lanes.WIDE else bitpack.unpack(sym, w, n).astype(np.int64)
        if ids.size and int(ids.max()) >= k:
            raise FormatError(f"cluster id {int(ids.max())} out of range for {k} centroids")
        return ids


class Torch:
    @staticmethod
    def lane_code(ids: Any, k: int, w: int, bits: int, auto: bool, spans: Sequence[tuple[int, int]],
                  screen: Callable[[np.ndarray], Any]) -> LaneCoded:
        coded = torch_lanes.encode_ids(ids, k, w, spans if auto and bits == w else ())
        if not auto:
            return LaneCoded(coded.payload, coded.nbytes)
        if bits == w:
            return LaneCoded(coded.payload, coded.nbytes, lanes.symbol_count(len(ids), w), coded.part)
        packed = (ids.packed(bits).tensor if isinstance(ids, device_rounding.Rounding)
                  else torch_packing.pack_tensor(ids, bits))
        return LaneCoded(coded.payload, coded.nbytes, packed.numel(), lambda a, b: torch_transfer.to_host(packed[a:b]))

    @staticmethod
    def lane_decode_ids(payload: memoryview, n: int, k: int, device: Any = None):
        return torch_lanes.decode_ids(payload, n, k, device)
