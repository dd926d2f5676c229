"""The step "which elements are kept" of the top-k family (topk, STC, DGC, B-MUCSC): the positions of
the k largest magnitudes (``sparse.top_k``'s set; elements tied at the k-th magnitude are the host's
choice), the kept values and the rest's float64 sum, and the decoders' scatter of the sent values.

``Host`` and ``Torch`` hold the same names (see :mod:`mucsc.codec.backends.dispatch`).  The torch
form selects on the tensor's device (a radix select / one top-k, the positions and values brought
over in one copy) and hands a tie back to the host form: the same positions, so the same bytes."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from mucsc.codec.backends import ordered_sum

from mucsc.codec.backends.tensors import is_torch_tensor, torch_module

from mucsc.codec.backends import torch_selection

from mucsc.codec.backends import torch_transfer
from mucsc.codec.wire import sparse


@dataclasses.dataclass(frozen=True)
class Kept:
    """B-MUCSC's selection: ``x`` (the vector as encoded further: a host array when the host decided),
    ``k`` kept, their sorted host ``pos``itions, the ``kept`` values (x's kind), the float64 sum of
    the rest, and ``kept_host``: the kept values on the host when they came over already (or None)."""

    x: Any
    k: int
    pos: np.ndarray
    kept: Any
    rest_sum: float
    kept_host: np.ndarray | None = None


class Host:
    @staticmethod
    def top_k_positions(x: np.ndarray, k: int) -> np.ndarray:
        """``sparse.top_k(x, k)``: the sorted positions (never None on the host)."""
        return sparse.top_k(x, k)

    @staticmethod
    def take(x: np.ndarray, pos: np.ndarray) -> np.ndarray:
        return x[pos]

    @staticmethod
    def keep_top_k(x: np.ndarray, keep: float) -> Kept:
        """B-MUCSC's selection at ``keep`` (fewer than asked when x has fewer non-zeros: the rest's
        mean is then 0)."""
        pos = sparse.top_k(x, sparse.keep_count(keep, x.size))  # np.argpartition on |x|: O(n), not a sort
        kept = x[pos]
        rest_sum = float(x.sum(dtype=np.float64)) - float(kept.sum(dtype=np.float64))
        return Kept(x, pos.size, pos, kept, rest_sum)

    @staticmethod
    def rest_sq_bias(x: np.ndarray, pos: np.ndarray, mean: float) -> float:
        """||rest - mean||^2 (float64): the squared error of replacing the elements not at ``pos`` by
        their mean."""
        rest = np.ones(x.size, bool)
        rest[pos] = False
        return float(np.sum((x[rest].astype(np.float64) - float(mean)) ** 2))

    @staticmethod
    def scatter(n: int, pos: np.ndarray, vals: Any, dtype: Any, device: Any = None, fill: float = 0.0) -> np.ndarray:
        """A length-``n`` vector of ``dtype``: ``fill`` everywhere, ``vals`` at ``pos``."""
        out = np.zeros(n, dtype) if fill == 0 and not np.signbit(fill) else np.full(n, fill, dtype)
        out[pos] = vals
        return out


class Torch:
    @staticmethod
    def top_k_positions(x: Any, k: int) -> np.ndarray | None:
        """:meth:`Host.top_k_positions` on x's device; None when a tie at the k-th magnitude makes it
        a choice (the host decides)."""
        return torch_selection.top_k_positions(x, k)

    @staticmethod
    def take(x: Any, pos: np.ndarray):
        return x[torch_module().from_numpy(pos).to(x.device)]

    @staticmethod
    def keep_top_k(x: Any, keep: float) -> Kept:
        """:meth:`Host.keep_top_k` on x's device: the top-k selection, and the rest's float64 sum in
        numpy's order (``ordered_sum.sum64_like_numpy``); a tie at the k-th magnitude goes to the host."""
        n = x.numel()
        k = sparse.keep_count(keep, n)
        sel = torch_selection.select_top_k(x, k)  # positions and kept values in one copy
        if sel is not None:
            pos, kept, kept_host = sel
            if ordered_sum.host_sums(x):  # a CPU tensor: numpy's own sum over a view
                rest_sum = float(x.numpy().sum(dtype=np.float64)) - float(kept_host.sum(dtype=np.float64))
            else:
                rest_sum = ordered_sum.sum64_like_numpy(x) - ordered_sum.sum64_like_numpy(kept)
            return Kept(x, k, pos, kept, rest_sum, kept_host)
        pos = torch_selection.top_k_positions(x, k)  # k >= n, a tie at the k-th magnitude, zeros kept
        if pos is None:  # ties at the k-th magnitude: the host's choice
            return Host.keep_top_k(x.cpu().numpy(), keep)
        if ordered_sum.host_sums(x):  # on the CPU this is a view: the reference sum, no copy
            host = x.cpu().numpy()
            kept = host[pos]
            rest_sum = float(host.sum(dtype=np.float64)) - float(kept.sum(dtype=np.float64))
            return Kept(host, pos.size, pos, torch_transfer.as_tensor(kept), rest_sum)
        kept = x[torch_transfer.as_tensor(pos).to(x.device)]
        rest_sum = ordered_sum.sum64_like_numpy(x) - ordered_sum.sum64_like_numpy(kept)
        return Kept(x, pos.size, pos, kept, rest_sum)

    @staticmethod
    def rest_sq_bias(x: Any, pos: np.ndarray, mean: float) -> float:
        return torch_selection.rest_sq_bias(torch_transfer.as_tensor(x), pos, mean)

    @staticmethod
    def scatter(n: int, pos: np.ndarray, vals: Any, dtype: Any, device: Any = None, fill: float = 0.0):
        torch = torch_module()
        out = torch.full((n,), float(fill), dtype=getattr(torch, np.dtype(dtype).name), device=device)
        if pos.size:
            src = vals if is_torch_tensor(vals) else torch.from_numpy(np.array(vals))  # a writable copy
            out[torch.from_numpy(np.ascontiguousarray(pos, np.int64)).to(device)] = src.to(device=device,
                                                                                           dtype=out.dtype)
        return out
